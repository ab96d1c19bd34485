"""Attention-step speed and memory for every ρ against the softmax (exp) step, side by side.

One sequence (B = 1) of n tokens, d = 128, 4 heads (head width 32), float32, at 1 and 2 threads
(`--threads`, alternated in the same process). Two steps:

- `anchored`: `anchored_attention_step`, the certified model's attention (exp: one fused
  `scaled_dot_product_attention` call; other ρ: the blocked kernel `unfoldformer.kernels`);
- `metric`: `attention_step` with isotropic head factors (exp: SDPA with the key-norm bias as
  `attn_mask`; other ρ: the blocked kernel);

each as a forward pass (no autograd) and as forward + backward (gradients of Y and the head
scales). `log (dense)` is the reference path with the dense n × n weights (`use_sdpa=False`), as
every ρ ≠ exp ran before the blocked kernel. All variants and thread counts run in one process, in
turn, round after round (so each sees the same machine state), flush-denormal on; reported: the
median wall time over the rounds (wall, not CPU time: the blocked kernel runs on worker threads,
`unfoldformer.blockpool`), its ratio to exp at the same thread count, the 1-minute load average, and the
peak memory above the input: the peak resident set size (VmHWM, reset just before the call)
minus the resident size before it, with glibc's mmap threshold fixed at 64 KiB so that freed
blocks return to the system and the resident size follows live memory (Linux only).

`--busy` starts a single-thread matmul loop in another process for the whole run (a machine whose
cores are shared with other work).

    python benchmarks/rho_speed.py [--lengths 64 256 1024 4096] [--threads 1 2] [--busy] [--rounds 5] [--json FILE]
"""
from __future__ import annotations

# isort: off
# unfoldformer before torch, as the command line imports it (results measured before 2026-12-05 ran with the
# OMP_WAIT_POLICY=PASSIVE that versions of then set in this order; the library now leaves OpenMP's settings alone)
import unfoldformer  # noqa: F401
# isort: on
import argparse
import ctypes
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch

from unfoldformer import steps as S
from unfoldformer.utils import environment, write_json

RESULTS = Path(__file__).resolve().parent / "results" / "speed" / "rho_speed.json"
D_MODEL, HEADS = 128, 4
RHOS = ("exp", "log", "lp", "truncated", "linear")
DENSE = "log (dense)"


def fix_mmap_threshold() -> bool:
    """glibc: serve every block of ≥ 64 KiB by mmap (returned to the system on free); False elsewhere."""
    try:
        return bool(ctypes.CDLL("libc.so.6").mallopt(-3, 1 << 16))   # M_MMAP_THRESHOLD
    except (OSError, AttributeError):
        return False


def _status(key: str) -> int:
    with open("/proc/self/status") as fh:
        return next(int(line.split()[1]) * 1024 for line in fh if line.startswith(key))


def peak_bytes(fn) -> int | None:
    """Peak resident memory of `fn()` above the resident size before it (VmHWM reset), or None."""
    try:
        base = _status("VmRSS:")
        with open("/proc/self/clear_refs", "w") as fh:
            fh.write("5")
    except OSError:
        return None
    fn()
    return _status("VmHWM:") - base


def make_call(kind: str, rho: str, backward: bool, n: int):
    """A closure running one attention step (and its backward) on fixed inputs of length n."""
    g = torch.Generator().manual_seed(n)
    Y0, X = torch.randn(1, n, D_MODEL, generator=g), torch.randn(1, n, D_MODEL, generator=g)  # (1, n, d)
    scales = torch.full((HEADS,), (D_MODEL // HEADS) ** -0.25, requires_grad=backward)      # (H,)
    name, dense = ("log", True) if rho == DENSE else (rho, False)

    def step(Y: torch.Tensor) -> torch.Tensor:
        if kind == "anchored":
            if dense:
                fac = S.isotropic_factors(scales, D_MODEL)
                return S.attention_step(Y, fac, name, use_sdpa=False)  # same dense weights and cost
            return S.anchored_attention_step(Y, X, scales, 1.0, name)
        return S.attention_step(Y, S.isotropic_factors(scales, D_MODEL), name, use_sdpa=not dense)

    def call() -> None:
        if not backward:
            with torch.no_grad():
                step(Y0)
            return
        Y = Y0.clone().requires_grad_(True)
        step(Y).square().sum().backward()
    return call


BUSY = "import torch\ntorch.set_num_threads(1)\na = torch.randn(1024, 1024)\nwhile True:\n    a @ a\n"


def measure(n: int, rounds: int, rhos: list[str], dense_backward_max: int, threads: list[int]) -> dict:
    """{threads: {step/pass: {ρ: cell}}}: wall-time medians, variants and thread counts alternated."""
    out: dict = {str(t): {} for t in threads}
    for kind in ("anchored", "metric"):
        for backward in (False, True):
            names = list(rhos) + ([DENSE] if not backward or n <= dense_backward_max else [])
            calls = {r: make_call(kind, r, backward, n) for r in names}
            for t in threads:                                         # warm-up
                torch.set_num_threads(t)
                for call in calls.values():
                    call()
            times: dict = {(t, r): [] for t in threads for r in calls}
            for _ in range(rounds):
                for t in threads:
                    torch.set_num_threads(t)
                    for r, call in calls.items():
                        start = time.perf_counter()
                        call()
                        times[t, r].append(time.perf_counter() - start)
            key = f"{kind}/{'forward+backward' if backward else 'forward'}"
            for t in threads:
                torch.set_num_threads(t)
                out[str(t)][key] = {r: {"time_s": statistics.median(times[t, r]), "times_s": times[t, r],
                                        "peak_bytes": peak_bytes(calls[r])} for r in calls}
    return out


def render(results: dict, lengths: list[int], threads: list[int]) -> str:
    lines = []
    for t in threads:
        for key in results[str(lengths[0])][str(t)]:
            lines += [f"**{key}, {t} thread(s)** (median wall time; ratio to exp; peak memory above the input)", "",
                      "| ρ | " + " | ".join(f"n = {n}" for n in lengths) + " |", "|---|" + "---|" * len(lengths)]
            names = list(dict.fromkeys(r for n in lengths for r in results[str(n)][str(t)][key]))
            for r in names:
                cells = []
                for n in lengths:
                    table = results[str(n)][str(t)][key]
                    cell = table.get(r)
                    if cell is None:
                        cells.append("–")
                        continue
                    ratio = cell["time_s"] / table["exp"]["time_s"]
                    mem = "" if cell["peak_bytes"] is None else f", {cell['peak_bytes'] / 2**20:.0f} MiB"
                    cells.append(f"{1e3 * cell['time_s']:.1f} ms ({ratio:.2f}×{mem})")
                lines.append(f"| {r} | " + " | ".join(cells) + " |")
            lines.append("")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--lengths", type=int, nargs="+", default=[64, 256, 1024, 4096])
    p.add_argument("--rhos", nargs="+", choices=RHOS, default=list(RHOS))
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    p.add_argument("--busy", action="store_true", help="run a single-thread matmul loop in another process")
    p.add_argument("--dense-backward-max", type=int, default=1024,
                   help="longest n at which the dense reference also runs forward + backward (it stores n × n)")
    p.add_argument("--json", default=str(RESULTS), help="where to write the measurements")
    args = p.parse_args(argv)
    if "exp" not in args.rhos:
        p.error("--rhos must include exp (the ratios are to it)")
    torch.set_flush_denormal(True)
    mmap_fixed = fix_mmap_threshold()
    busy = subprocess.Popen([sys.executable, "-c", BUSY]) if args.busy else None
    results, loads = {}, []
    try:
        for n in args.lengths:
            print(f"n = {n} ...", file=sys.stderr, flush=True)
            loads.append(os.getloadavg()[0])
            results[str(n)] = measure(n, args.rounds, args.rhos, args.dense_backward_max, args.threads)
    finally:
        if busy is not None:
            busy.kill()
            busy.wait()
    print(render(results, args.lengths, args.threads))
    print(f"B = 1, d = {D_MODEL}, {HEADS} heads, float32, threads {args.threads} (alternated), {args.rounds} rounds, "
          f"{'with' if args.busy else 'without'} a busy process, 1-minute load average "
          f"{min(loads):.1f}–{max(loads):.1f}; {environment()}")
    write_json(args.json, {"setting": {"batch": 1, "d_model": D_MODEL, "heads": HEADS, "dtype": "float32",
                                       "threads": args.threads, "rounds": args.rounds, "busy": args.busy,
                                       "load_average_1min": loads, "mmap_threshold_fixed": mmap_fixed},
                           "results": results, "machine": environment()})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
