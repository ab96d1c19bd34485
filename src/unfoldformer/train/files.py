"""Helpers shared by the training package: atomic writes (from `unfoldformer.atomic`) and JSON bytes."""
from __future__ import annotations

import json
from typing import Any

from ..atomic import atomic_write_bytes

__all__ = ["atomic_write_bytes"]


def _json_bytes(obj: Any) -> bytes:
    return (json.dumps(obj, indent=2) + "\n").encode("utf-8")
