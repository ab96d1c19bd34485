"""Small shared utilities: durable atomic writes, file digests, JSON conversion, CPU thread limits.

- `atomic_write_bytes` / `atomic_write_text` / `write_json`: a temporary file in the target's
  folder, fsync, `os.replace`, fsync of the folder, so a killed process leaves the old file or the
  new one, never half of one. Used for everything the package writes.
- `jsonable`: numpy scalars/arrays, tuples and paths to plain JSON types (NaN/inf -> null).
- `torch_threads`: run torch and the BLAS of numpy/scipy on n threads for a while. On small
  kernels and shared cores one thread is often fastest (measured: a 384×384 `eigh` took 5.7 s on
  2 threads of a loaded machine and 30 ms on one).
"""
from __future__ import annotations

import hashlib
import json
import math
import os
import platform
import tempfile
from contextlib import contextmanager
from pathlib import Path, PurePath
from typing import Any

import numpy as np

__all__ = ["atomic_write_bytes", "atomic_write_text", "environment", "file_sha256", "jsonable", "refusal_text",
           "state_problem", "torch_threads", "write_json"]


def atomic_write_bytes(path: str | Path, data: bytes) -> None:
    """Write `data` to a temporary file in the same folder, fsync it, then `os.replace` it into place."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        os.chmod(tmp, 0o644 & ~current_umask())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    fsync_folder(path.parent)                                    # make the rename itself durable


def fsync_folder(folder: Path) -> None:
    try:
        dir_fd = os.open(folder, os.O_RDONLY)
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)
    except OSError:
        pass


def current_umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def atomic_write_text(path: str | Path, text: str) -> None:
    atomic_write_bytes(path, text.encode("utf-8"))


def jsonable(obj: Any) -> Any:
    """Numpy scalars/arrays, tuples and paths -> plain JSON types, NaN/inf -> None (strict JSON), recursively."""
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
    if isinstance(obj, PurePath):
        return str(obj)
    return obj


def write_json(path: str | Path, obj: Any, *, indent: int = 2, sort_keys: bool = False) -> None:
    """Atomically write `jsonable(obj)` as strict JSON (a trailing newline)."""
    text = json.dumps(jsonable(obj), indent=indent, sort_keys=sort_keys, allow_nan=False)
    atomic_write_text(path, text + "\n")


@contextmanager
def torch_threads(n: int | None):
    """Temporarily run torch and the BLAS of numpy/scipy on `n` CPU threads (None: unchanged)."""
    import torch
    from threadpoolctl import threadpool_limits

    if n is None:
        yield
        return
    before = torch.get_num_threads()
    torch.set_num_threads(max(1, int(n)))
    try:
        with threadpool_limits(max(1, int(n))):
            yield
    finally:
        torch.set_num_threads(before)


def environment() -> dict:
    """Machine and library versions, for reports."""
    import torch
    return {"python": platform.python_version(), "torch": torch.__version__, "platform": platform.platform(),
            "processor": platform.processor() or platform.machine(), "cpu_count": os.cpu_count(),
            "cuda": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
            "omp_wait_policy": os.environ.get("OMP_WAIT_POLICY"), "torch_threads": torch.get_num_threads()}



def file_sha256(path: str | Path) -> str:
    """Hex sha256 of a file, read in 1 MiB chunks."""
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for chunk in iter(lambda: handle.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def state_problem(module, state: dict) -> str | None:
    """What makes saved tensors `state` unfit to load into `module`, in one line naming the tensor: a shape
    other than the module's own (torch's own error spans many lines), or a NaN/inf entry; None if fit."""
    import torch
    own = module.state_dict()
    for key, tensor in state.items():
        if key in own and tuple(own[key].shape) != tuple(tensor.shape):
            return f"tensor {key!r} has shape {tuple(tensor.shape)}, the model's {tuple(own[key].shape)}"
        if tensor.is_floating_point() and not bool(torch.isfinite(tensor).all()):
            bad = int((~torch.isfinite(tensor)).sum())
            return f"tensor {key!r} holds {bad} non-finite value(s) (NaN or inf)"
    return None


def refusal_text(exc: BaseException) -> str:
    """One line for a `torch.load(..., weights_only=True)` failure. A file that needs more than tensors
    (a pickle of Python objects) is named as such: torch's own text advises `weights_only=False`, which
    would run the file's code, so it is not repeated."""
    import pickle
    text = str(exc)
    if isinstance(exc, pickle.UnpicklingError) or "weights_only" in text or "Weights only" in text:
        return "it holds Python objects beyond tensors, which could run code when loaded; such files are refused"
    return f"truncated or corrupt? {text.splitlines()[0] if text.strip() else type(exc).__name__}"
