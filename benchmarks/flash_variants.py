"""What the off-diagonal pass costs at n = 4,096 in PyTorch's CPU flash kernel, and what the ways around its mask cost.

The library's pass (`softmax.attention_pass`, ρ = exp) calls the kernel at width dh + 1 (queries [a_i, 1], keys
[a_j, −½‖a_j‖²], values with a zero column for the log-sum-exp's gradient) with the diagonal masked, in query chunks
of a (chunk × n) mask. The standard layer calls it at width dh with no mask. Variants, on the benchmark's
n = 4,096 shape (B 1, 4 heads of 32):

- `library`: width 33, the diagonal masked, 16 chunks of 256 queries (the pass as it runs);
- `unmasked-33`: width 33, no mask (what removing the mask alone would give);
- `causal-pair-33`: width 33, no mask tensor: the keys before each query and the keys after it as two causal passes
  (the second on the reversed sequence), which together cover j ≠ i (a way to drop the mask without a kernel of
  our own; their log-sum-exps would then be merged);
- `unmasked-32`: width 32, no mask (the standard layer's call);
- `causal-pair-32`: the causal pair at width 32.

Each variant runs forward only and forward + backward (the kernel's own backward with an all-ones output gradient),
alternated variant by variant, median wall time over `--rounds`, at the current thread count.

    python benchmarks/flash_variants.py [--threads 1 2] [--rounds 5] [--json FILE]
"""
from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

import torch

from unfoldformer.utils import environment, write_json

RESULTS = Path(__file__).resolve().parent / "results" / "speed" / "flash_variants.json"
B, H, N, DH = 1, 4, 4096, 32
CHUNK = (1 << 20) // N                                              # the library's rows per mask chunk
_fwd = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu
_bwd = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward


def _call(q, k, v, causal: bool, mask, backward: bool) -> None:
    out, lse = _fwd(q, k, v, 0.0, causal, attn_mask=mask, scale=1.0)
    if backward:
        _bwd(torch.ones_like(out), q, k, v, out, lse, 0.0, causal, attn_mask=mask, scale=1.0)


def variants() -> dict:
    """name -> call(backward) on fixed random inputs."""
    g = torch.Generator().manual_seed(0)
    wide = [torch.randn(B, H, N, DH + 1, generator=g) for _ in range(3)]   # (B, H, n, 33) q, k, v
    narrow = [t[..., :DH].contiguous() for t in wide]                     # (B, H, n, 32)
    band = torch.zeros(CHUNK, 2 * N)                                      # the library's diagonal band
    band[torch.arange(CHUNK), N + torch.arange(CHUNK)] = -1e30

    def library(backward: bool) -> None:
        q, k, v = wide
        for s in range(0, N, CHUNK):
            e = min(N, s + CHUNK)
            _call(q[:, :, s:e], k, v, False, band[None, None, : e - s, N - s: 2 * N - s], backward)

    def causal_pair(tensors):
        def run(backward: bool) -> None:
            q, k, v = tensors
            _call(q[:, :, 1:], k[:, :, :-1], v[:, :, :-1], True, None, backward)       # keys before each query
            qf, kf, vf = (t.flip(2) for t in tensors)
            _call(qf[:, :, 1:], kf[:, :, :-1], vf[:, :, :-1], True, None, backward)    # keys after it
        return run

    return {"library": library,
            "unmasked-33": lambda backward: _call(*wide, False, None, backward),
            "causal-pair-33": causal_pair(wide),
            "unmasked-32": lambda backward: _call(*narrow, False, None, backward),
            "causal-pair-32": causal_pair(narrow)}


def measure(threads: int, rounds: int) -> dict:
    torch.set_num_threads(threads)
    calls = variants()
    out = {}
    for backward in (False, True):
        times = {name: [] for name in calls}
        for call in calls.values():                                    # warm-up
            call(backward)
        for _ in range(rounds):
            for name, call in calls.items():
                t0 = time.perf_counter()
                call(backward)
                times[name].append(time.perf_counter() - t0)
        out["forward + backward" if backward else "forward"] = {k: statistics.median(v) for k, v in times.items()}
    return out


def table(results: dict) -> str:
    names = list(next(iter(next(iter(results["threads"].values())).values())))
    lines = ["| threads | pass | " + " | ".join(f"{n} ms" for n in names) + " |", "|---" * (len(names) + 2) + "|"]
    for threads, passes in results["threads"].items():
        for what, medians in passes.items():
            lines.append(f"| {threads} | {what} | " + " | ".join(f"{1e3 * medians[n]:.0f}" for n in names) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--json", type=Path, default=RESULTS)
    args = p.parse_args(argv)
    results = {"shape": {"B": B, "heads": H, "n": N, "dh": DH}, "rounds": args.rounds, "environment": environment(),
               "seconds": "median wall time per call of one layer's pass (all heads)",
               "threads": {str(t): measure(t, args.rounds) for t in args.threads}}
    write_json(args.json, results)
    print(table(results))


if __name__ == "__main__":
    main()
