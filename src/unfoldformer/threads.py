"""Threads sized to the cores actually free (issue 38; docs/results/speed.md, "Threads").

On a machine whose cores are shared with another process, PyTorch's parallel regions split their work
evenly over `torch.get_num_threads()` threads and end at a barrier: a thread that shares its core with the
other process runs at half speed and every region waits for it, and OpenMP's spinning workers (the
default wait policy, fixed once torch is imported) take cycles from the thread that has work. Measured on
2 cores beside one busy single-thread process, torch imported first: the padded-batch energy took 0.95 s at
2 threads against 0.75 s at 1, and `nn.TransformerEncoder` itself lost 6–53 % in 7 of 8 cells.

The library's forwards and energy functions run inside `free_core_threads()`. It samples `/proc/stat` (the
busy time of the CPUs this process may run on) and `/proc/self/stat` (this process's own CPU time) at most
every `INTERVAL` seconds, lowers torch's intra-op thread count for the call to

    min(current, max(1, round(allowed CPUs − cores busy with other processes)))

and restores the count it found when the call returns: the caller's count is the ceiling, and it is never
changed outside the library's calls. A backward pass through a model's output runs at the count its forward
ran at (`hold_for_backward`), and the caller's count is restored when that pass ends; the optimiser step runs
at the caller's count, unless the caller runs the whole step inside `free_core_threads()` as the library's own
training loops do (`train/loop.py`, `lm/train.py`, `distill/loop.py`): beside a busy process the loss and the
optimiser's parallel regions then stop waiting for the shared core too. Idle, nothing changes. No `/proc` (not
Linux), or `UNFOLDFORMER_THREADS=fixed` in the environment, or `set_policy("fixed")`: the count is left alone.
Cost: two small file reads per `INTERVAL`; two calls to `torch.set_num_threads` per lowered call.
"""
from __future__ import annotations

import os
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

import torch

__all__ = ["free_core_threads", "free_cores", "hold_for_backward", "set_policy"]

#: Seconds between two samples of the CPU counters (the load is averaged over this window at least).
INTERVAL = 0.25
#: The first window (from the sample taken at import) may be this short, so a script's first forwards adapt.
FIRST_WINDOW = 0.05
_POLICIES = ("free-cores", "fixed")
_clock = time.monotonic


class _State:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.policy = "fixed" if os.environ.get("UNFOLDFORMER_THREADS", "").strip() == "fixed" else "free-cores"
        self.sample: tuple[float, int, int, int] | None = None   # (time, busy ticks, total ticks, own ticks)
        self.free: float | None = None
        self.pending: int | None = None    # the caller's count a backward pass lowered and has not restored yet


_STATE = _State()


def set_policy(name: str) -> None:
    """`"free-cores"` (default): the library's calls run at the free cores' thread count (`free_core_threads`);
    `"fixed"`: at the count torch has."""
    if name not in _POLICIES:
        raise ValueError(f"unknown thread policy {name!r}; valid: {', '.join(_POLICIES)}")
    with _STATE.lock:
        _STATE.policy = name


def _cpus() -> set[int]:
    try:
        return os.sched_getaffinity(0)
    except (AttributeError, OSError):
        return set(range(os.cpu_count() or 1))


def _counters() -> tuple[float, int, int, int] | None:
    """(time, busy ticks and total ticks of the allowed CPUs, this process's user + system ticks), or None."""
    try:
        with open("/proc/stat", "rb") as f:
            lines = f.read().split(b"\n")
        with open("/proc/self/stat", "rb") as f:
            own = f.read().rsplit(b")", 1)[1].split()              # after the command name (may hold spaces)
    except OSError:
        return None
    allowed = _cpus()
    busy = total = 0
    for line in lines:
        if not line.startswith(b"cpu") or line.startswith(b"cpu "):
            continue
        fields = line.split()
        try:
            if int(fields[0][3:]) not in allowed:
                continue
            ticks = [int(v) for v in fields[1:9]]                   # user nice system idle iowait irq softirq steal
        except ValueError:
            continue
        idle = ticks[3] + ticks[4]
        busy += sum(ticks) - idle
        total += sum(ticks)
    if total == 0:
        return None
    return _clock(), busy, total, int(own[11]) + int(own[12])   # utime, stime (fields 14, 15)


def free_cores() -> float | None:
    """Allowed CPUs minus the cores other processes kept busy since the previous sample (≥ `INTERVAL` ago; the
    first window ≥ `FIRST_WINDOW`), or None before two samples (or without /proc)."""
    now = _clock()
    with _STATE.lock:
        last = _STATE.sample
        if last is not None and now - last[0] < (INTERVAL if _STATE.free is not None else FIRST_WINDOW):
            return _STATE.free
        sample = _counters()
        if sample is None:
            return None
        _STATE.sample = sample
        if last is None or sample[2] <= last[2]:
            return _STATE.free
        cpus = len(_cpus())
        per_cpu = (sample[2] - last[2]) / cpus                      # ticks per CPU in the window
        others = max(0.0, (sample[1] - last[1]) - (sample[3] - last[3])) / per_cpu   # cores busy with others
        _STATE.free = max(0.0, cpus - others)
        return _STATE.free


@contextmanager
def free_core_threads() -> Iterator[int]:
    """Run the body with torch's intra-op thread count lowered to the free cores (module doc), and restore the
    count it found on exit: the caller's setting is the ceiling and is never changed outside the body, so a
    count set by the user (or by a test) is never raised. Yields the count in effect. Nested uses change
    nothing (the inner one finds the lowered count)."""
    _restore_after_failed_backward()
    current = torch.get_num_threads()
    if _STATE.policy == "fixed" or torch.compiler.is_compiling():   # a compiled graph: no file reads inside
        yield current
        return
    free = free_cores()
    target = current if free is None else max(1, min(current, int(free + 0.5)))
    if target == current:
        yield current
        return
    torch.set_num_threads(target)
    try:
        yield target
    finally:
        torch.set_num_threads(current)


def hold_for_backward(outputs, count: int) -> None:
    """Run the backward pass through `outputs` (tensors; others are skipped) at `count` threads, the count the
    forward ran at (`free_core_threads`), and give the caller's count back when that backward pass ends: a hook on
    each output lowers the count when the output's gradient arrives and queues the restoring call at the end of
    the pass (the autograd engine's callback queue), so the caller's count is never changed outside it. Nothing
    happens where `count` is not below the count at that time (idle, `fixed` policy, a nested call). A backward
    pass that raises skips the queued call; the next library call (`free_core_threads`) then restores the count."""
    for out in outputs:
        if isinstance(out, torch.Tensor) and out.requires_grad:
            out.register_hook(_lower_for_backward(count))


def _lower_for_backward(count: int):
    def hook(grad):
        caller = torch.get_num_threads()
        if count < caller:
            torch.set_num_threads(count)
            _STATE.pending = caller
            torch.autograd.Variable._execution_engine.queue_callback(_restore_after_backward)
        return grad
    return hook


def _restore_after_backward() -> None:
    caller, _STATE.pending = _STATE.pending, None
    if caller is not None:
        torch.set_num_threads(caller)


def _restore_after_failed_backward() -> None:
    """A backward pass that raised never runs its queued callback: the next library call gives the count back."""
    if _STATE.pending is not None and _graph_task() < 0:              # not from inside a backward pass
        _restore_after_backward()


def _graph_task() -> int:
    """The running backward pass's id, −1 outside one (or where torch does not say)."""
    current = getattr(torch._C, "_current_graph_task_id", None)
    return -1 if current is None else current()


free_cores()                                                        # the first sample: a window soon
