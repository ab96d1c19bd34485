"""The parts of a run: classifier, embedding table, tokenised splits, optimiser and LR schedule."""
from __future__ import annotations

import functools
import json
import math
import random

import numpy as np
import torch
from torch import nn

from ..classifier import SequenceClassifier, build_encoder
from ..data.batching import TokenizedDataset, seeded_subset, tokenize_dataset
from .config import ConfigError, TrainConfig

__all__ = ["build_classifier", "file_splits", "label_names", "load_embeddings_for", "load_split", "lr_factor",
           "make_optimizer", "split_texts", "warmup_steps", "with_classes"]


def build_classifier(cfg: TrainConfig, embeddings) -> SequenceClassifier:
    """The classifier of `cfg.model.kind` over `embeddings.table` (V, e): frozen (or trainable)
    table → a trainable linear map e → d_model (`model.input_map`; without it e must equal
    d_model) → encoder → masked mean pooling → linear head (`model.n_classes` outputs; unset: 2,
    the named data sets' classes — a run on your files sets it from the data)."""
    mcfg = cfg.model_config()
    width = embeddings.table.shape[1]
    if not cfg.model.input_map and width != mcfg.d_model:
        raise ConfigError(f"model.input_map=false needs model.d_model equal to the embedding width "
                          f"({cfg.data.embeddings}: {width}), got d_model={mcfg.d_model}")
    return SequenceClassifier(build_encoder(mcfg), embeddings.table, mcfg.d_model, cfg.model.n_classes or 2,
                              trainable_embeddings=cfg.model.trainable_embeddings, project=cfg.model.input_map,
                              pad_id=embeddings.pad_id)


def split_texts(cfg: TrainConfig, split: str) -> tuple[list[str], list[int]]:
    """(texts, class indices) of `split`: a split of SST-2 / IMDB, or `train` / `eval` of `data.train_file`."""
    if cfg.data.dataset == "files":
        part = file_splits(cfg)[split]
        return part.texts, part.labels
    from ..data import load_dataset
    examples = load_dataset(cfg.data.dataset, split, cfg.data.data_dir)
    return [e.text for e in examples], [e.label for e in examples]


def file_splits(cfg: TrainConfig) -> dict:
    """`data.load_labelled_files` of the config's files and columns (read once per file version)."""
    from pathlib import Path
    d = cfg.data
    files = [Path(f).expanduser().resolve() for f in (d.train_file, d.eval_file) if f is not None]
    stamps = tuple((str(f), max((p.stat().st_mtime_ns for p in [f, *f.rglob("*")] if p.exists()), default=0))
                   for f in files)
    return _file_splits(stamps, d.train_file, d.eval_file, d.text_column, d.label_column, d.eval_fraction,
                        d.split_seed)


@functools.lru_cache(maxsize=8)
def _file_splits(stamps, train_file, eval_file, text_column, label_column, eval_fraction, split_seed) -> dict:
    from ..data.tables import load_labelled_files
    return load_labelled_files(train_file, eval_file, text_column=text_column, label_column=label_column,
                               eval_fraction=eval_fraction, split_seed=split_seed)


def label_names(cfg: TrainConfig) -> tuple[str, ...]:
    """The class names: the labels of `data.train_file`, or negative / positive for SST-2 and IMDB."""
    from ..inference import LABEL_NAMES
    return file_splits(cfg)["train"].label_names if cfg.data.dataset == "files" else LABEL_NAMES


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


def load_embeddings_for(cfg: TrainConfig):
    """The embedding table of `cfg.data.embeddings`; random/glove vocabularies come from the data."""
    from ..data import load_embeddings
    spec, d = cfg.data.embeddings, cfg.data
    if spec == "minilm" or spec.startswith("hf:"):
        return load_embeddings(spec)
    texts = list(split_texts(cfg, d.train_split)[0])
    if spec == "random":
        return load_embeddings("random", vocab_texts=texts, dim=d.embedding_dim, seed=d.embedding_seed)
    texts += split_texts(cfg, cfg.eval_split)[0]
    return load_embeddings(spec, vocab_texts=texts)


def load_split(cfg: TrainConfig, embeddings, split: str, limit: int | None) -> TokenizedDataset:
    """Tokenised `split` (a fixed seed-0 subset of `limit` examples if given), cached on disk for minilm."""
    from ..data.files import cache_dir
    texts, labels = split_texts(cfg, split)
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
