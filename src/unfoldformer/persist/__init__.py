"""Persistence: the one on-disk format of models and runs, and the one code path that reads it.

A model folder (`save_pretrained`, `Predictor.save_pretrained`, the zoo) and a run folder
(`unfoldformer train`) are instances of one format:

- weights as safetensors carrying the sha256 of every tensor and of their description (`weights`);
- `config.json` describing what to rebuild (a model folder: class and constructor; a run: its
  `TrainConfig`);
- a Hugging Face-style `README.md` card (`card`; model folders);
- the manifest `complete.json`, written last, pinning every file by size and sha256 (`manifest`).

`from_pretrained` (`folder.load_model`), `uf.load` (`classifier.load_classifier`), the zoo and
training's resume (`weights.load_train_state`, `load_weights`) all read through here, and nothing
here imports the training package: prediction runs without it. Importing this package registers
the folder reader/writer with `PretrainedMixin` (`pretrained.use_folder_io`), which models inherit.
"""
from __future__ import annotations

from ..pretrained import use_folder_io
from . import folder
from .classifier import LoadedClassifier, classifier_source, load_classifier, save_predictor
from .folder import CARD_FILE, CONFIG_FILE, FORMAT, WEIGHTS_FILE, load_model, read_folder_config, save_model
from .manifest import MANIFEST_NAME, manifest_vouches, verify_manifest, write_manifest
from .weights import load_train_state, load_weights, save_train_state, save_weights

__all__ = ["CARD_FILE", "CONFIG_FILE", "FORMAT", "LoadedClassifier", "MANIFEST_NAME", "WEIGHTS_FILE",
           "classifier_source", "load_classifier", "load_model", "load_train_state", "load_weights",
           "manifest_vouches", "read_folder_config", "save_model", "save_predictor", "save_train_state",
           "save_weights", "verify_manifest", "write_manifest"]

use_folder_io(folder)
