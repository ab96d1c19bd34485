"""The classifier a saved config describes: its model, embedding table and class names.

What training builds and what loading rebuilds are the same function of the config (`TrainConfig`):
`build_classifier` (encoder, input map, pooling, head over the embedding table),
`load_embeddings_for` (the table and tokenizer of `data.embeddings`; vocabularies of random or GloVe
tables are built from the data's texts, `split_texts`) and `label_names` (the classes, by the data's
labels). Training uses them to build a model; `load_classifier` to rebuild one before its weights
are restored.

A classifier started from a pretrained encoder (`model.init`: a zoo encoder's name or a DistilledEncoder
folder) is built the same way: `resolve_init` writes the encoder's architecture into the config's model
section once, at the start of training (so a saved run rebuilds without the encoder's folder), the model
gets BERT's input layer (`classifier.BertInput`), and `load_init_weights` copies the encoder's certified
layers and MiniLM's position and LayerNorm rows into a fresh model (training only; a resumed or loaded run
takes its own weights). The encoder's readout into teacher space is not used: the classifier pools the
certified stack's states.
"""
from __future__ import annotations

import dataclasses
import functools

import torch

from ..classifier import SequenceClassifier, build_encoder
from ..config import ModelConfig
from ..errors import ConfigError, PretrainedError
from ..recipe import KIND_PRESETS, TrainConfig

__all__ = ["LABEL_NAMES", "build_classifier", "file_splits", "label_names", "load_embeddings_for",
           "load_init_weights", "resolve_init", "split_texts"]

_STACK = "encoder.encoder."                     # a DistilledEncoder's certified stack (UnfoldedTransformer) keys

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
    bert_input = None
    if cfg.model.init is not None:
        from ..data.embeddings import minilm_input_layer
        layer = minilm_input_layer()
        bert_input = {"max_positions": layer["position"].shape[0], "cls_id": layer["cls_id"],
                      "sep_id": layer["sep_id"], "eps": layer["eps"]}
    return SequenceClassifier(build_encoder(mcfg), embeddings.table, mcfg.d_model, cfg.model.n_classes or 2,
                              trainable_embeddings=cfg.model.trainable_embeddings, project=cfg.model.input_map,
                              pad_id=embeddings.pad_id, final_norm=cfg.model.resolved_final_norm(),
                              bert_input=bert_input)


def _init_folder(init: str):
    """(folder, config.json) of `model.init`'s encoder, checked to be one a classifier can start from."""
    from .folder import read_folder_config
    from .hub import resolve_folder
    try:
        folder = resolve_folder(init)
        info = read_folder_config(folder)
    except PretrainedError as exc:
        raise ConfigError(f"model.init={init!r}: {exc}") from None
    if info.get("class") != "DistilledEncoder":
        raise ConfigError(f"model.init={init!r}: {folder} holds a {info.get('class')}, not a distilled encoder "
                          "(a zoo encoder such as minilm-l6-certified, or a DistilledEncoder folder)")
    spec = info["init"]
    if spec.get("teacher") != "minilm" or spec.get("trainable_embeddings"):
        raise ConfigError(f"model.init={init!r}: only encoders distilled from the packaged MiniLM with its input "
                          "layer frozen can start a classifier (their input is rebuilt from the package)")
    return folder, info


def resolve_init(cfg: TrainConfig) -> TrainConfig:
    """`cfg` with the model section's architecture (kind, d_model, depth, heads, ...) read from `model.init`'s
    encoder and `input_map` off; unchanged without `model.init`."""
    if cfg.model.init is None:
        return cfg
    _, info = _init_folder(cfg.model.init)
    encoder = ModelConfig.from_dict(info["init"]["config"]).resolved()
    kinds = [k for k, (preset, tied) in KIND_PRESETS.items() if preset == encoder.preset_name and tied == encoder.tied]
    if not kinds:
        raise ConfigError(f"model.init={cfg.model.init!r}: its layers ({encoder.preset_name}) are no model.kind")
    updates = {f"model__{f.name}": getattr(encoder, f.name) for f in dataclasses.fields(ModelConfig)
               if f.name not in ("preset_name", "tied")}
    resolved = cfg.replace(model__kind=kinds[0], model__input_map=False, **updates)
    if resolved.model_config() != encoder:
        raise ConfigError(f"model.init={cfg.model.init!r}: its architecture does not map onto model.kind "
                          f"{kinds[0]!r}")
    return resolved


def load_init_weights(model: SequenceClassifier, cfg: TrainConfig) -> None:
    """Copy `model.init`'s certified layers (checked weights, widened to float32) and MiniLM's position and
    LayerNorm rows into `model`, built by `build_classifier` from `resolve_init(cfg)`."""
    from ..data.embeddings import minilm_input_layer
    from .folder import _read_weights
    folder, info = _init_folder(cfg.model.init)
    state = _read_weights(folder, info, "cpu")
    stack = {k[len(_STACK):]: v.float() for k, v in state.items() if k.startswith(_STACK)}
    missing, unexpected = model.encoder.load_state_dict(stack, strict=False)
    if missing or unexpected or not stack:
        raise ConfigError(f"model.init={cfg.model.init!r}: its layers do not fit the classifier's encoder "
                          f"(missing {sorted(missing)[:3]}, unexpected {sorted(unexpected)[:3]})")
    layer = minilm_input_layer()
    with torch.no_grad():
        model.bert_input.position.copy_(layer["position"])
        model.bert_input.norm.weight.copy_(layer["weight"])
        model.bert_input.norm.bias.copy_(layer["bias"])


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
