"""The independent pieces of figures 5–6 (trainings, curve sets) run on N worker processes of one thread each.

Most of a reproduction is small tensors (12-step models of width ≤ 384, short texts), on which a second
torch thread gains little and, on a busy machine, can cost a lot (threads spin while they wait for a
core); separate processes keep every core busy. So `run_jobs(jobs, workers)` runs the jobs on
`workers` spawned processes, each with one torch and BLAS thread: whenever a worker is free it
starts the first job, in the order given, whose dependencies have finished (the order is the
priority). With `workers == 1` it runs them in this
process, one after the other. Every job seeds its own random numbers, so results do not depend on
the number of workers or the order in which jobs finish.

Jobs are module-level functions of picklable arguments: `theory_job` (one of figures 1–4, writing its
PNG), `train_job` (one recipe through `unfoldformer.train`, writing its run folder),
`random_curves_job` and `trained_curves_job` (one curve set each, returned as arrays).
"""
from __future__ import annotations

import multiprocessing
import os
from collections.abc import Callable, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

__all__ = ["Job", "random_curves_job", "run_jobs", "theory_job", "train_job", "trained_curves_job"]


@dataclass
class Job:
    """`fn(*args, *results of after)`, run once every job named in `after` has finished."""

    fn: Callable
    args: tuple = ()
    after: tuple[str, ...] = field(default_factory=tuple)


def _worker_init(parent: int) -> None:
    """One torch and BLAS thread; on Linux, the worker dies with the process that started it, so a killed
    reproduction leaves no worker behind still writing into its (abandoned) output folder."""
    import signal
    import sys

    import torch
    from threadpoolctl import threadpool_limits
    if sys.platform.startswith("linux"):
        import ctypes
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, int(signal.SIGKILL))                         # PR_SET_PDEATHSIG
        if os.getppid() != parent:                                 # the parent died before the line above
            os._exit(1)
    torch.set_num_threads(1)
    threadpool_limits(1)


class _Inline:
    """An executor that runs each job when it is submitted (workers == 1)."""

    def submit(self, fn, *args) -> Future:
        future: Future = Future()
        try:
            future.set_result(fn(*args))
        except BaseException as exc:                                # handed to the caller by .result()
            future.set_exception(exc)
        return future

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        return None


def _timed(fn: Callable, *args) -> tuple[Any, float, float]:
    """(fn(*args), its wall time, its CPU time in this process)."""
    import time
    wall, cpu = time.perf_counter(), time.process_time()
    result = fn(*args)
    return result, time.perf_counter() - wall, time.process_time() - cpu


def run_jobs(jobs: dict[str, Job], workers: int,
             done: Callable[[str, float, float], None] | None = None) -> dict[str, Any]:
    """Run every job (dependencies first) on `workers` processes and return their results by key;
    `done(key, wall seconds, CPU seconds)` as each finishes. The first job to fail stops the run with its
    exception (the jobs not started are cancelled)."""
    unknown = {d for job in jobs.values() for d in job.after} - set(jobs)
    if unknown:
        raise ValueError(f"jobs depend on unknown jobs: {sorted(unknown)}")
    pending, results, running = dict(jobs), {}, {}
    executor = (_Inline() if workers <= 1 else
                ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("spawn"),
                                   initializer=_worker_init, initargs=(os.getpid(),)))
    with executor as ex:
        try:
            while pending or running:
                for key, job in list(pending.items()):                # the first ready jobs, in the order given
                    if len(running) >= max(workers, 1):
                        break
                    if all(d in results for d in job.after):
                        running[ex.submit(_timed, job.fn, *job.args, *(results[d] for d in job.after))] = key
                        del pending[key]
                if not running:
                    raise ValueError(f"jobs wait on each other: {sorted(pending)}")
                finished, _ = wait(running, return_when=FIRST_COMPLETED)
                for future in finished:
                    key = running.pop(future)
                    results[key], wall, cpu = future.result()
                    if done is not None:
                        done(key, wall, cpu)
        except BaseException:
            for future in running:
                future.cancel()
            raise
    return results


# ----------------------------------------------------------------------------- jobs
_EMBEDDINGS: dict = {}


def _embeddings(spec: str, vocab: tuple[str, ...], seed: int):
    """The reproduction's embedding table, built once per process."""
    from ..data import load_embeddings
    key = (spec, hash(vocab), seed)
    if key not in _EMBEDDINGS:
        _EMBEDDINGS[key] = load_embeddings(spec, vocab_texts=list(vocab), seed=seed)
    return _EMBEDDINGS[key]


def theory_job(figure: str, seed: int, grid: int, half_steps: int, out: Path) -> dict:
    """One of figures 1, 2–3, 4 (THEORY §3.5, §7 items 1–4): its PNG(s) written to `out`, its summary returned."""
    from . import fig1_apollonius, fig4_kappa, fig23_alternating
    from .settings import FIGURE_FILES
    if figure == "1":
        r = fig1_apollonius.compute(seed=seed, grid=grid)
        fig1_apollonius.plot(r, out / FIGURE_FILES[1])
        return fig1_apollonius.summary(r)
    if figure == "2-3":
        r = fig23_alternating.compute(seed=seed, half_steps=half_steps)
        fig23_alternating.plot(r, out / FIGURE_FILES[2], path_fig3=out / FIGURE_FILES[3])
        return fig23_alternating.summary(r)
    r, variant = fig4_kappa.compute_authors(seed=seed), fig4_kappa.compute(seed=seed, grid=grid)
    fig4_kappa.plot(r, out / FIGURE_FILES[4], variant=variant)
    return {**fig4_kappa.summary(r), "quadrant_variant": fig4_kappa.summary(variant)}


def train_job(spec, cfg):
    """Train one recipe (`paper.trained.train_variant`): the run folder is written, its summary returned."""
    from .trained import train_variant
    return train_variant(spec, cfg)


def random_curves_job(formula: str, variant: str, embeddings: str, vocab: tuple[str, ...], seed: int,
                      texts: Sequence[str], settings):
    """`fig56_energy_curves.random_curves` on the reproduction's embeddings: (VariantCurves, pooled inputs)."""
    from .fig56_energy_curves import random_curves
    return random_curves(formula, variant, _embeddings(embeddings, vocab, seed), texts, settings, seed)


def trained_curves_job(texts: Sequence[str], labels: Sequence[int], settings, variant):
    """`fig56_energy_curves.trained_curves` of a finished run (`variant`, the result of its `train_job`)."""
    from .fig56_energy_curves import trained_curves
    from .trained import load_trained
    return trained_curves(variant, load_trained(variant.spec, Path(variant.run_dir)), texts, labels, settings)
