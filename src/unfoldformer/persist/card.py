"""The model card (`README.md`) of a model folder, in the Hugging Face Hub's form.

YAML front matter (license, `library_name: unfoldformer`, tags, and the data set and base model
where known), then a short body: what the model is, what its certificate guarantees (read from its
own config: the layer, tied or untied, certified step ranges or not) and how to load it. The card
describes; the checks on load read config.json and the weights, never the card.
"""
from __future__ import annotations

from typing import Any

from ..config import ModelConfig
from ..errors import ConfigError
from ..recipe import TrainConfig

__all__ = ["certificate", "model_card"]

LICENSE = "mit"                                     # the library's licence (pyproject.toml)
#: The Hub ids of the tables `data.embeddings` names, where they come from a published model.
BASE_MODELS = {"minilm": "sentence-transformers/all-MiniLM-L6-v2"}
#: The Hub ids of the named data sets.
DATASETS = {"sst2": "stanfordnlp/sst2", "imdb": "stanfordnlp/imdb"}


def _model_config(class_name: str, init: Any) -> ModelConfig | None:
    """The resolved encoder config a folder's description holds (None if it holds none)."""
    if class_name == "Predictor":
        return TrainConfig.from_dict(init["train_config"]).model_config()
    if class_name == "SequenceClassifier":
        return _model_config(init["encoder"]["class"], init["encoder"]["init"])
    try:
        return ModelConfig.from_dict(init["config"]).resolved()
    except (KeyError, TypeError, ConfigError):
        return None


def certificate(cfg: ModelConfig | None) -> str:
    """What the model's forward pass is certified to do, in one or two sentences."""
    if cfg is None or cfg.attention not in ("anchored", "metric"):
        return ("No certified descent: this encoder has no energy its layers are proved to lower "
                "(the standard Transformer, a peer model or the paper's released formulas); any energy it "
                "reports is measured, not guaranteed.")
    if not cfg.certified:
        return ("An unfolded Transformer whose step sizes are not restricted to their certified ranges: its "
                "energy curve (`return_energies=True`) is measured, not guaranteed to fall.")
    if cfg.layer == "joint" and cfg.tied:
        return ("Certified descent of one energy E for the whole forward pass: every layer is one step that "
                "lowers E, for any weights, so the curve E(Y⁽⁰⁾), …, E(Y⁽ᵀ⁾) never rises (beyond round-off).")
    if cfg.layer == "joint":
        return ("Certified descent per layer: each layer ℓ lowers its own energy, E_ℓ(Y⁽ℓ⁾) ≤ E_ℓ(Y⁽ℓ⁻¹⁾), for "
                "any weights; the layers have different energies, so there is no single curve to compare.")
    scope = "its energy E" if cfg.tied else "its own layer's energy E_ℓ"
    return (f"Each layer alternates an attention step and an FFN step, each certified to lower its own term of "
            f"{scope}, for any weights; a whole layer can still raise it, unless `safeguard=True` "
            "(backtracking, at extra inference cost) is passed to the forward pass.")


def _describe(cfg: ModelConfig | None, class_name: str) -> str:
    if cfg is None:
        return f"A `{class_name}` of unfoldformer."
    layers = f"one layer applied {cfg.depth} times" if cfg.tied else f"{cfg.depth} layers"
    return (f"A `{class_name}` of unfoldformer: preset `{cfg.preset_name}`, {cfg.attention} attention, "
            f"d_model {cfg.d_model}, {cfg.n_heads} heads, {layers}.")


def model_card(class_name: str, init: Any, name: str, extra: dict | None = None) -> str:
    """The README.md of a model folder holding a `class_name` described by `init`; `extra` adds what a trained
    classifier knows (`metrics`, `run_id`)."""
    cfg = _model_config(class_name, init)
    tags = ["unfoldformer", "pytorch", "energy-based-model", "transformer"]
    front = {"license": LICENSE, "library_name": "unfoldformer"}
    lines = []
    if class_name == "Predictor":
        train = TrainConfig.from_dict(init["train_config"])
        tags.append("text-classification")
        front["pipeline_tag"] = "text-classification"
        if train.data.dataset in DATASETS:
            front["datasets"] = [DATASETS[train.data.dataset]]
        if train.data.embeddings in BASE_MODELS:
            front["base_model"] = BASE_MODELS[train.data.embeddings]
        lines.append(f"Trained on {train.data.dataset} (embeddings `{train.data.embeddings}`, inputs truncated to "
                     f"{train.data.max_length} tokens); model kind `{train.model.kind}`.")
        metrics = (extra or {}).get("metrics")
        if isinstance(metrics, dict) and "accuracy" in metrics:
            lines.append(f"Accuracy when saved: {metrics['accuracy']:.4f} on its evaluation split.")
        load = f'predictor = uf.load("{name}")\nprint(predictor(["a gripping, beautiful film"])[0].label_name)'
    else:
        load = f'model = uf.{class_name}.from_pretrained("{name}")'
    header = ["---", *(f"{key}: {value}" for key, value in front.items() if not isinstance(value, list))]
    header += [f"{key}:\n" + "".join(f"- {v}\n" for v in value).rstrip("\n")
               for key, value in front.items() if isinstance(value, list)]
    header += ["tags:", *(f"- {tag}" for tag in tags), "---"]
    body = [f"# {name}", "", _describe(cfg, class_name), *lines, "", "## What is certified", "", certificate(cfg),
            "", "## How to load", "", "```python", "import unfoldformer as uf", load, "```", "",
            "The folder is checked on load: `complete.json` pins every file by sha256 and the weights carry the "
            "sha256 of every tensor; a changed file is refused.", ""]
    return "\n".join(header + body)
