"""Scaling with the sequence length n: time and peak memory of the energy, a forward and a training step.

One sequence (B = 1), n = 128 … 8,192, one thread, float32. Series:

- `energy (fused)`: `attention_energy` of a (1, n, 384) state, 4 heads of width 96 (one fused
  softmax pass, diagonal masked, queries in chunks);
- `energy (dense Gram)`: the same through the float64 Gram path in one (n × n) chunk per head
  (`method="gram", chunk_size=n`), the formulation that materialises every pair;
- `forward (certified)` / `train step (certified)`: the accuracy benchmark's certified encoder
  (width 128, depth 6, 4 heads, FFN 512, tied), without and with gradients (forward, backward of
  mean(Y²), AdamW step);
- `forward (dense)` / `train step (dense)`: the same layers and parameters written as their dense
  formula (pair distances z_ij, weights e^{−z_ij} and their row sums as n × n matrices per head);
- `forward (standard)` / `train step (standard)`: the pre-LN `nn.TransformerEncoder` baseline of the
  same sizes.

Every point runs in a fresh subprocess: build the inputs, warm up at n = 64, reset the peak resident
set size (VmHWM), run once at n (the peak memory above the resident size before the call), then time
`--repeats` more runs (CPU thread time, median). Dense series stop at `--dense-max` (their n × n
matrices). Fitted exponents: least-squares slopes of log time and log memory against log n over
n ≥ 1,024. Writes `benchmarks/results/scaling.png` and `benchmarks/results/speed/scaling.json`.

    python benchmarks/scaling.py [--lengths 128 256 ... 8192] [--repeats 2] [--dense-max 4096]
"""
from __future__ import annotations

# isort: off
# unfoldformer before torch, as the command line imports it (results measured before 2026-12-05 ran with the
# OMP_WAIT_POLICY=PASSIVE that versions of then set in this order; the library now leaves OpenMP's settings alone)
import unfoldformer  # noqa: F401
# isort: on
import argparse
import json
import math
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import torch
from tqdm import tqdm

RESULTS = Path(__file__).resolve().parent / "results"
SERIES = ("energy (fused)", "energy (dense Gram)", "forward (certified)", "forward (dense)", "forward (standard)",
          "train step (certified)", "train step (dense)", "train step (standard)")
DENSE_TRAIN_MAX = 2048          # the dense training step keeps several n × n matrices per layer for backward


# ----------------------------------------------------------------------------- the measured functions
def dense_forward(model, X: torch.Tensor) -> torch.Tensor:
    """The certified stack as its dense formula, with the model's parameters: per layer and head,
    z_ij = ½‖a_i − a_j‖², β = e^{−z}, c ← (1 − α) c + α (ν β c + x) / (ν β1 + 1), then the tied FFN."""
    Y = X
    for ell in range(model.config.depth):
        layer = model.layer(ell)
        att, ffn = layer.attention, layer.ffn
        U = att.subspaces()                                          # (H, d, dh)
        s = att.log_scale.exp()
        nu = (att.lam * s**2)[None, :, None, None]
        V = torch.einsum("bnd,hde->bhne", Y, U)                      # (B, H, n, dh)
        Xh = torch.einsum("bnd,hde->bhne", X, U)
        a = s[None, :, None, None] * V
        sq = (a * a).sum(-1)                                         # (B, H, n)
        z = (0.5 * (sq[..., :, None] + sq[..., None, :]) - a @ a.transpose(-1, -2)).clamp_min(0.0)   # (B, H, n, n)
        beta = torch.exp(-z)
        target = (nu * (beta @ V) + Xh) / (nu * beta.sum(-1, keepdim=True) + 1)
        Y = Y + att.alpha * torch.einsum("bhne,hde->bnd", target - V, U)
        Y = (1 - ffn.alpha) * Y + ffn.alpha * torch.relu(Y @ ffn.W1 + ffn.b) @ ffn.W1.T
    return Y


def check_dense_formula() -> None:
    """The dense formula is the certified encoder's function (float64, n = 40, padding-free)."""
    model = _encoder("certified").double()
    x = torch.randn(2, 40, 128, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    from torch.nn.utils import parametrize
    with torch.no_grad(), parametrize.cached():
        dense, ours = dense_forward(model, x), model(x).hidden
    if not torch.allclose(dense, ours, rtol=1e-10, atol=1e-10):
        raise SystemExit(f"dense formula differs from the model by {float((dense - ours).abs().max()):.3g}")


def _encoder(kind: str):
    from unfoldformer import ModelConfig, StandardTransformer, UnfoldedTransformer
    sizes = dict(d_model=128, n_heads=4, depth=6, ffn_hidden=512)
    torch.manual_seed(0)
    if kind == "standard":
        return StandardTransformer(ModelConfig.preset("standard", **sizes))
    return UnfoldedTransformer(ModelConfig.preset("certified-alternating", **sizes))


def build(series: str, n: int):
    """A function running `series` once at length n (inputs and model built here)."""
    from torch.nn.utils import parametrize

    from unfoldformer.energy import attention_energy
    g = torch.Generator().manual_seed(0)
    if series.startswith("energy"):
        Y = torch.randn(1, n, 384, generator=g)
        F = torch.randn(4, 96, 384, generator=g) / 384**0.5
        if series == "energy (fused)":
            return lambda: attention_energy(Y, F, "exp")
        return lambda: attention_energy(Y, F, "exp", method="gram", chunk_size=n)
    kind = series.split("(")[1].rstrip(")")
    model = _encoder(kind)
    x = torch.randn(1, n, 128, generator=g)

    def forward(inputs):
        if kind == "dense":
            with parametrize.cached():
                return dense_forward(model, inputs)
        return model(inputs).hidden

    if series.startswith("forward"):
        model.eval()

        def run():
            with torch.no_grad():
                forward(x)
        return run
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)

    def step():
        loss = forward(x).pow(2).mean()
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
    return step


def _status(key: str) -> int:
    with open("/proc/self/status") as fh:
        return next(int(line.split()[1]) * 1024 for line in fh if line.startswith(key))


def point(series: str, n: int, repeats: int) -> dict:
    """Peak memory above the inputs (first run) and the median thread time of `repeats` more runs."""
    torch.set_num_threads(1)
    torch.set_flush_denormal(True)
    build(series, 64)()                                              # warm-up: code paths loaded
    run = build(series, n)
    base = _status("VmRSS:")
    with open("/proc/self/clear_refs", "w") as fh:                   # reset the peak resident set size
        fh.write("5")
    t0 = time.thread_time()
    run()
    first = time.thread_time() - t0
    peak = _status("VmHWM:") - base
    times = []
    for _ in range(repeats):
        t0 = time.thread_time()
        run()
        times.append(time.thread_time() - t0)
    return {"series": series, "n": n, "time_s": statistics.median(times) if times else first,
            "peak_bytes": peak, "first_run_s": first}


# ----------------------------------------------------------------------------- driver
def dense_limit(series: str, n: int, dense_max: int) -> bool:
    if "dense" not in series:
        return True
    return n <= (min(dense_max, DENSE_TRAIN_MAX) if series.startswith("train") else dense_max)


def exponent(points: list[dict], key: str, n_min: int = 1024) -> float | None:
    """Least-squares slope of log(key) against log(n) over n ≥ n_min (None with fewer than 2 points)."""
    pts = [(p["n"], p[key]) for p in points if p["n"] >= n_min and p[key] > 0]
    if len(pts) < 2:
        return None
    x, y = np.log([p[0] for p in pts]), np.log([p[1] for p in pts])
    return float(np.polyfit(x, y, 1)[0])


def plot(results: dict[str, list[dict]], path: Path) -> None:
    from unfoldformer.plots import pyplot, save_figure
    plt = pyplot()
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.8))
    styles = {"energy": ("tab:blue", "o"), "forward": ("tab:green", "s"), "train step": ("tab:red", "^")}
    for series, pts in results.items():
        if not pts:
            continue
        kind = series.split(" (")[0]
        color, marker = styles[kind]
        line = "--" if "dense" in series else ":" if "standard" in series else "-"
        ns = [p["n"] for p in pts]
        for ax, key, scale in ((axes[0], "time_s", 1.0), (axes[1], "peak_bytes", 2.0**-20)):
            ax.plot(ns, [max(p[key], 1) * scale if key == "peak_bytes" else p[key] for p in pts],
                    line, color=color, marker=marker, label=series)
    for ax, label in ((axes[0], "CPU time (s), one thread"), (axes[1], "peak memory above the inputs (MiB)")):
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("sequence length n (B = 1)")
        ax.set_ylabel(label)
        ax.grid(True, which="both", alpha=0.3)
    axes[0].legend(fontsize=8)
    fig.suptitle("Energy (d = 384, 4 heads), certified encoder and baseline (d = 128, depth 6): "
                 "solid = library, dashed = dense formula, dotted = standard Transformer", fontsize=9)
    fig.tight_layout()
    save_figure(fig, path)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--lengths", type=int, nargs="+", default=[128, 256, 512, 1024, 2048, 4096, 8192])
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--dense-max", type=int, default=4096)
    p.add_argument("--series", nargs="+", choices=SERIES, default=list(SERIES))
    p.add_argument("--point", nargs=2, metavar=("SERIES", "N"), help=argparse.SUPPRESS)   # child process
    args = p.parse_args(argv)
    if args.point:
        print(json.dumps(point(args.point[0], int(args.point[1]), args.repeats)))
        return 0
    check_dense_formula()
    todo = [(s, n) for s in args.series for n in args.lengths if dense_limit(s, n, args.dense_max)]
    results: dict[str, list[dict]] = {s: [] for s in args.series}
    for series, n in tqdm(todo, desc="scaling"):
        out = subprocess.run([sys.executable, __file__, "--point", series, str(n), "--repeats", str(args.repeats)],
                             capture_output=True, text=True)
        if out.returncode:
            print(f"warning: {series} at n = {n} failed: {out.stderr.strip().splitlines()[-1:]}", file=sys.stderr)
            continue
        results[series].append(json.loads(out.stdout.strip().splitlines()[-1]))
    fits = {s: {"time": exponent(pts, "time_s"), "memory": exponent(pts, "peak_bytes")} for s, pts in results.items()}
    header = "| series | " + " | ".join(f"n = {n}" for n in args.lengths) + " | exponent: time / memory |"
    print(header + "\n|---|" + "---|" * (len(args.lengths) + 1))
    for series, pts in results.items():
        by_n = {pt["n"]: pt for pt in pts}
        cells = [f"{by_n[n]['time_s']:.3g} s, {by_n[n]['peak_bytes'] / 2**20:.0f} MiB" if n in by_n else "–"
                 for n in args.lengths]
        fit = fits[series]
        fmt = lambda v: "–" if v is None else f"{v:.2f}"            # noqa: E731
        print(f"| {series} | " + " | ".join(cells) + f" | {fmt(fit['time'])} / {fmt(fit['memory'])} |")
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "speed").mkdir(exist_ok=True)
    from unfoldformer.utils import environment, write_json
    write_json(RESULTS / "speed" / "scaling.json", {"points": results, "exponents": fits, "repeats": args.repeats,
                                                    "machine": environment()})
    plot(results, RESULTS / "scaling.png")
    print(f"\nCPU thread time (median of {args.repeats} after a first run), one thread, float32, B = 1; peak memory: "
          f"VmHWM above the resident size before the first run. Exponents over n ≥ 1024. "
          f"Figure: {RESULTS / 'scaling.png'}")
    return 0 if all(math.isfinite(p["time_s"]) for pts in results.values() for p in pts) else 1


if __name__ == "__main__":
    raise SystemExit(main())
