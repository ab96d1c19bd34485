"""Probe pretrained Transformers: how close is each layer to a descent step? (THEORY §6).

- `measures`: per-head measures (skew ratio, negative eigen-mass, value-map distances) and
  per-layer energies of a Hugging Face encoder; `probe(model, texts)` returns a `ProbeResult`.
- `hf`: offline loading of local folders and the installed MiniLM.
- `report`: `run_probe(ProbeSettings(...))` writes figures, `probe.md` and `probe.json`.
"""
from .hf import UnsupportedModelError, load_model
from .measures import ProbeResult, probe
from .report import ProbeSettings, run_probe

__all__ = ["ProbeResult", "ProbeSettings", "UnsupportedModelError", "load_model", "probe", "run_probe"]
