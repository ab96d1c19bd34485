"""The models the ρ study looks at: random-init, and trained (from accuracy-benchmark result files,
or, in quick mode, trained here on a tiny budget).

Random-init models of every ρ are built from the same seed, so they share every parameter: the
comparison between ρ is then one of the kernel alone. Trained models are found by the accuracy
benchmark's file names, `<dataset>-<kind>[-rho_<ρ>]-seed<k>.json` (full budget; a `-reduced` file is
used, and labelled so, when no full one exists); their final weights (`last.safetensors`) are read
from the run folder the file records, or from `runs_dir/<name>/`.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import torch

from ..classifier import SequenceClassifier
from ..names import KINDS_BEFORE_0_3
from ..recipe import TrainConfig
from ..train.build import build_classifier
from ..train.checkpoint import CheckpointError, load_classifier
from .settings import QUICK_TRAINING, RhoStudySettings

__all__ = ["SOURCES", "Source", "cell_name", "is_random", "random_model", "trained_model"]

#: label -> model kind of the accuracy benchmark; `random*` labels are that kind at initialisation (tied).
#: The study's ρ question is about the alternating layer (its attention sub-step); `-joint` labels the joint one.
SOURCES = {"random": "certified-alternating", "random-joint": "certified", "trained-tied": "certified-alternating",
           "trained-untied": "certified-alternating-untied", "trained-joint": "certified"}
#: Kind -> the name in the accuracy benchmark's result files, which keep the kind names of version 0.2.0
#: (`KINDS_BEFORE_0_3`) so that the results recorded then stay theirs.
RESULT_LABELS = {new: old for old, new in KINDS_BEFORE_0_3.items()}


def is_random(label: str) -> bool:
    """Whether a source label stands for a model at initialisation (not trained)."""
    return label.startswith("random")


@dataclass
class Source:
    """One model of one ρ, or the reason it is missing."""

    label: str                              # a key of SOURCES
    rho: str
    model: SequenceClassifier | None
    origin: str                             # where it came from (seed, result file, budget)
    accuracy: float | None = None
    budget: str | None = None

    @property
    def missing(self) -> bool:
        return self.model is None


def cell_name(dataset: str, kind: str, rho: str, seed: int, reduced: bool = False) -> str:
    """The accuracy benchmark's result name of a cell (exp cells carry no ρ tag; kinds as `RESULT_LABELS`)."""
    return (f"{dataset}-{RESULT_LABELS.get(kind, kind)}" + ("" if rho == "exp" else f"-rho_{rho}") + f"-seed{seed}"
            + ("-reduced" if reduced else ""))


def train_config(kind: str, rho: str, settings: RhoStudySettings, dataset: str,
                 out_dir: str | None = None) -> TrainConfig:
    """The study's training config of one model (its architecture; quick mode's tiny training budget)."""
    q = QUICK_TRAINING
    return TrainConfig.from_dict({
        "model": {"kind": kind, "rho": rho, **settings.architecture},
        "data": {"dataset": dataset, "data_dir": settings.data_dir, "max_length": settings.max_length(dataset),
                 "embeddings": "minilm", "max_train_examples": q["train_examples"],
                 "max_eval_examples": q["eval_examples"]},
        "optim": {"lr": q["lr"], "epochs": q["epochs"], "batch_size": q["batch_size"], "seed": settings.seed},
        "run": {"out_dir": out_dir or "unused", "threads": settings.threads, "progress": False,
                "checkpoint_every": 0},
    })


def random_model(rho: str, settings: RhoStudySettings, dataset: str, embeddings, label: str = "random") -> Source:
    """The tied certified model of `label`'s kind (alternating or joint layer) and ρ at initialisation; the same
    parameters for every ρ (seeded)."""
    torch.manual_seed(settings.seed)
    model = build_classifier(train_config(SOURCES[label], rho, settings, dataset), embeddings).eval()
    return Source(label, rho, model, f"random initialisation, seed {settings.seed}")


def trained_model(label: str, rho: str, settings: RhoStudySettings, dataset: str, models_dir: Path) -> Source:
    """The trained model of `label` for ρ: quick mode trains it into `models_dir`; otherwise it is read
    from the accuracy benchmark's result files (or reported missing, with the reason)."""
    kind = SOURCES[label]
    if settings.quick:
        return _train_quick(label, kind, rho, settings, dataset, models_dir)
    if settings.results_dir is None:
        return Source(label, rho, None, "no accuracy-benchmark results folder given (--results)")
    folder = Path(settings.results_dir)
    for reduced in (False, True):
        name = cell_name(dataset, kind, rho, settings.seed, reduced)
        record_path = folder / f"{name}.json"
        if record_path.is_file():
            return _from_record(label, rho, record_path, name, settings)
    return Source(label, rho, None, f"not run yet: no {cell_name(dataset, kind, rho, settings.seed)}.json "
                                    f"in {folder}")


def _from_record(label: str, rho: str, record_path: Path, name: str, settings: RhoStudySettings) -> Source:
    record = json.loads(record_path.read_text())
    candidates = [Path(record["run_dir"])] if record.get("run_dir") else []
    if settings.runs_dir:
        candidates.insert(0, Path(settings.runs_dir) / name)
    budget = record.get("budget", "full")
    for run in candidates:
        weights = run / "last.safetensors"
        if weights.is_file():
            try:
                loaded = load_classifier(weights, data_dir=settings.data_dir)
            except CheckpointError as exc:
                return Source(label, rho, None, f"{record_path.name}: weights unreadable: {exc}")
            return Source(label, rho, loaded.model.eval(), f"{record_path.name} ({budget} budget), {weights}",
                          record.get("accuracy"), budget)
    where = ", ".join(str(c) for c in candidates) or "no run folder recorded"
    return Source(label, rho, None, f"{record_path.name} found but its weights are not on this machine ({where}); "
                                    "pass --runs-dir")


def _train_quick(label: str, kind: str, rho: str, settings: RhoStudySettings, dataset: str,
                 models_dir: Path) -> Source:
    """Train (or reuse, or resume) the quick model in `models_dir/<name>`."""
    from ..train import train

    run = models_dir / cell_name(dataset, kind, rho, settings.seed)
    cfg = train_config(kind, rho, settings, dataset, str(run))
    weights = run / "last.safetensors"
    summary = run / "summary.json"
    if not (weights.is_file() and summary.is_file()):
        train(cfg, resume=(run / "checkpoint.pt").is_file())
    loaded = load_classifier(weights, data_dir=settings.data_dir)
    accuracy = json.loads(summary.read_text())["final"]["eval_accuracy"]
    q = QUICK_TRAINING
    return Source(label, rho, loaded.model.eval(), f"trained here: {q['train_examples']} {dataset} sentences, "
                  f"{q['epochs']} epoch, models/{run.name}", accuracy, "quick")
