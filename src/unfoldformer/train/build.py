"""The parts of a run: tokenised splits, optimiser and LR schedule (the classifier, its embedding table and
class names: `persist.rebuild`, shared with loading)."""
from __future__ import annotations

import json
import math
import random
from pathlib import Path

import numpy as np
import torch
from torch import nn

from ..data.batching import TokenizedDataset, seeded_subset, tokenize_dataset
from ..persist.rebuild import build_classifier, file_splits, label_names, load_embeddings_for, split_texts
from ..recipe import ConfigError, TrainConfig

__all__ = ["build_classifier", "file_splits", "label_names", "load_embeddings_for", "load_split", "lr_factor",
           "make_optimizer", "run_inputs", "split_texts", "tokenize_texts", "warmup_steps", "with_classes"]


def run_inputs(cfg: TrainConfig, config_file=None) -> dict[str, dict]:
    """The files a run reads, for `runs.claim_run_folder`: `inputs` (label -> file: the data files, the config
    file, a word-vector file) and `whole` (label -> folder every file of which is an input: a datasets folder
    given as data.train_file / data.eval_file, a Hugging Face embeddings folder)."""
    from ..data import find_data_file
    from ..data.datasets import DATASET_FILES
    d, inputs, whole = cfg.data, {"config file": config_file}, {}
    for name in ("train_file", "eval_file"):
        path = getattr(d, name)
        (whole if path is not None and Path(path).expanduser().is_dir() else inputs)[f"data.{name}"] = path
    if d.dataset in DATASET_FILES:
        try:
            inputs["data set file"] = find_data_file(DATASET_FILES[d.dataset], d.data_dir, download=False)
        except (OSError, ValueError):                              # not there yet: nothing of it to delete
            pass
    if d.embeddings.startswith("glove:"):
        inputs["data.embeddings file"] = d.embeddings[6:]
    if d.embeddings.startswith("hf:"):
        whole["data.embeddings folder"] = d.embeddings[3:]
    return {"inputs": inputs, "whole": whole}


def with_classes(cfg: TrainConfig) -> tuple[TrainConfig, tuple[str, ...]]:
    """`cfg` with `model.n_classes` set from the data, and the label names; an explicit
    `model.n_classes` that differs from the data's number of classes is a ConfigError."""
    names = label_names(cfg)
    given = cfg.model.n_classes
    if given is not None and given != len(names):
        source = cfg.data.train_file if cfg.data.dataset == "files" else cfg.data.dataset
        raise ConfigError(f"model.n_classes={given}, but {source} has {len(names)} classes "
                          f"({', '.join(names[:8])}{', …' if len(names) > 8 else ''}); leave it unset")
    return (cfg if given is not None else cfg.replace(model__n_classes=len(names))), names


def load_split(cfg: TrainConfig, embeddings, split: str, limit: int | None) -> TokenizedDataset:
    """Tokenised `split` (a fixed seed-0 subset of `limit` examples if given), cached on disk for minilm."""
    return tokenize_texts(cfg, embeddings, *split_texts(cfg, split), limit)


def tokenize_texts(cfg: TrainConfig, embeddings, texts: list[str], labels: list[int],
                   limit: int | None) -> TokenizedDataset:
    """Tokenised `texts` with their class indices (a fixed seed-0 subset of `limit` examples if given), cached
    on disk for minilm when `data.token_cache` is on."""
    from ..data.files import cache_dir
    idx = seeded_subset(len(texts), limit)
    if idx is not None:
        texts, labels = [texts[i] for i in idx], [labels[i] for i in idx]
    cache, key = None, None
    if cfg.data.token_cache and embeddings.name == "minilm":
        cache = cache_dir() / "tokens"
        key = json.dumps(embeddings.describe()["files"], sort_keys=True) + "\0" + "\0".join(texts)
    return tokenize_dataset(texts, labels, embeddings, cache, key)


def _seed_all(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def make_optimizer(model: nn.Module, cfg: TrainConfig) -> torch.optim.Optimizer:
    """AdamW or plain SGD (`optim.optimizer`); weight decay on weight matrices only (not on biases,
    scales, norms, the embedding table or the orthogonal-basis parametrisations)."""
    decay, no_decay = [], []
    for name, p in model.named_parameters():
        if not p.requires_grad:
            continue
        plain = p.ndim >= 2 and "parametrizations" not in name and not name.startswith("embedding.")
        (decay if plain else no_decay).append(p)
    groups = [{"params": decay, "weight_decay": cfg.optim.weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
    if cfg.optim.optimizer == "sgd":
        return torch.optim.SGD(groups, lr=cfg.optim.lr)
    return torch.optim.AdamW(groups, lr=cfg.optim.lr)


def lr_factor(step: int, warmup: int, total: int, min_ratio: float) -> float:
    """Linear warm-up over `warmup` steps, then cosine decay from 1 to `min_ratio` at `total`."""
    if step < warmup:
        return (step + 1) / warmup
    progress = min(1.0, (step - warmup) / max(1, total - warmup))
    return min_ratio + (1 - min_ratio) * 0.5 * (1 + math.cos(math.pi * progress))


def warmup_steps(cfg: TrainConfig, total: int) -> int:
    w = cfg.optim.warmup
    return int(round(w * total)) if w < 1 else int(w)
