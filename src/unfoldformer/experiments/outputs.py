"""Shared helpers for the files the experiments write."""
from __future__ import annotations

import math

import numpy as np


def jsonable(obj):
    """Numpy scalars/arrays and tuples -> plain JSON types, NaN/inf -> None (strict JSON), recursively."""
    if isinstance(obj, dict):
        return {str(k): jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [jsonable(v) for v in obj]
    if isinstance(obj, np.ndarray):
        return jsonable(obj.tolist())
    if isinstance(obj, (float, np.floating)):
        return float(obj) if math.isfinite(obj) else None
    if isinstance(obj, np.generic):
        return obj.item()
    return obj
