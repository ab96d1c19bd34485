"""The classifier a saved config describes: its model, embedding table and class names.

What training builds and what loading rebuilds are the same function of the config (`TrainConfig`):
`build_classifier` (encoder, input map, pooling, head over the embedding table),
`load_embeddings_for` (the table and tokenizer of `data.embeddings`; vocabularies of random or GloVe
tables are built from the data's texts, `split_texts`) and `label_names` (the classes, by the data's
labels). Training uses them to build a model; `load_classifier` to rebuild one before its weights
are restored.
"""
from __future__ import annotations

import functools

from ..classifier import SequenceClassifier, build_encoder
from ..errors import ConfigError
from ..recipe import TrainConfig

__all__ = ["LABEL_NAMES", "build_classifier", "file_splits", "label_names", "load_embeddings_for", "split_texts"]

#: The class names of the named data sets (SST-2, IMDB), by class index.
LABEL_NAMES = ("negative", "positive")


def build_classifier(cfg: TrainConfig, embeddings) -> SequenceClassifier:
    """The classifier of `cfg.model.kind` over `embeddings.table` (V, e): frozen (or trainable)
    table → a trainable linear map e → d_model (`model.input_map`; without it e must equal
    d_model) → encoder → LayerNorm (`model.final_norm`; by default for the certified kinds) → masked mean
    pooling → linear head (`model.n_classes` outputs; unset: 2, the named data sets' classes — a run on your
    files sets it from the data)."""
    mcfg = cfg.model_config()
    width = embeddings.table.shape[1]
    if not cfg.model.input_map and width != mcfg.d_model:
        raise ConfigError(f"model.input_map=false needs model.d_model equal to the embedding width "
                          f"({cfg.data.embeddings}: {width}), got d_model={mcfg.d_model}")
    return SequenceClassifier(build_encoder(mcfg), embeddings.table, mcfg.d_model, cfg.model.n_classes or 2,
                              trainable_embeddings=cfg.model.trainable_embeddings, project=cfg.model.input_map,
                              pad_id=embeddings.pad_id, final_norm=cfg.model.resolved_final_norm())


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
    return file_splits(cfg)["train"].label_names if cfg.data.dataset == "files" else LABEL_NAMES


def load_embeddings_for(cfg: TrainConfig):
    """The embedding table of `cfg.data.embeddings`; random/glove vocabularies come from the data."""
    from ..data import load_embeddings
    spec, d = cfg.data.embeddings, cfg.data
    if spec == "minilm" or spec.startswith("hf:"):
        return load_embeddings(spec)
    texts = list(split_texts(cfg, d.train_split)[0])
    if spec == "random":
        return load_embeddings("random", vocab_texts=texts, dim=d.embedding_dim, seed=d.embedding_seed,
                               generator=d.random_table)
    texts += split_texts(cfg, cfg.eval_split)[0]
    return load_embeddings(spec, vocab_texts=texts)
