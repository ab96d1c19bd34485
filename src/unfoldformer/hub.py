"""`save_pretrained` / `from_pretrained` / `push_to_hub`: models as folders, locally or on the Hugging Face Hub.

    model.save_pretrained("my-model")                  # my-model/config.json + my-model/model.safetensors
    again = uf.UnfoldedTransformer.from_pretrained("my-model")            # or "owner/repo" on the Hub
    model.push_to_hub("owner/repo")                                       # needs a login (`hf auth login`)

Built on `huggingface_hub` primitives (`snapshot_download`, `HfApi.upload_folder`) and safetensors,
like its `PyTorchModelHubMixin`, with two additions: the folder is checked on load, and a model is
rebuilt from its own typed config (`ModelConfig.from_dict`, every range re-validated). A folder holds

- `model.safetensors`: the state dict; its metadata repeats the class and constructor description;
- `config.json`: `format` ("unfoldformer-pretrained"), `version`, `class`, `init` (the constructor
  description: for the encoders their resolved `ModelConfig`), `library_version`, and the sha256
  of `model.safetensors` (`weights_sha256`).

A folder whose weights do not match their sha256, whose two descriptions differ, or that holds
another class is refused (`PretrainedError`, one line naming the folder). Trained classifiers
(`Predictor`, from `unfoldformer train`) are stored the same way with `class` "Predictor": their
weights file is the run's weights file (TrainConfig, checksums; a frozen embedding table is not
stored, only its sha256, and is rebuilt from the config), opened by `uf.load(FOLDER)`.

`HF_HUB_OFFLINE=1`: a repo id is looked up in the local Hugging Face cache only.
"""
from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Any

import torch

from .errors import UnfoldformerError
from .utils import atomic_write_bytes, file_sha256, write_json

__all__ = ["CONFIG_FILE", "FORMAT", "PretrainedError", "PretrainedMixin", "WEIGHTS_FILE", "from_pretrained",
           "read_folder_config", "resolve_folder", "upload_folder", "write_folder_config"]

FORMAT, VERSION = "unfoldformer-pretrained", 1
CONFIG_FILE, WEIGHTS_FILE = "config.json", "model.safetensors"
_CLASSES: dict[str, type] = {}


class PretrainedError(UnfoldformerError, ValueError):
    """A pretrained folder or repo that is missing, damaged, or holds another model (the message names it)."""


def _looks_like_repo_id(name: str) -> bool:
    if name.startswith((".", "/", "~")) or os.sep in name.replace("/", "", 1) or name.count("/") != 1:
        return False
    from huggingface_hub.utils import validate_repo_id
    try:
        validate_repo_id(name)
    except Exception:  # HFValidationError
        return False
    return True


def resolve_folder(source: str | os.PathLike, *, revision: str | None = None, token: str | None = None) -> Path:
    """A local folder as is; an `owner/name` repo id downloaded (or found in the cache) by `huggingface_hub`."""
    path = Path(source).expanduser()
    if path.is_dir():
        return path
    name = str(source)
    if path.exists() or not _looks_like_repo_id(name):
        raise PretrainedError(f"{source}: no such folder (and not a Hub repo id 'owner/name')")
    from huggingface_hub import snapshot_download
    try:
        local = snapshot_download(name, revision=revision, token=token, library_name="unfoldformer",
                                  allow_patterns=[CONFIG_FILE, WEIGHTS_FILE, "card.json", "*.md"])
    except Exception as exc:  # offline, not found, gated, network: huggingface_hub's own error types
        detail = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise PretrainedError(f"{name}: no such local folder or file, and no Hub repo of that name could be fetched "
                              f"({type(exc).__name__}: {detail})") from exc
    return Path(local)


def read_folder_config(folder: Path) -> dict:
    """The folder's config.json, checked: our format, a readable version, the weights' sha256 matching."""
    config_path = folder / CONFIG_FILE
    try:
        info = json.loads(config_path.read_text())
    except FileNotFoundError:
        raise PretrainedError(f"{folder}: no {CONFIG_FILE}: not a pretrained folder") from None
    except (OSError, ValueError) as exc:
        raise PretrainedError(f"{config_path}: not readable JSON ({exc})") from None
    if not isinstance(info, dict) or info.get("format") != FORMAT:
        raise PretrainedError(f"{config_path}: not an unfoldformer pretrained config (no format '{FORMAT}')")
    if info.get("version") != VERSION:
        raise PretrainedError(f"{config_path}: version {info.get('version')!r} is not {VERSION} "
                              "(written by another unfoldformer version?)")
    weights = folder / WEIGHTS_FILE
    if not weights.is_file():
        raise PretrainedError(f"{folder}: no {WEIGHTS_FILE}")
    if file_sha256(weights) != info.get("weights_sha256"):
        raise PretrainedError(f"{weights}: corrupt: its sha256 differs from the one in {CONFIG_FILE}; "
                              "the folder changed after it was written, so fetch or save it again")
    return info


def write_folder_config(folder: Path, class_name: str, init: Any, extra: dict | None = None) -> None:
    """config.json for the weights already in `folder` (written last, so a half-written folder is refused)."""
    from . import __version__
    write_json(folder / CONFIG_FILE, {"format": FORMAT, "version": VERSION, "class": class_name, "init": init,
                                      "library_version": __version__,
                                      "weights_sha256": file_sha256(folder / WEIGHTS_FILE), **(extra or {})})


def _init_text(class_name: str, init: Any) -> str:
    return json.dumps({"class": class_name, "init": init}, sort_keys=True)


def upload_folder(folder: Path, repo_id: str, *, private: bool | None = None, token: str | None = None,
                  commit_message: str = "Upload unfoldformer model") -> str:
    """Create (if needed) the Hub model repo `repo_id` and upload `folder` to it; returns the commit URL."""
    from huggingface_hub import HfApi
    api = HfApi(token=token)
    api.create_repo(repo_id, private=private, exist_ok=True, repo_type="model")
    return str(api.upload_folder(repo_id=repo_id, folder_path=str(folder), commit_message=commit_message))


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
        from .config import ModelConfig
        return cls(ModelConfig.from_dict(init["config"]))

    def save_pretrained(self, folder: str | os.PathLike) -> Path:
        """Write `folder`/model.safetensors and `folder`/config.json (each file whole or not at all); returns it."""
        from safetensors.torch import save
        folder = Path(folder)
        folder.mkdir(parents=True, exist_ok=True)
        name, init = type(self).__name__, self._pretrained_init()
        state = {k: v.detach().cpu().contiguous().clone() for k, v in self.state_dict().items()}
        meta = {"format": FORMAT, "description": _init_text(name, init)}
        atomic_write_bytes(folder / WEIGHTS_FILE, save(state, metadata=meta))
        write_folder_config(folder, name, init)
        return folder

    @classmethod
    def from_pretrained(cls, source: str | os.PathLike, *, revision: str | None = None, token: str | None = None,
                        map_location: str | torch.device = "cpu"):
        """The model saved in `source` (a folder, or an `owner/name` Hub repo), checked, in eval mode.
        Called on `PretrainedMixin` itself it returns whatever class the folder holds."""
        folder = resolve_folder(source, revision=revision, token=token)
        info = read_folder_config(folder)
        name = info.get("class")
        target = _CLASSES.get(name)
        if target is None:
            raise PretrainedError(f"{folder}: holds a {name!r}, which is not a model class of unfoldformer "
                                  f"(classes: {', '.join(sorted(_CLASSES))}; trained classifiers: uf.load)")
        if cls is not PretrainedMixin and not issubclass(target, cls):
            raise PretrainedError(f"{folder}: holds a {name}, not a {cls.__name__}; use {name}.from_pretrained")
        from safetensors import safe_open
        try:
            with safe_open(str(folder / WEIGHTS_FILE), framework="pt", device=str(map_location)) as handle:
                meta = handle.metadata() or {}
                state = {key: handle.get_tensor(key).clone() for key in handle.keys()}   # own, aligned memory
        except Exception as exc:  # safetensors' own error types for damaged files
            raise PretrainedError(f"{folder / WEIGHTS_FILE}: not a readable safetensors file ({exc})") from exc
        if meta.get("description") != _init_text(name, info.get("init")):
            raise PretrainedError(f"{folder}: {CONFIG_FILE} and {WEIGHTS_FILE} describe different models "
                                  "(one of them was edited or replaced)")
        model = target._from_pretrained_init(info["init"])
        missing, unexpected = model.load_state_dict(state, strict=False, assign=True)   # saved dtypes kept
        if missing or unexpected:
            raise PretrainedError(f"{folder}: the weights do not fit a {name} (missing {sorted(missing)[:4]}, "
                                  f"unexpected {sorted(unexpected)[:4]})")
        return model.to(map_location).eval()

    def push_to_hub(self, repo_id: str, *, private: bool | None = None, token: str | None = None,
                    commit_message: str = "Upload unfoldformer model") -> str:
        """Save to a temporary folder and upload it to the Hub model repo `repo_id` (created if needed)."""
        with tempfile.TemporaryDirectory() as tmp:
            return upload_folder(self.save_pretrained(tmp), repo_id, private=private, token=token,
                                 commit_message=commit_message)


def from_pretrained(source: str | os.PathLike, **kwargs):
    """Whatever model `source` holds: an encoder or layer (`PretrainedMixin.from_pretrained`), or a trained
    classifier (a `Predictor`, as `uf.load`)."""
    folder = resolve_folder(source, revision=kwargs.pop("revision", None), token=kwargs.pop("token", None))
    if read_folder_config(folder).get("class") == "Predictor":
        from .inference import load
        return load(folder, **kwargs)
    return PretrainedMixin.from_pretrained(folder, **kwargs)



# --- trained classifiers (`Predictor`)
def save_predictor(predictor, folder: str | os.PathLike) -> Path:
    """A trained classifier as a pretrained folder: its run weights file (TrainConfig, checksums, the
    frozen embedding table by sha256 only) as model.safetensors, and config.json."""
    from .train.checkpoint import save_weights
    if predictor.config is None:
        raise PretrainedError("this Predictor has no training config to save (build it with uf.load)")
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    info = getattr(predictor, "info", None) or {}
    meta = {key: info[key] for key in ("run_id", "metrics") if key in info}
    save_weights(folder / WEIGHTS_FILE, predictor.model, predictor.config, meta, sidecar=False)
    write_folder_config(folder, "Predictor", {"train_config": predictor.config.to_dict()})
    return folder


def _pretrained_config(folder: Path) -> dict | None:
    """The folder's config.json if it is a pretrained one (else None: a run folder, say)."""
    try:
        info = json.loads((folder / CONFIG_FILE).read_text())
    except (OSError, ValueError):
        return None
    return info if isinstance(info, dict) and info.get("format") == FORMAT else None


def classifier_source(source: str | os.PathLike) -> Path:
    """What `uf.load` reads for `source`: a weights file or run folder as is; a pretrained folder, a zoo
    model's name or a Hub repo id -> its checked weights file. An empty `source` is refused (Path('') would
    mean the working directory)."""
    from .contracts import check_path_given

    check_path_given("the run folder or weights file", source)
    path = Path(source).expanduser()
    if not path.exists():
        from .zoo import zoo_folder
        zoo = zoo_folder(str(source))
        if zoo is not None:
            path = zoo
        elif _looks_like_repo_id(str(source)):
            path = resolve_folder(source)
        else:
            return path
    if not path.is_dir() or _pretrained_config(path) is None:
        return path
    info = read_folder_config(path)
    if info.get("class") != "Predictor":
        raise PretrainedError(f"{path}: holds a {info.get('class')}, not a trained classifier; open it with "
                              f"unfoldformer.{info.get('class')}.from_pretrained")
    return path / WEIGHTS_FILE
