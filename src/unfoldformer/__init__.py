"""unfoldformer: Transformer layers as certified descent steps on an explicit energy.

Implements Yang, Huang, Wipf (NeurIPS 2022), "Transformers from an Optimization Perspective"
(`docs/theory.md` maps each equation to its function and each claim to its test)::

    import unfoldformer as uf
    model = uf.UnfoldedTransformer(uf.ModelConfig.preset("certified", d_model=64))
    out = model(x, padding_mask, return_energies=True)     # out.energies: E(Y⁽⁰⁾), …, E(Y⁽ᵀ⁾)

The core is at the root: the ρ family (`rho`), energies (`energy`), descent steps (`steps`),
layers (`layers`), the model and its config (`model`, `config`), a certified layer for your own
model (`encoder`: `CertifiedEncoderLayer`, `CertifiedEncoder`; `decoder`: the causal `CertifiedDecoderLayer`,
`CertifiedDecoder`, THEORY §3.11), saving and sharing models
(`hub`: `save_pretrained` / `from_pretrained`), descent tolerances
(`descent`), the baseline (`baselines`), the classifier (`classifier`), the paper's released
formulas (`released`) and loading a trained classifier (`inference`; trained ones ship in `zoo`). Applications are
sub-packages: `data`, `train`, `paper` (the reproduction), `probe` (pretrained models), and
the command line `cli`.
"""

import os as _os
import sys as _sys

# OpenMP worker threads that wait for work sleep instead of spinning, unless the user chose otherwise: spinning
# workers hold a core for milliseconds after every parallel region, which on a machine whose cores are shared
# (another process, or the blocked kernel's worker threads, `blockpool`) made 2 threads slower than 1
# (docs/results/speed.md, "Threads"). OpenMP reads the variable when torch is first imported, so this takes
# effect only if unfoldformer is imported first (the command line always is). Whatever the import order, the
# library's forwards and energies size torch's thread count to the cores other processes leave free
# (`threads.free_core_threads`; `UNFOLDFORMER_THREADS=fixed` turns that off).
if "torch" not in _sys.modules:
    _os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

from .baselines import StandardTransformer  # noqa: E402
from .causal import DecoderOutput  # noqa: E402
from .classifier import SequenceClassifier, build_encoder  # noqa: E402
from .config import PRESETS, ModelConfig  # noqa: E402
from .decoder import CertifiedDecoder, CertifiedDecoderLayer  # noqa: E402
from .descent import descent_tolerance  # noqa: E402
from .encoder import CertifiedEncoder, CertifiedEncoderLayer  # noqa: E402
from .energy import anchor_energy, attention_energy, symmetric_ffn_energy, tied_ffn_energy  # noqa: E402
from .errors import ConfigError, UnfoldformerError  # noqa: E402
from .hub import PretrainedError, from_pretrained  # noqa: E402
from .inference import Predictor, load  # noqa: E402
from .model import EncoderOutput, UnfoldedTransformer  # noqa: E402
from .peers import Crate, EnergyTransformer  # noqa: E402
from .rho import Rho, check_rho, custom_rho, get_rho, register_rho  # noqa: E402
from .steps import anchored_attention_step, attention_step, symmetric_ffn_step, tied_ffn_step  # noqa: E402
from .version import __version__ as __version__  # noqa: E402 (re-exported)

__all__ = [
    "ConfigError", "Crate", "EncoderOutput", "EnergyTransformer", "ModelConfig", "PRESETS", "Predictor", "Rho",
    "SequenceClassifier",
    "CertifiedDecoder", "CertifiedDecoderLayer", "CertifiedEncoder", "CertifiedEncoderLayer", "DecoderOutput",
    "PretrainedError", "from_pretrained",
    "StandardTransformer", "UnfoldedTransformer", "UnfoldformerError", "anchor_energy", "anchored_attention_step",
    "attention_energy", "attention_step", "build_encoder", "check_rho", "custom_rho", "descent_tolerance",
    "get_rho", "load", "register_rho", "symmetric_ffn_energy", "symmetric_ffn_step", "tied_ffn_energy", "tied_ffn_step",
]
