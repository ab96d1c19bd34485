"""The model folder: what `save_pretrained` writes and `from_pretrained` / `uf.load` read.

A model folder (format "unfoldformer-pretrained", version 2) holds

- `model.safetensors`: the weights (`weights.write_weights_file`: the sha256 of every tensor and of
  its description in its metadata; the description names the class and its constructor, or for a
  trained classifier its `TrainConfig`);
- `config.json`: `format`, `version`, `class`, `init` (the constructor's description: for the
  encoders their `ModelConfig`; for a trained classifier, `Predictor`, its `train_config`) and
  `library_version`;
- `README.md`: the model card (`card.model_card`), Hugging Face style;
- `complete.json`: the manifest (`manifest.py`, as in a run folder), written last, pinning the
  three files above by size and sha256.

On load, the more specific checks run first: config.json readable and ours, the weights' checksums,
the two descriptions equal, then every file the manifest pins. A folder that fails one is refused
(`PretrainedError`, one line naming the file). Folders of version 1 (unfoldformer 0.2.0: no
manifest and no card; config.json pins the weights by `weights_sha256`) are read and checked the
way they were written; a folder of a version this library does not know is refused with a line
saying to upgrade. A run folder (`unfoldformer train`) is the same kind of folder for a classifier
in training: the same weights format and the same manifest, with the run's `config.json`.
"""
from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Any

import torch

from ..errors import CheckpointError, IntegrityError, OutputError, PretrainedError
from ..pretrained import PretrainedMixin, model_class, model_classes
from ..utils import atomic_write_text, file_sha256, state_problem, write_json
from ..version import __version__
from .card import model_card
from .hub import resolve_folder, upload_folder
from .manifest import MANIFEST_NAME, SAVED_COMMAND, folder_manifest, run_folder_kind, verify_manifest
from .weights import read_weights_file, write_weights_file

__all__ = ["CARD_FILE", "CONFIG_FILE", "FORMAT", "VERSION", "WEIGHTS_FILE", "check_model_destination", "check_pinned",
           "load_model", "pretrained_config", "push_model", "read_folder_config", "save_model", "save_pretrained",
           "write_model_folder"]

FORMAT, VERSION = "unfoldformer-pretrained", 2
READABLE_VERSIONS = (1, 2)
CONFIG_FILE, WEIGHTS_FILE, CARD_FILE = "config.json", "model.safetensors", "README.md"


def pretrained_config(folder: Path) -> dict | None:
    """The folder's config.json if it is a model folder's (else None: a run folder, say); unchecked."""
    try:
        info = json.loads((Path(folder) / CONFIG_FILE).read_text())
    except (OSError, ValueError):
        return None
    return info if isinstance(info, dict) and info.get("format") == FORMAT else None


def read_folder_config(folder: Path) -> dict:
    """The folder's config.json, checked: our format, a version this library reads, the weights present (and,
    version 1, matching the sha256 config.json pins). The manifest of version 2 is checked by `check_pinned`."""
    config_path = folder / CONFIG_FILE
    try:
        info = json.loads(config_path.read_text())
    except FileNotFoundError:
        raise PretrainedError(f"{folder}: no {CONFIG_FILE}: not a pretrained folder") from None
    except (OSError, ValueError) as exc:
        raise PretrainedError(f"{config_path}: not readable JSON ({exc})") from None
    if not isinstance(info, dict) or info.get("format") != FORMAT:
        raise PretrainedError(f"{config_path}: not an unfoldformer pretrained config (no format '{FORMAT}')")
    if info.get("version") not in READABLE_VERSIONS:
        raise PretrainedError(f"{config_path}: version {info.get('version')!r} is not one unfoldformer {__version__} "
                              f"reads {READABLE_VERSIONS} (a newer release wrote it?); upgrade: pip install -U "
                              "unfoldformer")
    weights = folder / WEIGHTS_FILE
    if not weights.is_file():
        raise PretrainedError(f"{folder}: no {WEIGHTS_FILE}")
    if info["version"] == 1 and file_sha256(weights) != info.get("weights_sha256"):
        raise PretrainedError(f"{weights}: corrupt: its sha256 differs from the one in {CONFIG_FILE}; "
                              "the folder changed after it was written, so fetch or save it again")
    return info


def check_pinned(folder: Path, info: dict) -> None:
    """Every file the manifest of a version-2 folder pins, as it was saved (version 1 has no manifest)."""
    if info.get("version") == 1:
        return
    try:
        manifest = verify_manifest(folder)
    except IntegrityError as exc:
        raise PretrainedError(str(exc)) from None
    if manifest is None:
        raise PretrainedError(f"{folder}: no {MANIFEST_NAME}: the folder was not saved whole (or the manifest "
                              "was removed), so its files cannot be checked; save it again")
    unpinned = sorted({CONFIG_FILE, WEIGHTS_FILE} - set(manifest["files"]))
    if unpinned:
        raise PretrainedError(f"{folder / MANIFEST_NAME}: does not pin {', '.join(unpinned)}; save the folder again")


def _description(class_name: str, init: Any) -> str:
    return json.dumps({"class": class_name, "init": init}, sort_keys=True)


def write_model_folder(folder: Path, class_name: str, init: Any, state: dict[str, torch.Tensor], weights_info: dict,
                       *, card_extra: dict | None = None, card_text: str | None = None) -> Path:
    """Write a model folder: weights (with `weights_info`), config.json, README.md, then complete.json. The old
    manifest goes first, so a folder whose writing stopped midway has none and is refused on load."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / MANIFEST_NAME).unlink(missing_ok=True)
    write_weights_file(folder / WEIGHTS_FILE, state, weights_info)
    write_json(folder / CONFIG_FILE, {"format": FORMAT, "version": VERSION, "class": class_name, "init": init,
                                      "library_version": __version__})
    card = card_text if card_text is not None else model_card(class_name, init, folder.name, card_extra)
    atomic_write_text(folder / CARD_FILE, card)
    write_json(folder / MANIFEST_NAME, folder_manifest(folder, SAVED_COMMAND, (card_extra or {}).get("run_id"),
                                                       {"class": class_name, "init": init},
                                                       names=[WEIGHTS_FILE, CONFIG_FILE, CARD_FILE]))
    return folder


def save_model(model: PretrainedMixin, folder: Path) -> Path:
    """`model.save_pretrained(folder)`: its state dict and its constructor's description; the card is the
    model's own `_model_card()` where it has one, else the generic card."""
    name, init = type(model).__name__, model._pretrained_init()
    state = {k: v.detach().cpu().contiguous().clone() for k, v in model.state_dict().items()}
    own_card = getattr(model, "_model_card", None)
    return write_model_folder(folder, name, init, state, {"class": name, "init": init},
                              card_text=own_card() if own_card is not None else None)


def check_model_destination(folder: str | os.PathLike) -> Path:
    """`folder` as a place for a model folder: refused (`OutputError`, one line) when it is a run's folder
    (`manifest.run_folder_kind`: a training, language-model or distillation run, or another command's
    output), whose files are that run's and whose manifest would no longer pin them; the folder the model
    was loaded from is refused on the same ground when it is a run. A model folder may be saved again."""
    folder = Path(folder)
    kind = run_folder_kind(folder)
    if kind is not None:
        raise OutputError(f"save_pretrained {folder}: is {kind}; a model folder goes beside a run, not into it "
                          "(its files are the run's): choose a new folder")
    return folder


def save_pretrained(model: PretrainedMixin, folder: str | os.PathLike) -> Path:
    """`model.save_pretrained(folder)`: `save_model` into `folder` once `check_model_destination` accepts it.
    The applications that keep a model inside their own run folder (`lm train`) call `save_model` directly."""
    return save_model(model, check_model_destination(folder))


def _read_weights(folder: Path, info: dict, map_location: str) -> dict[str, torch.Tensor]:
    """The folder's tensors, checked against their checksums (version 2) and against config.json's description."""
    name, path = info.get("class"), folder / WEIGHTS_FILE
    if info["version"] == 1:
        return _read_version_1_weights(folder, info, map_location)
    try:
        state, described = read_weights_file(path, device=str(map_location))
    except CheckpointError as exc:
        raise PretrainedError(str(exc)) from None
    if _description(described.get("class"), described.get("init")) != _description(name, info.get("init")):
        raise PretrainedError(f"{folder}: {CONFIG_FILE} and {WEIGHTS_FILE} describe different models "
                              "(one of them was edited or replaced)")
    return state


def _read_version_1_weights(folder: Path, info: dict, map_location: str) -> dict[str, torch.Tensor]:
    """Weights of a version-1 folder (unfoldformer 0.2.0): the description in the safetensors metadata."""
    from safetensors import safe_open
    try:
        with safe_open(str(folder / WEIGHTS_FILE), framework="pt", device=str(map_location)) as handle:
            meta = handle.metadata() or {}
            state = {key: handle.get_tensor(key).clone() for key in handle.keys()}   # own, aligned memory
    except Exception as exc:  # safetensors' own error types for damaged files
        raise PretrainedError(f"{folder / WEIGHTS_FILE}: not a readable safetensors file ({exc})") from exc
    if meta.get("description") != _description(info.get("class"), info.get("init")):
        raise PretrainedError(f"{folder}: {CONFIG_FILE} and {WEIGHTS_FILE} describe different models "
                              "(one of them was edited or replaced)")
    return state


def load_model(cls: type, source: str | os.PathLike, *, revision: str | None = None, token: str | None = None,
               map_location: str | torch.device = "cpu"):
    """`cls.from_pretrained(source)`: the model a folder (or Hub repo) holds, checked, in eval mode."""
    folder = resolve_folder(source, revision=revision, token=token)
    info = read_folder_config(folder)
    name = info.get("class")
    target = model_class(name)
    if target is None:
        raise PretrainedError(f"{folder}: holds a {name!r}, which is not a model class of unfoldformer "
                              f"(classes: {', '.join(model_classes())}; trained classifiers: uf.load)")
    if cls is not PretrainedMixin and not issubclass(target, cls):
        raise PretrainedError(f"{folder}: holds a {name}, not a {cls.__name__}; use {name}.from_pretrained")
    state = _read_weights(folder, info, map_location)
    check_pinned(folder, info)
    model = target._from_pretrained_init(info["init"])
    problem = state_problem(model, state)
    if problem is not None:
        raise PretrainedError(f"{folder / WEIGHTS_FILE}: {problem}; the weights do not fit a {name}")
    missing, unexpected = model.load_state_dict(state, strict=False, assign=True)   # saved dtypes kept
    if missing or unexpected:
        raise PretrainedError(f"{folder}: the weights do not fit a {name} (missing {sorted(missing)[:4]}, "
                              f"unexpected {sorted(unexpected)[:4]})")
    if getattr(target, "widen_on_load", False):           # stored in float16 to save space, computes in float32
        model = model.float()
    return model.to(map_location).eval()


def push_model(model: Any, repo_id: str, *, private: bool | None = None, token: str | None = None,
               commit_message: str = "Upload unfoldformer model") -> str:
    """Save `model` (anything with `save_pretrained`) to a temporary folder and upload it to `repo_id`."""
    with tempfile.TemporaryDirectory() as tmp:
        return upload_folder(model.save_pretrained(Path(tmp) / repo_id.split("/")[-1]), repo_id, private=private,
                             token=token, commit_message=commit_message)
