"""Where a model folder comes from and goes to: a local folder, or a Hugging Face Hub model repo.

`resolve_folder` gives a local folder as is and downloads an `owner/name` repo id (or finds it in the
local cache: `HF_HUB_OFFLINE=1` looks there only) with `huggingface_hub.snapshot_download`;
`upload_folder` creates a repo and uploads a folder to it. The folder is checked by whoever reads it.
"""
from __future__ import annotations

import os
from pathlib import Path

from ..errors import PretrainedError
from ..zoo import encoder_folder

__all__ = ["looks_like_repo_id", "resolve_folder", "upload_folder"]

#: The files a model folder may hold (what a download fetches).
FOLDER_FILES = ["config.json", "model.safetensors", "complete.json", "card.json", "*.md"]


def looks_like_repo_id(name: str) -> bool:
    """Whether `name` reads as a Hub repo id `owner/name` (and not as a local path)."""
    if name.startswith((".", "/", "~")) or os.sep in name.replace("/", "", 1) or name.count("/") != 1:
        return False
    from huggingface_hub.utils import validate_repo_id
    try:
        validate_repo_id(name)
    except Exception:  # HFValidationError
        return False
    return True


def resolve_folder(source: str | os.PathLike, *, revision: str | None = None, token: str | None = None) -> Path:
    """A local folder as is; the name of a zoo encoder (`zoo.encoder_names()`, offline) its folder; an
    `owner/name` repo id downloaded (or found in the cache) by `huggingface_hub`."""
    path = Path(source).expanduser()
    if path.is_dir():
        return path
    name = str(source)
    zoo = encoder_folder(name)
    if zoo is not None:
        return zoo
    if path.exists() or not looks_like_repo_id(name):
        raise PretrainedError(f"{source}: no such folder (and not a Hub repo id 'owner/name')")
    from huggingface_hub import snapshot_download
    try:
        local = snapshot_download(name, revision=revision, token=token, library_name="unfoldformer",
                                  allow_patterns=FOLDER_FILES)
    except Exception as exc:  # offline, not found, gated, network: huggingface_hub's own error types
        detail = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise PretrainedError(f"{name}: no such local folder or file, and no Hub repo of that name could be fetched "
                              f"({type(exc).__name__}: {detail})") from exc
    return Path(local)


def upload_folder(folder: Path, repo_id: str, *, private: bool | None = None, token: str | None = None,
                  commit_message: str = "Upload unfoldformer model") -> str:
    """Create (if needed) the Hub model repo `repo_id` and upload `folder` to it; returns the commit URL."""
    from huggingface_hub import HfApi
    api = HfApi(token=token)
    api.create_repo(repo_id, private=private, exist_ok=True, repo_type="model")
    return str(api.upload_folder(repo_id=repo_id, folder_path=str(folder), commit_message=commit_message))
