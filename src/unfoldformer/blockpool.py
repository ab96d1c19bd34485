"""Row blocks on single-threaded workers: the blocked kernels' loop without parallel regions.

The blocked kernels (`unfoldformer.kernels`) run a loop of small steps per block of query rows (a
matrix product, an elementwise ρ′, a second product). Run on the calling thread, every step is its
own OpenMP parallel region, and each region ends at a barrier that waits for the slowest thread: on a
machine whose cores are shared with other work, a descheduled thread stalls every region (measured:
the anchored log step at n = 4,096 in 64 blocks of 3–5 regions took 11.3 s at 2 threads against
0.48 s at 1, 1-minute load 5–7 on 2 cores; 0.84 s at 2 threads on the workers).

`run_blocks` instead hands whole blocks to T = `torch.get_num_threads()` worker threads whose own
intra-op thread count is 1 (OpenMP and MKL thread counts are per thread): a worker takes the next
block when it finishes one (dynamic scheduling), so a descheduled worker delays one block, not
every step, and there is one wait per call. Every block writes disjoint rows and is computed by the
same single-threaded operations whichever worker takes it, so the results do not depend on the
scheduling (nor on T). Memory: one scratch state per worker (T blocks).

The serial path (the caller's thread, its own thread count) is taken for a single block, at one
thread, when another call holds the pool (re-entrant or concurrent use), and while a Python
dispatch or function mode is active (modes are thread-local: a FakeTensor, a profiler or a
memory probe must see every operation).
"""
from __future__ import annotations

import os
import queue
import threading
from collections.abc import Callable
from typing import Any

import torch

__all__ = ["run_blocks"]


class _Pool:
    """T daemon threads, each with intra-op thread count 1, running one job at a time."""

    def __init__(self, threads: int):
        self.threads, self.pid = threads, os.getpid()
        self.busy = threading.Lock()
        self.jobs: list[queue.SimpleQueue] = [queue.SimpleQueue() for _ in range(threads)]
        self.done: queue.SimpleQueue = queue.SimpleQueue()
        ready = threading.Barrier(threads + 1)
        for jobs in self.jobs:
            threading.Thread(target=self._work, args=(jobs, ready), daemon=True,
                             name="unfoldformer-block").start()
        ready.wait()
        # at::set_num_threads also stores a process-wide default that new threads copy: restore it
        torch.set_num_threads(threads)

    @staticmethod
    def _work(jobs: queue.SimpleQueue, ready: threading.Barrier) -> None:
        torch.get_num_threads()                                      # initialise this thread's count first,
        torch.set_num_threads(1)                                     # then make it 1 (OpenMP/MKL: per thread)
        ready.wait()
        while True:
            job, done = jobs.get()
            if job is None:                                          # the pool was replaced
                return
            try:
                with torch.no_grad():
                    job()
                done.put(None)
            except BaseException as err:                             # handed to the caller
                done.put(err)

    def run(self, job: Callable[[], None]) -> None:
        for jobs in self.jobs:
            jobs.put((job, self.done))
        errors = [self.done.get() for _ in self.jobs]
        err = next((e for e in errors if e is not None), None)
        if err is not None:
            raise err


_POOL: _Pool | None = None
_POOL_LOCK = threading.Lock()


def _pool(threads: int) -> _Pool:
    global _POOL
    with _POOL_LOCK:
        if _POOL is None or _POOL.threads != threads or _POOL.pid != os.getpid():
            if _POOL is not None and _POOL.pid == os.getpid():
                for jobs in _POOL.jobs:                              # stop the old workers
                    jobs.put((None, None))
            _POOL = _Pool(threads)
        return _POOL


def _modes_active() -> bool:
    return bool(torch._C._len_torch_dispatch_stack()) or torch._C._is_torch_function_mode_enabled()


def run_blocks(n: int, rows: int, step: Callable[[Any, int, int], None],
               scratch: Callable[[], Any] = lambda: None) -> None:
    """Call `step(state, s, e)` for every row block [s, e) of [0, n) in blocks of `rows`, each exactly once.

    `state = scratch()` is made once per worker (a reusable block buffer); `step` must write only its
    own rows. Blocks run on the single-threaded workers when T > 1 and there are ≥ 2 blocks.
    """
    starts = range(0, n, rows)
    threads = torch.get_num_threads()
    if threads > 1 and len(starts) > 1 and not _modes_active() and not torch.compiler.is_compiling():
        pool = _pool(threads)
        if pool.busy.acquire(blocking=False):
            try:
                taken = iter(starts)
                lock = threading.Lock()

                def job() -> None:
                    state = scratch()
                    while True:
                        with lock:
                            s = next(taken, None)
                        if s is None:
                            return
                        step(state, s, min(n, s + rows))

                pool.run(job)
                return
            finally:
                pool.busy.release()
    state = scratch()
    for s in starts:
        step(state, s, min(n, s + rows))
