"""Inference speed of the certified encoders against the standard Transformer, side by side in one process.

The classifiers are the accuracy benchmark's (width 128, depth 6, 4 heads, FFN width 512, a frozen
384-d table and one linear map, mean pooling, linear head), in eval mode under `torch.inference_mode`.
Variants:

- `standard (as built)`: the baseline's `nn.TransformerEncoder` with PyTorch's MHA fast path switched
  off (`torch.backends.mha.set_fastpath_enabled(False)`), i.e. the module graph as written;
- `standard (fastest)`: the same weights through the fastest eval path PyTorch offers for this
  architecture: the fused encoder-layer kernel (`_transformer_encoder_layer_fwd`, SDPA inside). Nested
  tensors are not available to a pre-LayerNorm encoder (PyTorch refuses them with `norm_first`), so
  padding stays dense;
- every certified kind (`certified-tied`, `certified-untied`, and `certified-joint` where it exists):
  the plain forward, and the forward with `return_energies=True` (the energy curve).

Each round runs every variant once on a fresh batch (the same batch for every variant within a round),
the order rotating every round; medians of wall time (inference is what a user waits for) and of CPU
time are reported, with flush-denormal on. `--threads 1` and `--threads 0` (PyTorch's default: all
cores) give the two thread counts; the 1-minute load average is printed beside the numbers.

    python benchmarks/inference_speed.py [--rounds 7] [--lengths 64 256 1024] [--threads 1] [--json FILE]
"""
from __future__ import annotations

# isort: off
# unfoldformer before torch, as the command line imports it (results measured before 2026-12-05 ran with the
# OMP_WAIT_POLICY=PASSIVE that versions of then set in this order; the library now leaves OpenMP's settings alone)
import unfoldformer  # noqa: F401
# isort: on
import argparse
import os
import statistics
import time

import torch
from tqdm import tqdm

from accuracy import LABELS, MODEL, model_section  # the accuracy benchmark's settings (same folder)
from train_speed import _Table, make_batch
from unfoldformer.train import TrainConfig
from unfoldformer.train.build import build_classifier
from unfoldformer.utils import environment, write_json

CERTIFIED = [k for k in ("certified-tied", "certified-untied", "certified-joint", "certified-joint-untied")
             if k in LABELS]
TARGET = 1.0                                        # certified plain inference ≥ 1.0× the fastest standard path


def _classifier(kind: str, table: _Table):
    cfg = TrainConfig.from_dict({"model": model_section(kind), "data": {"dataset": "imdb"}})
    torch.manual_seed(0)
    return build_classifier(cfg, table).eval()


def variants(table: _Table) -> dict:
    """name -> function(ids, mask) running one inference of that variant."""
    standard = _classifier("standard", table)

    def as_built(ids, mask):
        torch.backends.mha.set_fastpath_enabled(False)
        try:
            return standard(ids, mask)
        finally:
            torch.backends.mha.set_fastpath_enabled(True)

    out = {"standard (as built)": as_built, "standard (fastest)": lambda ids, mask: standard(ids, mask)}
    for kind in CERTIFIED:
        model = _classifier(kind, table)
        out[kind] = lambda ids, mask, m=model: m(ids, mask)
        out[f"{kind} + energies"] = lambda ids, mask, m=model: m(ids, mask, return_energies=True)
    return out


def measure(n: int, rounds: int, batch_size: int, runs: dict, warmup: int = 2) -> dict:
    """{"wall": {variant: [s]}, "cpu": {variant: [s]}}: one inference per variant per round, fresh batches."""
    names = list(runs)
    times = {"wall": {v: [] for v in names}, "cpu": {v: [] for v in names}}
    for r in tqdm(range(warmup + rounds), desc=f"n = {n}", leave=False):
        ids, mask, _ = make_batch(batch_size, n, seed=r)
        order = names[r % len(names):] + names[:r % len(names)]
        for v in order:
            wall, cpu = time.perf_counter(), time.process_time()
            with torch.inference_mode():
                runs[v](ids, mask)
            if r >= warmup:
                times["wall"][v].append(time.perf_counter() - wall)
                times["cpu"][v].append(time.process_time() - cpu)
    return times


def fastest_standard(med_n: dict) -> tuple[str, float]:
    """(variant, median wall s) of the faster standard path at one n: PyTorch's fused encoder-layer fast path is
    not always the faster one (at one thread, n ≥ 256, the module graph as built beats it here)."""
    name = min(("standard (as built)", "standard (fastest)"), key=lambda v: med_n["wall"][v])
    return name, med_n["wall"][name]


def table_lines(med: dict, lengths: list[int]) -> list[str]:
    lines = ["| model | " + " | ".join(f"n = {n}: ms (wall) | n = {n}: vs faster standard" for n in lengths) + " |",
             "|---|" + "---|---|" * len(lengths)]
    for v in med[lengths[0]]["wall"]:
        cells = []
        for n in lengths:
            wall = med[n]["wall"][v]
            ratio = fastest_standard(med[n])[1] / wall
            target = f" (target ≥ {TARGET}×)" if v in CERTIFIED and n in (64, 256) else ""
            cells += [f"{1e3 * wall:.1f}", f"{ratio:.2f}×{target}"]
        lines.append(f"| {v} | " + " | ".join(cells) + " |")
    lines.append("\nfaster standard path: " + ", ".join(f"n = {n}: {fastest_standard(med[n])[0]}" for n in lengths))
    for kind in CERTIFIED:
        ratios = ", ".join(f"n = {n}: {med[n]['wall'][kind + ' + energies'] / med[n]['wall'][kind]:.2f}×"
                           for n in lengths)
        lines.append(f"\n{kind}: energies-on / plain inference {ratios}")
    return lines


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=7)
    p.add_argument("--lengths", type=int, nargs="+", default=[64, 256, 1024])
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--threads", type=int, default=1, help="torch threads (0: PyTorch's default, all cores)")
    p.add_argument("--json", help="also write the measurements here")
    args = p.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    torch.set_flush_denormal(True)
    runs = variants(_Table())
    load_before = os.getloadavg()[0]
    results = {n: measure(n, args.rounds, args.batch_size, runs) for n in args.lengths}
    load_after = os.getloadavg()[0]
    med = {n: {clock: {v: statistics.median(t) for v, t in r[clock].items()} for clock in r}
           for n, r in results.items()}
    print("\n".join(table_lines(med, args.lengths)))
    print(f"\nB = {args.batch_size}, 20 % padding, eval, inference_mode, a fresh batch per round, "
          f"{torch.get_num_threads()} thread(s), flush-denormal on, median of {args.rounds} rounds after 2 warm-up "
          f"rounds; 1-minute load {load_before:.1f} before, {load_after:.1f} after, on {os.cpu_count()} cores; "
          f"{environment()}")
    if args.json:                                                   # written whole (temporary file, then rename)
        write_json(args.json, {
            "batch_size": args.batch_size, "threads": torch.get_num_threads(), "rounds": args.rounds, "model": MODEL,
            "wall_times_s": {n: r["wall"] for n, r in results.items()},
            "cpu_times_s": {n: r["cpu"] for n, r in results.items()},
            "load_average": [load_before, load_after], "machine": environment()}, indent=2)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
