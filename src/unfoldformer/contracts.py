"""Contracts shared by the configs, the public functions and the commands: one checker, one message.

- `check_step(name, value, kind, rho=None, certified=True)`: a step size (attention α, anchored α,
  F1 η, F2 α) finite and > 0, and, when `certified`, inside the range its theorem certifies
  (`CERTIFIED_STEPS`, THEORY §3.1/§3.3/§3.4). `ModelConfig` and the step functions both call it,
  so a value refused by one is refused by the other with the same message.
- `check_positive(name, value)`: a finite number > 0 (λ, τ, c); `check_in_range`: finite, in (low, high].
- `check_seed(name, seed)`: an integer in [0, 2³² − 1] (what numpy and torch accept).
- `check_path_given(name, path)`: a path option that is not the empty string (`Path("")` is the
  working directory, so an empty path would silently mean "here").
- `check_at_least`, `check_device` / `resolve_device`, `check_output_location`: settings checked
  before any data is read, each error naming the setting (an output location by creating and
  removing a probe file). The commands, the training config and `uf.load` share them.
- `check_output_apart`: no output lands on an input: a path a command writes, replaces or deletes is
  never one of its inputs, never holds one, and never lies in a folder whose every file is an input
  (a run folder, a model folder); refused before any work, naming both.
- `NonFiniteResultError` and `first_non_finite` / `require_finite`: a NaN or ±inf loss, probability
  or energy is refused, naming the sample and the quantity, never reported as a result.
"""
from __future__ import annotations

import math
import os
import tempfile
from collections.abc import Iterator
from numbers import Real
from pathlib import Path
from typing import Any

import numpy as np

from .errors import ConfigError, OutputError, UnfoldformerError

__all__ = ["CERTIFIED_STEPS", "NonFiniteResultError", "certified_step_range", "check_at_least", "check_device",
           "check_in_range", "check_output_apart", "check_output_location", "check_path_given", "check_positive",
           "check_seed", "check_step", "first_non_finite", "first_non_finite_row", "require_finite",
           "resolve_device"]

SEED_MAX = 2**32 - 1

#: kind -> (upper bound, whether it is included, what certifies it). Lower bound 0, excluded.
CERTIFIED_STEPS = {
    "anchored": (1.0, True, "anchored attention (THEORY §3.3)"),
    "joint": (1.0, True, "the joint layer (THEORY §3.7)"),
    "metric": (1.0, True, "Theorem A"),                 # (0, 2) for a PSD kernel: `certified_step_range`
    "tied": (2.0, False, "the tied FFN (THEORY §3.4, F2)"),
    "symmetric": (1.0, True, "the symmetric FFN with spec(W_F) ⊂ (−1, 1) (THEORY §3.4, F1)"),
}


class NonFiniteResultError(UnfoldformerError, ArithmeticError):
    """A result (loss, probability, energy) that is NaN or infinite: refused rather than reported."""


def _number(name: str, value: Any) -> float:
    if isinstance(value, bool) or isinstance(value, (str, bytes)) or not hasattr(value, "__float__"):
        raise ConfigError(f"{name} must be a number, got {value!r} ({type(value).__name__})")
    try:                                            # a float, an int, a 0-d tensor or a numpy scalar
        return float(value)
    except (TypeError, ValueError, RuntimeError):
        raise ConfigError(f"{name} must be a single number, got {type(value).__name__} of several") from None


def check_positive(name: str, value: Any) -> float:
    """ConfigError unless `value` is a finite number > 0; returns it as a float."""
    v = _number(name, value)
    if not (math.isfinite(v) and v > 0):
        raise ConfigError(f"{name} must be a finite number > 0, got {v}")
    return v


def check_in_range(name: str, value: Any, low: float, high: float, *, high_closed: bool = True) -> float:
    """ConfigError unless `value` is finite and low < value <= high (< high when not `high_closed`)."""
    v = _number(name, value)
    inside = math.isfinite(v) and low < v and (v <= high if high_closed else v < high)
    if not inside:
        raise ConfigError(f"{name} must lie in ({low:g}, {high:g}{']' if high_closed else ')'}, got {v}")
    return v


def certified_step_range(kind: str, psd_kernel: bool = False) -> tuple[float, bool, str]:
    """(upper bound, included, what certifies it) of the step size of `kind`; the lower bound is 0, open."""
    high, closed, source = CERTIFIED_STEPS[kind]
    if kind == "metric" and psd_kernel:
        return 2.0, False, source
    return high, closed, source


def check_step(name: str, value: Any, kind: str, rho=None, *, certified: bool = True) -> float:
    """A step size of `kind` (anchored | metric | tied | symmetric): always a finite number > 0; with
    `certified`, inside the range its theorem certifies (ConfigError naming `name`, the range and the
    theorem; the message `ModelConfig` gives for the same value). `rho` (a `Rho`, metric attention only)
    widens the metric range to (0, 2) for a PSD kernel. Returns the value as a float, or a learned step size
    (a 0-dim tensor, checked by its value) as the tensor itself, so that gradients reach it."""
    if hasattr(value, "detach") and value.dim() == 0 and value.is_floating_point():     # a torch tensor
        check_step(name, float(value.detach()), kind, rho, certified=certified)
        return value
    v = check_positive(name, value)
    if not certified:
        return v
    psd = bool(getattr(rho, "psd_kernel", False))
    high, closed, source = certified_step_range(kind, psd)
    if v > high or (v == high and not closed):
        rng = f"(0, {high:g}{']' if closed else ')'}"
        if kind == "metric":
            rng += " for a PSD kernel" if psd else ""
            source = f"{source} (rho={getattr(rho, 'name', rho)}, THEORY §3.1)"
        raise ConfigError(f"{name}={v:g} is outside the certified range {rng} of {source}; pass "
                          "certified=False to study it")
    return v


def check_seed(name: str, seed: Any) -> int:
    """ConfigError unless `seed` is an integer in [0, 2³² − 1] (what numpy and torch accept)."""
    if isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed <= SEED_MAX:
        raise ConfigError(f"{name} must be an integer in [0, 2**32 - 1], got {seed!r}")
    return seed


def check_path_given(name: str, path: Any) -> None:
    """ConfigError for an empty (or all-blank) path: `Path('')` would silently mean the working directory."""
    if path is not None and not str(path).strip():
        raise ConfigError(f"{name} is empty; give a path (an empty path would mean the working directory)")


# ----------------------------------------------------------------------------- non-finite results
def _walk(obj: Any, path: str) -> Iterator[tuple[str, float]]:
    if isinstance(obj, dict):
        for key, value in obj.items():
            yield from _walk(value, f"{path}.{key}" if path else str(key))
    elif isinstance(obj, (list, tuple)):
        for i, value in enumerate(obj):
            yield from _walk(value, f"{path}[{i}]")
    elif hasattr(obj, "tolist") and not isinstance(obj, (str, bytes)):    # tensors, numpy arrays and scalars
        yield from _walk(obj.tolist(), path)
    elif isinstance(obj, Real) and not isinstance(obj, bool):
        yield path, float(obj)


def first_non_finite(obj: Any, path: str = "") -> tuple[str, float] | None:
    """(key path, value) of the first NaN or ±inf number in a nested result (dicts, lists, tensors), else None."""
    return next(((p, v) for p, v in _walk(obj, path) if not math.isfinite(v)), None)


def first_non_finite_row(named: dict[str, Any]) -> tuple[int, str, str, float] | None:
    """(row, name, entry, value) of the first row (dim 0) holding a NaN/inf in the first tensor of `named`
    (name -> (B, ...) tensor or None) that has one; None when all are finite. The callers name the row."""
    import torch

    for name, values in named.items():
        if values is None or bool(torch.isfinite(values).all()):
            continue
        row = int((~torch.isfinite(values)).flatten(1).any(1).nonzero()[0])
        where, value = first_non_finite(values[row])
        return row, name, where, value
    return None


def require_finite(obj: Any, what: str, *, skip: tuple[str, ...] = ()) -> None:
    """NonFiniteResultError naming `what` and the key path of the first NaN/inf number in `obj`;
    keys in `skip` (top-level) are not looked at (values that are infinite by definition)."""
    if isinstance(obj, dict) and skip:
        obj = {k: v for k, v in obj.items() if k not in skip}
    bad = first_non_finite(obj)
    if bad is not None:
        raise NonFiniteResultError(f"{what}: {bad[0] or 'the result'} is {bad[1]}; a non-finite result is not "
                                   "reported (the weights or inputs give no finite value)")


# ----------------------------------------------------------------------------- settings checked before work
def check_at_least(name: str, value, low: int = 1, *, optional: bool = False) -> None:
    """ConfigError unless `value` is an integer >= `low` (or None when `optional`), naming the setting."""
    if value is None and optional:
        return
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < low:
        allowed = f"an integer >= {low}" + (" (or unset)" if optional else "")
        raise ConfigError(f"{name} must be {allowed}, got {value!r}")


def resolve_device(device: str) -> str:
    """`auto` -> cuda if torch sees a CUDA device, else mps if available, else cpu; other names unchanged."""
    import torch
    if device != "auto":
        return device
    if torch.cuda.is_available():
        return "cuda"
    mps = getattr(torch.backends, "mps", None)
    return "mps" if mps is not None and mps.is_available() else "cpu"


def check_device(name: str, device: str) -> None:
    """ConfigError unless `device` is `auto` or names a device torch can use here (cpu, cuda, cuda:N, mps)."""
    import torch
    if device == "auto":
        return
    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError):
        raise ConfigError(f"{name}={device!r} is not a device name; use auto, cpu, cuda (cuda:N) or mps") from None
    if dev.type == "cuda":
        count = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if count == 0:
            raise ConfigError(f"{name}={device!r}, but this torch build sees no CUDA device "
                              f"(torch {torch.__version__}); use cpu")
        if dev.index is not None and dev.index >= count:
            raise ConfigError(f"{name}={device!r}, but only {count} CUDA device(s) are visible")
    elif dev.type == "mps" and not torch.backends.mps.is_available():
        raise ConfigError(f"{name}={device!r}, but MPS is not available here; use cpu")
    elif dev.type not in ("cpu", "cuda", "mps"):
        raise ConfigError(f"{name}={device!r} is not supported; use auto, cpu, cuda (cuda:N) or mps")


def check_output_location(name: str, path: str | Path, *, folder: bool = True) -> Path:
    """Check that `path` (a folder, or a file when `folder` is False) can be written, before any work.

    Walks up to the nearest existing folder and creates and removes a small probe file there, so a
    read-only, full or missing location fails now, naming the setting, rather than after the work.
    Creates nothing that stays. Returns the absolute path (symbolic links and `..` resolved).
    An empty path is refused (it would mean the working directory)."""
    check_path_given(name, path)
    given = Path(path).expanduser()
    try:
        path = given.resolve()
    except (RuntimeError, OSError):                            # a symbolic-link loop (Python < 3.13: RuntimeError)
        raise OutputError(f"{name} {given}: a symbolic link that loops; give a real folder") from None
    if given.is_symlink() and not given.exists():
        raise OutputError(f"{name} {given}: a symbolic link to {os.readlink(given)}, which does not exist; "
                          "give a real folder") from None
    if path.exists() and folder and not path.is_dir():
        raise OutputError(f"{name} {path}: exists and is a file, not a folder")
    if path.exists() and not folder and path.is_dir():
        raise OutputError(f"{name} {path}: is a folder; give a file name")
    base = path if folder else path.parent
    while not base.exists():
        base = base.parent
    if not base.is_dir():
        raise OutputError(f"{name} {path}: {base} is a file, so no folder can be made under it")
    try:
        fd, probe = tempfile.mkstemp(dir=base, prefix=".unfoldformer-probe-")
        try:
            os.write(fd, b"probe")
            os.fsync(fd)
        finally:
            os.close(fd)
            os.unlink(probe)
    except OSError as exc:
        raise OutputError(f"{name} {path}: cannot write in {base} ({exc.strerror or exc})") from None
    return path


def _resolved(path: str | Path) -> Path:
    return Path(path).expanduser().resolve()


def check_output_apart(name: str, targets, inputs: dict[str, Any], *, whole: dict[str, Any] | None = None,
                       replaced: bool = False) -> None:
    """Refuse outputs that would land on inputs, before any work (`OutputError`, one line naming both).

    `targets`: the paths the command writes, or deletes (a path or several); `inputs`: label -> a file or
    folder it reads (None: not given); `whole`: label -> folders every file of which is an input (a run
    folder, a model folder). A target may not be an input, nor hold one (a folder it replaces or clears:
    `replaced`, or any target that is an existing folder), nor lie in a `whole` folder."""
    targets = [targets] if isinstance(targets, (str, os.PathLike)) else list(targets)
    read = [(label, _resolved(path)) for label, path in inputs.items() if path is not None]
    kept = [(label, _resolved(path)) for label, path in (whole or {}).items() if path is not None]
    for given in targets:
        target = _resolved(given)
        holds = replaced or target.is_dir()
        for label, path in read + kept:
            if target == path:
                raise OutputError(f"{name} {given}: is the {label} itself; write the output elsewhere (a command "
                                  "never writes over its inputs)")
            if holds and path.is_relative_to(target):
                raise OutputError(f"{name} {given}: holds the {label} {path}, which the command would replace or "
                                  "delete; write the output elsewhere")
        for label, folder in kept:
            if target.is_relative_to(folder):
                raise OutputError(f"{name} {given}: lies in the {label} {folder}; write the output elsewhere (every "
                                  "file there is an input)")
