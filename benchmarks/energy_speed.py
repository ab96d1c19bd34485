"""Energy speed benchmark (issue: core library, item 7). Prints one markdown table from one run.

(a) Attention energies of 200 sequences with IMDB-like lengths (mean ≈ 230 tokens, longest
    2,500) at d = 300: the library (Gram matrices, log-sum-exp, length-bucketed batches)
    against a straightforward per-sample implementation that forms every pair difference
    y_i − y_j (the way the authors' code computes it), written here as the reference.
    Target ≥ 50× faster, equal to 1e-9 relative in float64.
(b) Cost of `return_energies=True` over `False` for the 12-layer certified model at
    B = 32, n = 128, d = 384 (float32 inference), safeguard off and on. Target ≤ 10 %.
(c) Peak memory of the energy at n = 8,192, d = 384 above the input, measured in a fresh
    subprocess as the peak resident set size (VmHWM, reset just before the call) minus the
    resident size with the input in memory. Target < 1 GiB.

Usage: python benchmarks/energy_speed.py [--samples 200] [--repeats 5] [--quick]
"""
from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time

import numpy as np
import torch

from unfoldformer import ModelConfig, UnfoldedTransformer
from unfoldformer.energy import attention_energy


def imdb_like_lengths(samples: int, seed: int = 0) -> list[int]:
    """Log-normal lengths with mean ≈ 230 tokens and the longest set to 2,500."""
    rng = np.random.default_rng(seed)
    lengths = np.clip(rng.lognormal(mean=5.2, sigma=0.6, size=samples), 10, 2500).astype(int)
    lengths[0] = 2500
    return lengths.tolist()


def pairwise_reference(y: torch.Tensor, F: torch.Tensor, block: int = 32) -> float:
    """Σ_{i<j} −exp(−½‖(y_i − y_j)Fᵀ‖²) from explicit pair differences, one sample (n, d)."""
    total = 0.0
    n = y.shape[0]
    for s in range(0, n, block):
        diff = y[s:s + block, None, :] - y[None, :, :]                   # (b, n, d) pair differences
        z = 0.5 * (diff @ F.T).pow(2).sum(-1)                           # (b, n)
        rows = torch.arange(s, min(n, s + block))[:, None]
        upper = rows < torch.arange(n)[None, :]                          # each unordered pair once
        total += float(-torch.exp(-z)[upper].sum())
    return total


def library_energies(seqs: list[torch.Tensor], F: torch.Tensor, batch_tokens: int = 4096) -> list[float]:
    """Length-bucketed batches with padding masks (True marks padding)."""
    order = sorted(range(len(seqs)), key=lambda i: seqs[i].shape[0])
    out = [0.0] * len(seqs)
    start = 0
    while start < len(order):
        n_max, end = 0, start
        while end < len(order):
            n_next = seqs[order[end]].shape[0]
            if max(n_max, n_next) * (end - start + 1) > max(batch_tokens, n_next):
                break
            n_max = max(n_max, n_next)
            end += 1
        idx = order[start:end]
        Y = torch.zeros(len(idx), n_max, F.shape[1], dtype=torch.float64)
        pad = torch.ones(len(idx), n_max, dtype=torch.bool)
        for r, i in enumerate(idx):
            Y[r, : seqs[i].shape[0]] = seqs[i]
            pad[r, : seqs[i].shape[0]] = False
        for r, e in zip(idx, attention_energy(Y, F, "exp", pad).tolist()):
            out[r] = e
        start = end
    return out


def bench_a(samples: int) -> dict:
    torch.manual_seed(0)
    d = 300
    lengths = imdb_like_lengths(samples)
    seqs = [torch.randn(n, d, dtype=torch.float64) * 0.3 for n in lengths]
    F = torch.randn(d, d, dtype=torch.float64) / d**0.5
    t0 = time.perf_counter()
    ours = library_energies(seqs, F)
    t_lib = time.perf_counter() - t0
    t0 = time.perf_counter()
    ref = [pairwise_reference(y, F) for y in seqs]
    t_ref = time.perf_counter() - t0
    rel = max(abs(a - b) / max(1.0, abs(b)) for a, b in zip(ours, ref))
    return {"samples": samples, "mean_len": float(np.mean(lengths)), "max_len": int(max(lengths)),
            "library_s": t_lib, "reference_s": t_ref, "speedup": t_ref / t_lib, "max_rel_diff": rel}


def bench_b(repeats: int, B: int = 32, n: int = 128, d: int = 384) -> dict:
    torch.manual_seed(0)
    x = torch.randn(B, n, d)
    result = {}
    cfg = ModelConfig.preset("certified", d_model=d, n_heads=4, depth=12, ffn_hidden=4 * d)
    model = UnfoldedTransformer(cfg).eval()
    for guard in (False, True):
        times = {False: [], True: []}
        with torch.no_grad():
            model(x, safeguard=guard)                                    # warm-up
            for _ in range(repeats):
                for flag in (False, True):                               # interleaved, side by side
                    t0 = time.perf_counter()
                    model(x, return_energies=flag, safeguard=guard)
                    times[flag].append(time.perf_counter() - t0)
        off, on = statistics.median(times[False]), statistics.median(times[True])
        result[f"safeguard_{'on' if guard else 'off'}"] = {"without_s": off, "with_s": on, "overhead": on / off - 1}
    return result


CHILD = """
import torch
from unfoldformer.energy import attention_energy

def status(key):
    with open("/proc/self/status") as fh:
        return next(int(line.split()[1]) * 1024 for line in fh if line.startswith(key))

torch.manual_seed(0)
n, d = {n}, {d}
Y = torch.randn(1, n, d, dtype=torch.float32); F = torch.randn(4, d // 4, d) / d ** 0.5
attention_energy(Y[:, :64], F, "exp")              # warm-up: library code paths loaded
base = status("VmRSS:")
with open("/proc/self/clear_refs", "w") as fh:     # reset the peak resident set size (VmHWM)
    fh.write("5")
e = attention_energy(Y, F, "exp")
print(status("VmHWM:") - base)
"""


def bench_c(n: int = 8192, d: int = 384) -> dict:
    out = subprocess.run([sys.executable, "-c", CHILD.format(n=n, d=d)], capture_output=True, text=True, check=True)
    return {"n": n, "d": d, "peak_bytes_above_input": int(out.stdout.strip().splitlines()[-1])}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, default=200)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--quick", action="store_true", help="20 samples, 2 repeats")
    parser.add_argument("--json", default=None, help="also write the raw numbers to this file")
    args = parser.parse_args()
    if args.quick:
        args.samples, args.repeats = 20, 2
    a, b, c = bench_a(args.samples), bench_b(args.repeats), bench_c()
    print(f"torch {torch.__version__}, threads {torch.get_num_threads()}")
    print("| benchmark | measured | target | met |")
    print("|---|---|---|---|")
    print(f"| (a) energies of {a['samples']} sequences (mean {a['mean_len']:.0f}, max {a['max_len']} tokens, d = 300): "
          f"library {a['library_s']:.2f} s vs pair-difference reference {a['reference_s']:.1f} s | "
          f"{a['speedup']:.0f}× faster, max rel. diff {a['max_rel_diff']:.1e} | ≥ 50×, ≤ 1e-9 | "
          f"{'yes' if a['speedup'] >= 50 and a['max_rel_diff'] <= 1e-9 else 'no'} |")
    for key, r in b.items():
        print(f"| (b) `return_energies=True` cost, 12-layer certified, B=32 n=128 d=384, {key.replace('_', ' ')}: "
              f"{r['without_s']:.3f} s → {r['with_s']:.3f} s (median of {args.repeats}) | "
              f"+{100 * r['overhead']:.0f} % | ≤ 10 % | "
              f"{'yes' if r['overhead'] <= 0.10 else 'no'} |")
    gib = c["peak_bytes_above_input"] / 2**30
    print(f"| (c) peak memory of the energy, n = {c['n']}, d = {c['d']}, 4 heads | {gib:.3f} GiB above the input | "
          f"< 1 GiB | {'yes' if gib < 1 else 'no'} |")
    if args.json:
        with open(args.json, "w") as fh:
            json.dump({"a": a, "b": b, "c": c}, fh, indent=2)


if __name__ == "__main__":
    main()
