"""`save_pretrained` / `from_pretrained` / `push_to_hub`: models as folders, locally or on the Hugging Face Hub.

    model.save_pretrained("my-model")          # my-model/: model.safetensors, config.json, README.md, complete.json
    again = uf.UnfoldedTransformer.from_pretrained("my-model")            # or "owner/repo" on the Hub
    model.push_to_hub("owner/repo")                                       # needs a login (`hf auth login`)
    anything = uf.from_pretrained("my-model")                             # whatever the folder holds

Built on `huggingface_hub` primitives (`snapshot_download`, `HfApi.upload_folder`) and safetensors,
like its `PyTorchModelHubMixin`, with two additions: the folder is checked on load, and a model is
rebuilt from its own typed config (`ModelConfig.from_dict`, every range re-validated). The folder
format and its checks are the persistence layer's (`unfoldformer.persist.folder`, one format for
model folders and run folders); the methods come from `PretrainedMixin` (`unfoldformer.pretrained`),
which every model class inherits. This module is the front door that gathers them.

A folder whose files differ from what was saved, whose two descriptions differ, or that holds
another class is refused (`PretrainedError`, one line naming the file). Trained classifiers
(`Predictor`, from `unfoldformer train`) are stored the same way with `class` "Predictor": their
weights file is in the run's format (TrainConfig, checksums; a frozen embedding table is not
stored, only its sha256, and is rebuilt from the config), opened by `uf.load(FOLDER)`.

`HF_HUB_OFFLINE=1`: a repo id is looked up in the local Hugging Face cache only.
"""
from __future__ import annotations

import os

from .errors import PretrainedError
from .inference import load
from .persist.folder import CARD_FILE, CONFIG_FILE, FORMAT, VERSION, WEIGHTS_FILE, read_folder_config
from .persist.hub import resolve_folder, upload_folder
from .pretrained import PretrainedMixin

__all__ = ["CARD_FILE", "CONFIG_FILE", "FORMAT", "PretrainedError", "PretrainedMixin", "VERSION", "WEIGHTS_FILE",
           "from_pretrained", "read_folder_config", "resolve_folder", "upload_folder"]


def from_pretrained(source: str | os.PathLike, **kwargs):
    """Whatever model `source` holds: an encoder or layer (`PretrainedMixin.from_pretrained`), or a trained
    classifier (a `Predictor`, as `uf.load`)."""
    folder = resolve_folder(source, revision=kwargs.pop("revision", None), token=kwargs.pop("token", None))
    if read_folder_config(folder).get("class") == "Predictor":
        return load(folder, **kwargs)
    return PretrainedMixin.from_pretrained(folder, **kwargs)
