"""Shared pytest fixtures."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parent.parent

# Tests never reach a model hub and never open a window.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("MPLBACKEND", "Agg")


@pytest.fixture(scope="session")
def data_dir() -> Path:
    """Folder with the real data files: ``$UNFOLDFORMER_DATA`` or ``<repo>/../shared/data``
    (a relative path is taken relative to the repository root); skips if absent."""
    folder = Path(os.environ.get("UNFOLDFORMER_DATA", str(REPO_ROOT.parent / "shared" / "data")))
    if not folder.is_absolute():
        folder = REPO_ROOT / folder
    folder = folder.resolve()
    if not folder.is_dir():
        pytest.skip(f"data folder {folder} not found (set UNFOLDFORMER_DATA)")
    return folder
