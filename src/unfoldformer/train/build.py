"""The parts of a run: classifier, embedding table, tokenised splits, optimiser and LR schedule."""
from __future__ import annotations

import json
import math
import random

import numpy as np
import torch
from torch import nn

from ..classifier import SequenceClassifier, build_encoder
from ..data.batching import TokenizedDataset, seeded_subset, tokenize_dataset
from .config import ConfigError, TrainConfig

__all__ = ["build_classifier", "load_embeddings_for", "load_split", "lr_factor", "make_optimizer", "warmup_steps"]


def build_classifier(cfg: TrainConfig, embeddings) -> SequenceClassifier:
    """The classifier of `cfg.model.kind` over `embeddings.table` (V, e): frozen (or trainable)
    table → a trainable linear map e → d_model (`model.input_map`; without it e must equal
    d_model) → encoder → masked mean pooling → linear head."""
    mcfg = cfg.model_config()
    width = embeddings.table.shape[1]
    if not cfg.model.input_map and width != mcfg.d_model:
        raise ConfigError(f"model.input_map=false needs model.d_model equal to the embedding width "
                          f"({cfg.data.embeddings}: {width}), got d_model={mcfg.d_model}")
    return SequenceClassifier(build_encoder(mcfg), embeddings.table, mcfg.d_model, cfg.model.n_classes,
                              trainable_embeddings=cfg.model.trainable_embeddings, project=cfg.model.input_map,
                              pad_id=embeddings.pad_id)


def load_embeddings_for(cfg: TrainConfig):
    """The embedding table of `cfg.data.embeddings`; random/glove vocabularies come from the data."""
    from ..data import load_dataset, load_embeddings
    spec, d = cfg.data.embeddings, cfg.data
    if spec == "minilm":
        return load_embeddings("minilm")
    texts = [e.text for e in load_dataset(d.dataset, d.train_split, d.data_dir)]
    if spec == "random":
        return load_embeddings("random", vocab_texts=texts, dim=d.embedding_dim, seed=d.embedding_seed)
    texts += [e.text for e in load_dataset(d.dataset, cfg.eval_split, d.data_dir)]
    return load_embeddings(spec, vocab_texts=texts)


def load_split(cfg: TrainConfig, embeddings, split: str, limit: int | None) -> TokenizedDataset:
    """Tokenised `split` (a fixed seed-0 subset of `limit` examples if given), cached on disk for minilm."""
    from ..data import load_dataset
    from ..data.files import cache_dir
    examples = load_dataset(cfg.data.dataset, split, cfg.data.data_dir)
    idx = seeded_subset(len(examples), limit)
    if idx is not None:
        examples = [examples[i] for i in idx]
    texts, labels = [e.text for e in examples], [e.label for e in examples]
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
