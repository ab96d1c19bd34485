"""Run-time settings shared by the commands: CPU thread limits.

On small kernels and shared cores one thread is often fastest (measured: a 384×384 `eigh`
took 5.7 s on 2 threads of a loaded machine and 30 ms on one), so the probe and the
reproduction run with an explicit thread count.
"""
from __future__ import annotations

from contextlib import contextmanager

import torch
from threadpoolctl import threadpool_limits


@contextmanager
def torch_threads(n: int | None):
    """Temporarily run torch and the BLAS of numpy/scipy on `n` CPU threads (None: unchanged)."""
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
