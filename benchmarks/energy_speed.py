"""Energy speed benchmark. Prints one markdown table from one run.

(a) Attention energies of 200 sequences with IMDB-like lengths (mean ≈ 230 tokens, longest 2,500)
    at d = 300, float64: the library (`attention_energy`, the caller batching 4,096 tokens at a
    time) against a straightforward per-sample implementation that forms every pair difference
    y_i − y_j (the way the authors' code computes it), written here as the reference.
    Target ≥ 50× faster, equal to 1e-9 relative.
(b) The first 30 of those sequences as ONE padded batch (30 × 2,500 × 300, one call): the library
    (fused pass, rows grouped by length inside) against the same per-sample reference, and the
    float64 Gram path (`method="gram"`) on the same padded batch. Target ≥ 50×.
(c) Cost of the energies for the 12-layer certified model at B = 32, n = 128, d = 384 (float32
    inference): `return_energies=True` (the curve E(Y⁽ᵗ⁾)), `return_energies="steps"` (the sub-step
    terms too) and `safeguard=True`, each over the plain forward, measured in alternating rounds
    (CPU thread time, medians). Targets: curve ≤ +60 %, sub-steps ≤ +110 %. Precision: the largest
    difference of every reported energy from the float64 Gram reference evaluated on the module
    path's states, relative to the magnitude of the energy's summands; target ≤ 1e-5.
(c') The same for the 12-layer certified-joint model (THEORY §3.7: its curve comes from the steps' own
    passes and hidden layers, plus one evaluation at the last state): `return_energies=True` over its
    plain forward. Target ≤ +15 %.
(d) Peak memory of the energy at n = 8,192, d = 384 above the input, measured in a fresh
    subprocess as the peak resident set size (VmHWM, reset just before the call) minus the
    resident size with the input in memory. Target < 1 GiB.

(e) `--peak`: (b) again at 1 and 2 threads (alternated, wall time, medians), beside a large float32
    and float64 matmul in the same process (the machine's matmul peak at that thread count): each
    energy path's arithmetic rate as a fraction of the peak of its dtype. Counted FLOPs: the feature
    products 2·N·d² of the N real tokens (one d × d map for all heads) and one product per pair,
    2·Σ_b n_b²·(d + H) (the logits of every real pair, widths d/H + 1 per head); the fused kernel's
    second product (its values) is not counted, so the fractions are lower bounds of the work done.

Usage: python benchmarks/energy_speed.py [--samples 200] [--repeats 5] [--quick] [--peak] [--only-joint] [--json FILE]
"""
from __future__ import annotations

# isort: off
# unfoldformer before torch, as the command line imports it (results measured before 2026-12-05 ran with the
# OMP_WAIT_POLICY=PASSIVE that versions of then set in this order; the library now leaves OpenMP's settings alone)
import unfoldformer  # noqa: F401
# isort: on
import argparse
import json
import os
import statistics
import subprocess
import sys
import time

import numpy as np
import torch
from torch.nn.utils import parametrize
from tqdm import tqdm

from unfoldformer import ModelConfig, UnfoldedTransformer
from unfoldformer import energy as E
from unfoldformer.energy import attention_energy
from unfoldformer.utils import environment


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


def padded(seqs: list[torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    """One padded batch (B, n_max, d) and its padding mask (True marks padding)."""
    n_max = max(s.shape[0] for s in seqs)
    Y = torch.zeros(len(seqs), n_max, seqs[0].shape[1], dtype=seqs[0].dtype)
    pad = torch.ones(len(seqs), n_max, dtype=torch.bool)
    for r, s in enumerate(seqs):
        Y[r, : s.shape[0]], pad[r, : s.shape[0]] = s, False
    return Y, pad


def library_energies(seqs: list[torch.Tensor], F: torch.Tensor, batch_tokens: int = 4096) -> list[float]:
    """Length-sorted padded batches of about `batch_tokens` tokens (True marks padding)."""
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
        Y, pad = padded([seqs[i] for i in idx])
        for r, e in zip(idx, attention_energy(Y, F, "exp", pad).tolist()):
            out[r] = e
        start = end
    return out


def bench_ab(samples: int) -> tuple[dict, dict]:
    torch.manual_seed(0)
    d = 300
    lengths = imdb_like_lengths(samples)
    seqs = [torch.randn(n, d, dtype=torch.float64) * 0.3 for n in lengths]
    F = torch.randn(d, d, dtype=torch.float64) / d**0.5
    t0 = time.thread_time()
    ours = library_energies(seqs, F)
    t_lib = time.thread_time() - t0
    ref, ref_times = [], []
    for y in tqdm(seqs, desc="pair-difference reference", leave=False):
        t0 = time.thread_time()
        ref.append(pairwise_reference(y, F))
        ref_times.append(time.thread_time() - t0)
    rel = lambda a, b: max(abs(x - y) / max(1.0, abs(y)) for x, y in zip(a, b))   # noqa: E731
    a = {"samples": samples, "mean_len": float(np.mean(lengths)), "max_len": int(max(lengths)),
         "library_s": t_lib, "reference_s": sum(ref_times), "speedup": sum(ref_times) / t_lib,
         "max_rel_diff": rel(ours, ref)}
    k = min(30, samples)
    Y, pad = padded(seqs[:k])
    t0 = time.thread_time()
    batch = attention_energy(Y, F, "exp", pad).tolist()
    t_batch = time.thread_time() - t0
    t0 = time.thread_time()
    attention_energy(Y, F, "exp", pad, method="gram")
    t_gram = time.thread_time() - t0
    b = {"samples": k, "shape": list(Y.shape), "real_tokens": int((~pad).sum()), "library_s": t_batch,
         "gram_s": t_gram, "reference_s": sum(ref_times[:k]), "speedup": sum(ref_times[:k]) / t_batch,
         "gram_speedup": sum(ref_times[:k]) / t_gram, "max_rel_diff": rel(batch, ref[:k])}
    return a, b


def reference_energies(model: UnfoldedTransformer, x: torch.Tensor) -> dict[str, torch.Tensor]:
    """The curve and sub-step terms from the float64 Gram path on the module path's states, with the
    magnitude of each term's summands: {field: (value (B, depth[+1]), scale)}."""
    def terms(Y: torch.Tensor, layer) -> tuple[torch.Tensor, ...]:
        att, ffn = layer.attention, layer.ffn
        e_att = E.attention_energy(Y, att.factors(), att.rho, method="gram")
        anchor = E.anchor_energy(Y, x) / att.lam
        h_sq, y_sq = E.norm_regularizer(torch.relu(Y @ ffn.W1 + ffn.b)), E.norm_regularizer(Y)
        return e_att + anchor, e_att.abs() + anchor, y_sq - h_sq, y_sq + h_sq

    rows: dict[str, list] = {k: [] for k in ("curve", "attention_before", "attention_after", "ffn_before",
                                             "ffn_after")}
    with torch.no_grad(), parametrize.cached():
        Y = x
        layer = model.layer(0)
        a, sa, f, sf = terms(Y, layer)
        rows["curve"].append((a + f, sa + sf))
        for ell in range(model.config.depth):
            layer = model.layer(ell)
            U = layer.attention(Y, x, None)
            Y_next = layer.ffn(U, None)
            (a0, s0, _, _), (a1, s1, f1, t1), (a2, s2, f2, t2) = terms(Y, layer), terms(U, layer), terms(Y_next, layer)
            rows["attention_before"].append((a0, s0))
            rows["attention_after"].append((a1, s1))
            rows["ffn_before"].append((f1, t1))
            rows["ffn_after"].append((f2, t2))
            rows["curve"].append((a2 + f2, s2 + t2))
            Y = Y_next
    return {k: (torch.stack([v for v, _ in r], 1), torch.stack([s for _, s in r], 1)) for k, r in rows.items()}


def bench_joint(repeats: int, B: int = 32, n: int = 128, d: int = 384) -> dict:
    """Curve overhead of the 12-layer certified-joint model over its plain forward (alternating rounds); CPU
    thread time at one thread, wall time above (the calling thread's CPU time misses the other threads)."""
    torch.manual_seed(0)
    xs = [torch.randn(B, n, d) for _ in range(2)]
    model = UnfoldedTransformer(ModelConfig.preset("certified", d_model=d, n_heads=4, depth=12,
                                                   ffn_hidden=4 * d)).eval()
    modes = {"plain": {}, "curve": {"return_energies": True}}
    times: dict[str, list[float]] = {m: [] for m in modes}
    clock = time.thread_time if torch.get_num_threads() == 1 else time.perf_counter
    with torch.no_grad():
        for kw in modes.values():                                         # warm-up
            model(xs[0], **kw)
        for r in tqdm(range(repeats), desc="joint", leave=False):
            for mode in (list(modes) if r % 2 == 0 else list(modes)[::-1]):
                t0 = clock()
                model(xs[r % 2], **modes[mode])
                times[mode].append(clock() - t0)
    plain = statistics.median(times["plain"])
    return {"times_s": times, "median_s": {m: statistics.median(t) for m, t in times.items()},
            "overhead": statistics.median(times["curve"]) / plain - 1, "repeats": repeats,
            "clock": "thread_time" if clock is time.thread_time else "wall", "threads": torch.get_num_threads()}


def bench_c(repeats: int, B: int = 32, n: int = 128, d: int = 384) -> dict:
    torch.manual_seed(0)
    xs = [torch.randn(B, n, d) for _ in range(2)]
    cfg = ModelConfig.preset("certified-alternating", d_model=d, n_heads=4, depth=12, ffn_hidden=4 * d)
    model = UnfoldedTransformer(cfg).eval()
    modes = {"plain": {}, "curve": {"return_energies": True}, "steps": {"return_energies": "steps"},
             "safeguard": {"safeguard": True}}
    times: dict[str, list[float]] = {m: [] for m in modes}
    with torch.no_grad():
        for kw in modes.values():                                         # warm-up
            model(xs[0], **kw)
        for r in tqdm(range(repeats), desc="return_energies", leave=False):
            order = list(modes)[r % len(modes):] + list(modes)[:r % len(modes)]   # rotating order
            for mode in order:
                t0 = time.thread_time()
                model(xs[r % 2], **modes[mode])
                times[mode].append(time.thread_time() - t0)
        out = model(xs[0], return_energies="steps")
    ref = reference_energies(model, xs[0])
    got = {"curve": out.energies, "attention_before": out.attention_before, "attention_after": out.attention_after,
           "ffn_before": out.ffn_before, "ffn_after": out.ffn_after}
    rel = {k: float(((got[k] - v).abs() / s).max()) for k, (v, s) in ref.items()}
    plain = statistics.median(times["plain"])
    return {"times_s": times, "median_s": {m: statistics.median(t) for m, t in times.items()},
            "overhead": {m: statistics.median(t) / plain - 1 for m, t in times.items() if m != "plain"},
            "max_rel_diff": rel, "repeats": repeats}


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


def bench_d(n: int = 8192, d: int = 384) -> dict:
    out = subprocess.run([sys.executable, "-c", CHILD.format(n=n, d=d)], capture_output=True, text=True, check=True)
    return {"n": n, "d": d, "peak_bytes_above_input": int(out.stdout.strip().splitlines()[-1])}


def matmul_peak(dtype: torch.dtype, size: int = 2048, rounds: int = 5) -> float:
    """FLOP/s of a size × size matmul in `dtype` at the current thread count (median of `rounds`)."""
    a = torch.randn(size, size, dtype=dtype)
    a @ a
    times = []
    for _ in range(rounds):
        t0 = time.perf_counter()
        a @ a
        times.append(time.perf_counter() - t0)
    return 2 * size**3 / statistics.median(times)


def bench_peak(threads: list[int], rounds: int, k: int = 30, d: int = 300, heads: int = 1) -> dict:
    """(b) at each thread count with the matmul peak beside it (module doc, (e)); wall-time medians."""
    torch.manual_seed(0)
    lengths = imdb_like_lengths(200)[:k]
    seqs = [torch.randn(n, d, dtype=torch.float64) * 0.3 for n in lengths]
    F = torch.randn(d, d, dtype=torch.float64) / d**0.5
    Y, pad = padded(seqs)
    flop = 2 * sum(lengths) * d * d + 2 * sum(n * n for n in lengths) * (d + heads)
    paths = {"fused (float64)": lambda: attention_energy(Y, F, "exp", pad),
             "gram (float64)": lambda: attention_energy(Y, F, "exp", pad, method="gram")}
    out: dict = {"flop": flop, "real_tokens": sum(lengths), "shape": list(Y.shape), "load_1min": [os.getloadavg()[0]]}
    times: dict = {(t, p): [] for t in threads for p in [*paths, "peak float32", "peak float64"]}
    for _ in range(rounds):
        for t in threads:
            torch.set_num_threads(t)
            times[t, "peak float32"].append(matmul_peak(torch.float32, rounds=3))
            times[t, "peak float64"].append(matmul_peak(torch.float64, rounds=3))
            for name, fn in paths.items():
                t0 = time.perf_counter()
                fn()
                times[t, name].append(time.perf_counter() - t0)
    for t in threads:                                                   # the reference once per thread count
        torch.set_num_threads(t)
        t0 = time.perf_counter()
        for y in seqs:
            pairwise_reference(y, F)
        times[t, "reference"] = [time.perf_counter() - t0]
    out["load_1min"].append(os.getloadavg()[0])
    out["per_threads"] = {str(t): {p: statistics.median(v) for (tt, p), v in times.items() if tt == t}
                          for t in threads}
    return out


def print_peak(res: dict) -> None:
    print(f"(e) one padded batch {' × '.join(map(str, res['shape']))} ({res['real_tokens']:,} real tokens), "
          f"{res['flop'] / 1e9:.2f} GFLOP counted; wall-time medians; 1-minute load "
          f"{res['load_1min'][0]:.1f} → {res['load_1min'][1]:.1f}")
    print("| threads | path | time | vs reference | GFLOP/s | of float64 peak | of float32 peak |")
    print("|---|---|---|---|---|---|---|")
    for t, r in res["per_threads"].items():
        p32, p64 = r["peak float32"], r["peak float64"]
        print(f"| {t} | matmul peak | – | – | {p32 / 1e9:.0f} (float32), {p64 / 1e9:.0f} (float64) | – | – |")
        print(f"| {t} | pair-difference reference | {r['reference']:.2f} s | 1× | – | – | – |")
        for name in ("fused (float64)", "gram (float64)"):
            rate = res["flop"] / r[name]
            print(f"| {t} | {name} | {r[name]:.3f} s | {r['reference'] / r[name]:.0f}× | {rate / 1e9:.1f} | "
                  f"{100 * rate / p64:.0f} % | {100 * rate / p32:.0f} % |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, default=200)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--quick", action="store_true", help="30 samples, 2 repeats")
    parser.add_argument("--peak", action="store_true", help="only (e): (b) at 1 and 2 threads against the matmul peak")
    parser.add_argument("--json", default=None, help="also write the raw numbers to this file")
    parser.add_argument("--only-joint", action="store_true", help="only (c'), the joint model's curve overhead")
    args = parser.parse_args()
    if args.quick:
        args.samples, args.repeats = 30, 2
    torch.set_flush_denormal(True)
    if args.peak:
        res = bench_peak([1, 2], args.repeats)
        print_peak(res)
        if args.json:
            with open(args.json, "w") as fh:
                json.dump({"e": res}, fh, indent=2)
        return
    torch.set_num_threads(args.threads)
    yes = lambda ok: "yes" if ok else "no"                              # noqa: E731
    joint = bench_joint(args.repeats)
    joint_row = (f"| (c') `return_energies=True`, 12-layer certified-joint, B=32 n=128 d=384: "
                 f"{joint['median_s']['plain']:.3f} s → {joint['median_s']['curve']:.3f} s (median of "
                 f"{joint['repeats']}) | +{100 * joint['overhead']:.0f} % | ≤ +15 % | "
                 f"{yes(joint['overhead'] <= 0.15)} |")
    if args.only_joint:
        print(f"torch {torch.__version__}, {args.threads} thread(s), {joint['clock']}")
        print("| benchmark | measured | target | met |\n|---|---|---|---|\n" + joint_row)
        if args.json:
            with open(args.json, "w") as fh:
                json.dump({"c_joint": joint, "threads": args.threads, "machine": environment()}, fh, indent=2)
        return
    (a, b), c, d = bench_ab(args.samples), bench_c(args.repeats), bench_d()
    print(f"torch {torch.__version__}, {args.threads} thread(s), CPU thread time")
    print("| benchmark | measured | target | met |")
    print("|---|---|---|---|")
    print(f"| (a) energies of {a['samples']} sequences (mean {a['mean_len']:.0f}, max {a['max_len']} tokens, d = 300, "
          f"batched by the caller): library {a['library_s']:.2f} s vs pair-difference reference "
          f"{a['reference_s']:.1f} s | {a['speedup']:.0f}× faster, max rel. diff {a['max_rel_diff']:.1e} | "
          f"≥ 50×, ≤ 1e-9 | {yes(a['speedup'] >= 50 and a['max_rel_diff'] <= 1e-9)} |")
    print(f"| (b) one padded batch of {b['samples']} of them ({' × '.join(map(str, b['shape']))}, "
          f"{b['real_tokens']:,} real tokens), one call: library {b['library_s']:.2f} s (Gram path "
          f"{b['gram_s']:.1f} s, {b['gram_speedup']:.0f}×) vs reference {b['reference_s']:.1f} s | "
          f"{b['speedup']:.0f}× faster, max rel. diff {b['max_rel_diff']:.1e} | ≥ 50× | {yes(b['speedup'] >= 50)} |")
    med = c["median_s"]
    targets = {"curve": 0.60, "steps": 1.10, "safeguard": None}
    labels = {"curve": "`return_energies=True` (the curve)", "steps": "`return_energies=\"steps\"` (sub-steps too)",
              "safeguard": "`safeguard=True` (curve, backtracking)"}
    for mode, target in targets.items():
        over = c["overhead"][mode]
        goal, met = (f"≤ +{round(100 * target)} %", yes(over <= target)) if target else ("–", "–")
        print(f"| (c) {labels[mode]}, 12-layer certified, B=32 n=128 d=384: {med['plain']:.3f} s → {med[mode]:.3f} s "
              f"(median of {c['repeats']}) | +{100 * over:.0f} % | {goal} | {met} |")
    print(joint_row)
    worst = max(c["max_rel_diff"].values())
    print(f"| (c) precision of every reported energy vs the float64 Gram reference (curve, 4 sub-step terms) | "
          f"max {worst:.1e} relative | ≤ 1e-5 | {yes(worst <= 1e-5)} |")
    gib = d["peak_bytes_above_input"] / 2**30
    print(f"| (d) peak memory of the energy, n = {d['n']}, d = {d['d']}, 4 heads | {gib:.3f} GiB above the input | "
          f"< 1 GiB | {yes(gib < 1)} |")
    if args.json:
        with open(args.json, "w") as fh:
            json.dump({"a": a, "b": b, "c": c, "c_joint": joint, "d": d, "threads": args.threads}, fh, indent=2)


if __name__ == "__main__":
    main()
