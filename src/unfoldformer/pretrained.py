"""`PretrainedMixin`: `save_pretrained` / `from_pretrained` / `push_to_hub` for every model class.

    model.save_pretrained("my-model")                  # a model folder: weights, config.json, README.md card
    again = uf.UnfoldedTransformer.from_pretrained("my-model")            # or "owner/repo" on the Hub
    model.push_to_hub("owner/repo")                                       # needs a login (`hf auth login`)

The mixin lives with the models and knows nothing of files: a model class describes its
constructor (`_pretrained_init`, JSON values) and rebuilds itself from that description
(`_from_pretrained_init`); every subclass is registered by name, so a folder can say which class
it holds. Reading and writing the folder is the persistence layer's (`unfoldformer.persist`),
which registers itself here when the package is imported (`use_folder_io`): models import
nothing above their own floor.
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import torch

from .config import ModelConfig
from .errors import PretrainedError

__all__ = ["PretrainedError", "PretrainedMixin", "model_class", "model_classes", "use_folder_io"]

_CLASSES: dict[str, type] = {}
_FOLDER_IO: list[Any] = []          # the persistence layer's folder reader/writer, once registered


def use_folder_io(folder_io: Any) -> None:
    """Register the object whose `save_pretrained`, `load_model` and `push_model` the mixin calls
    (`unfoldformer.persist` does so on import)."""
    _FOLDER_IO[:] = [folder_io]


def _folder_io() -> Any:
    if not _FOLDER_IO:
        raise PretrainedError("no model-folder reader registered: import unfoldformer (its persistence layer "
                              "registers itself)")
    return _FOLDER_IO[0]


def model_class(name: str) -> type | None:
    """The registered model class called `name` (None if there is none)."""
    return _CLASSES.get(name)


def model_classes() -> list[str]:
    """The names of every registered model class, sorted."""
    return sorted(_CLASSES)


class PretrainedMixin:
    """`save_pretrained` / `from_pretrained` / `push_to_hub` for an `nn.Module` rebuilt from a JSON description.

    A subclass describes its constructor with `_pretrained_init()` (JSON values) and rebuilds itself
    with `_from_pretrained_init(init)`; the default is `{"config": ModelConfig dict}` and `cls(config)`.
    """

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        _CLASSES[cls.__name__] = cls

    def _pretrained_init(self) -> Any:
        return {"config": self.config.to_dict()}

    @classmethod
    def _from_pretrained_init(cls, init: Any):
        return cls(ModelConfig.from_dict(init["config"]))

    def save_pretrained(self, folder: str | os.PathLike) -> Path:
        """Write the model folder `folder` (model.safetensors with checksums, config.json, README.md card,
        complete.json pinning them; each file whole or not at all); returns it.

        Raises:
            OutputError: `folder` is a run's folder (a training, language-model or distillation run, or
                another command's output; the one the model was loaded from included): a model folder
                goes beside a run, never into it (`persist.folder.check_model_destination`)."""
        return _folder_io().save_pretrained(self, Path(folder))

    @classmethod
    def from_pretrained(cls, source: str | os.PathLike, *, revision: str | None = None, token: str | None = None,
                        map_location: str | torch.device = "cpu"):
        """The model saved in `source` (a folder, or an `owner/name` Hub repo), checked, in eval mode.
        Called on `PretrainedMixin` itself it returns whatever class the folder holds."""
        return _folder_io().load_model(cls, source, revision=revision, token=token, map_location=map_location)

    def push_to_hub(self, repo_id: str, *, private: bool | None = None, token: str | None = None,
                    commit_message: str = "Upload unfoldformer model") -> str:
        """Save to a temporary folder and upload it to the Hub model repo `repo_id` (created if needed)."""
        return _folder_io().push_model(self, repo_id, private=private, token=token, commit_message=commit_message)
