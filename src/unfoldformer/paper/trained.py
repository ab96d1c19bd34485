"""Trained variants of figures 5–6: each recipe a `TrainConfig`, trained and evaluated by `unfoldformer.train`.

Three recipes per data set (THEORY §7 items 5–6), each a run folder `models/<dataset>-<name>` of
the reproduction's output (open one with `unfoldformer.load(folder)`):

- ``as-released`` — the paper's recipe, for the `paper` and the `paper-as-released` formulas: plain
  SGD, lr 1e-2 on the cross-entropy *summed* over minibatches of 16 (one lr-step per example), one
  epoch over 2,000 training examples truncated to 32 tokens, frozen embeddings, no input map
  (d_model = the embedding width), no warm-up, weight decay or clipping. The released model gets
  `released_normalize_()` after training, as the released code does (it squares W_f again).
- ``trained`` — a recipe that learns, for the same 12-step weight-tied `paper` model: AdamW, linear
  warm-up then cosine decay, a trainable input map from the embedding width to a narrower d_model,
  more examples.
- ``certified`` — the `certified` (joint) model (THEORY §3.7: one MM step per layer, whole-layer descent by
  construction, so its curves are drawn without the safeguard) with the same recipe.

`RecipeSpec` lists what differs between recipes; `train_config` turns one into a validated
`TrainConfig`; `train_variant` trains it, loads the final weights and measures accuracy
(`unfoldformer.train.evaluate`); `load_trained` opens a finished run as the figures show it.
No plotting here.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import torch

from ..data.batching import eval_batches
from ..runs import refresh_manifest
from ..train import TrainConfig, load_classifier, train
from ..train.build import load_split
from ..train.evaluate import evaluate
from ..utils import write_json

#: Examples of the in-training evaluation when accuracy is measured afterwards at another truncation.
MONITOR_EXAMPLES = 200

__all__ = ["RecipeSpec", "TrainedVariant", "load_trained", "recipes", "record_final_location", "train_config",
           "train_variant"]


@dataclass(frozen=True)
class RecipeSpec:
    """One trained variant: the curve key it fills, the model kind and the recipe's settings."""

    key: str                          # "formula/variant" of the energy curves
    name: str                         # run folder suffix: models/<dataset>-<name>
    kind: str                         # model.kind
    label: str                        # how figures and the report name it
    optimizer: str                    # adamw | sgd
    loss_reduction: str               # mean | sum
    lr: float
    batch_size: int
    epochs: int
    train_examples: int | None        # None: the whole train split
    max_length: int                   # training truncation (tokens)
    eval_length: int | None           # accuracy truncation (None: full length)
    d_model: int | None               # None: the embedding width (no input map)
    safeguard: bool = False           # curves with whole-layer descent by backtracking (certified models)
    warmup: float = 0.0
    weight_decay: float = 0.0
    grad_clip: float | None = None
    model: dict = field(default_factory=dict)   # further model-section values (e.g. ffn_hidden)

    @property
    def input_map(self) -> bool:
        return self.d_model is not None


@dataclass
class TrainedVariant:
    """A finished training run of one recipe, with what the report needs about it (the weights stay in
    `run_dir`; `load_trained` opens them)."""

    spec: RecipeSpec
    run_dir: Path
    accuracy: float                   # final weights (after released_normalize_ for the released model)
    accuracy_as_trained: float | None  # released model only: before released_normalize_()
    training: dict                    # steps, examples, losses (no wall times)
    wall_time_s: float


def train_config(spec: RecipeSpec, dataset: str, run_dir: Path, *, embeddings: str, embedding_dim: int,
                 accuracy_examples: int | None, seed: int, threads: int, data_dir: str | None) -> TrainConfig:
    """The validated `TrainConfig` of `spec` on `dataset` (ConfigError names a bad value)."""
    model = {"kind": spec.kind, "input_map": spec.input_map, "d_model": spec.d_model or embedding_dim, **spec.model}
    cfg = TrainConfig().replace(
        **{f"model__{k}": v for k, v in model.items()},
        data__dataset=dataset, data__data_dir=data_dir, data__max_length=spec.max_length,
        data__embeddings=embeddings, data__embedding_dim=embedding_dim, data__embedding_seed=seed,
        data__max_train_examples=spec.train_examples, data__max_eval_examples=accuracy_examples,
        optim__optimizer=spec.optimizer, optim__loss_reduction=spec.loss_reduction, optim__lr=spec.lr,
        optim__batch_size=spec.batch_size, optim__epochs=spec.epochs, optim__warmup=spec.warmup,
        optim__weight_decay=spec.weight_decay, optim__grad_clip=spec.grad_clip,
        optim__min_lr_ratio=1.0 if spec.optimizer == "sgd" else 0.0, optim__seed=seed,
        run__out_dir=str(run_dir), run__checkpoint_every=0, run__threads=threads, run__progress=False,
        run__overwrite=True, run__eval_batch_size=64,
        run__eval_examples=None if spec.eval_length == spec.max_length else MONITOR_EXAMPLES)
    cfg.validate()
    return cfg


def _accuracy(loaded, cfg: TrainConfig, length: int | None) -> tuple[float, int]:
    """(accuracy, examples) of a loaded classifier on the run's evaluation examples truncated to `length`."""
    ds = load_split(cfg, loaded.embeddings, cfg.eval_split, cfg.data.max_eval_examples)
    batches = eval_batches(ds.lengths(length), cfg.run.eval_batch_size)
    res = evaluate(loaded.model, ds, batches, length, loaded.embeddings.pad_id, torch.device("cpu"),
                   energies=False).result()
    return res["accuracy"], res["n"]


def load_trained(spec: RecipeSpec, run_dir: Path):
    """The final weights of a recipe's run (`train.LoadedClassifier`) as figures 5–6 show them: the released
    model with `released_normalize_()` applied once more, as the released code does after training."""
    loaded = load_classifier(Path(run_dir) / "last.safetensors")
    if spec.kind == "paper-as-released":
        loaded.model.encoder.released_normalize_()                # squares W_f again, as released
    return loaded


def train_variant(spec: RecipeSpec, cfg: TrainConfig) -> TrainedVariant:
    """Train `cfg` (a fresh run in `cfg.run.out_dir`), load its final weights, measure accuracy at
    `spec.eval_length` (the released model before and after `released_normalize_()`)."""
    summary = train(cfg)
    run_dir, final = Path(cfg.run.out_dir), summary["final"]
    at_training_length = cfg.run.eval_examples is None              # the in-training evaluation measured it
    as_trained = None
    if at_training_length:
        accuracy, n = final["eval_accuracy"], final["eval_n"]
    else:
        accuracy, n = _accuracy(load_classifier(run_dir / "last.safetensors"), cfg, spec.eval_length)
    if spec.kind == "paper-as-released":
        as_trained = accuracy
        accuracy, n = _accuracy(load_trained(spec, run_dir), cfg, spec.eval_length)
    resolved = json.loads((run_dir / "config.json").read_text())["resolved"]
    training = {"steps": summary["steps"], "train_examples": resolved["train_examples"], "accuracy_examples": n,
                "accuracy_max_length": spec.eval_length, "train_max_length": spec.max_length,
                "parameters": resolved["parameters"], "final_train_loss": final["train_loss"]}
    return TrainedVariant(spec, run_dir, accuracy, as_trained, training, summary["wall_time_s"])


def record_final_location(run_dir: Path, final_dir: Path) -> None:
    """Make a run trained in a staging folder (`runs.staged_output`) name the folder it will end in:
    `run.out_dir` of its config.json and `out_dir` of its summary.json become `final_dir`."""
    for name, section in (("config.json", "run"), ("summary.json", None)):
        path = Path(run_dir) / name
        if path.is_file():
            record = json.loads(path.read_text())
            (record[section] if section else record)["out_dir"] = str(final_dir)
            write_json(path, record)
    refresh_manifest(run_dir)                                      # the run's manifest pins the edited files


def _count(n: int | None) -> str:
    return "all" if n is None else f"{n:,}"


def recipes(cfg, dataset: str) -> list[RecipeSpec]:
    """The trained variants of one data set under `cfg` (a `ReproduceSettings`), in training order."""
    n, length = getattr(cfg, f"{dataset}_train_examples"), getattr(cfg, f"{dataset}_train_length")
    curves = cfg.imdb_max_length if dataset == "imdb" else None
    sgd = dict(optimizer="sgd", loss_reduction="sum", lr=1e-2, batch_size=16, epochs=cfg.train_epochs,
               train_examples=cfg.released_examples, max_length=32, eval_length=32, d_model=None)
    adamw = dict(optimizer="adamw", loss_reduction="mean", lr=3e-3, batch_size=cfg.trained_batch_size,
                 epochs=cfg.train_epochs, train_examples=n, max_length=length, eval_length=curves,
                 d_model=cfg.trained_width, warmup=0.1, weight_decay=0.01, grad_clip=1.0)
    released = f"trained as released (SGD, {_count(cfg.released_examples)} ex.)"
    adamw_label = f"trained (AdamW, {_count(n)} ex.)"
    heads = max(1, min(4, cfg.trained_width // 16))
    return [
        RecipeSpec("paper/trained-as-released", "paper-sgd", "paper", released, **sgd),
        RecipeSpec("paper-as-released/trained-as-released", "released-sgd", "paper-as-released", released, **sgd),
        RecipeSpec("paper/trained", "paper-adamw", "paper", adamw_label, **adamw),
        RecipeSpec("certified/trained", "certified-joint-adamw", "certified", adamw_label, **adamw,
                   model={"n_heads": heads, "ffn_hidden": 4 * cfg.trained_width}),
    ]
