"""Training-step speed of the accuracy benchmark's models and its peers, measured side by side in one process.

The models are built exactly as in `benchmarks/accuracy.py` (width 128, depth 6, 4 heads, FFN width
512, frozen 384-d table + one linear map, mean pooling, linear head, AdamW), plus two variants: the
tied certified model without a learned basis (`learn_basis=False`) and the untied one with the Cayley
orthogonal map (`basis_map="cayley"`). One training step (forward, backward, optimizer step) of each
runs in turn, round after round, the order rotating every round, so every model sees the same machine
state.

- **A fresh batch every round** (the same batch for every model within a round). Repeating one batch
  lets the certified models' gradients turn subnormal after a few steps, each step then running
  3–18× slower; flush-denormal is set as well (`torch.set_flush_denormal(True)`), as a guard.
- **CPU thread time and wall time**: the medians of both are reported; speed ratios use thread time
  (`time.thread_time`, this thread's own CPU), which other processes on the machine move far less
  than wall time.
- **Load warning**: when the wall time exceeded the thread time by more than 15 % (the process waited
  for a core) or the 1-minute load average exceeded the number of cores, the output says so.

Batches: 32 sequences at the benchmark's training lengths, SST-2 n = 64 and IMDB n = 256, with the
last 20 % of every sequence padding (exercising the padding masks).

    python benchmarks/train_speed.py [--rounds 7] [--lengths 64 256] [--threads 1] [--json FILE]
    python benchmarks/train_speed.py --rho log lp truncated linear --json FILE

The joint certified models (`certified-joint`, `certified-joint-untied`: THEORY §3.7, one MM step per
layer) also print their speed relative to the alternating certified model of the same size.

`--rho` adds the certified models with each named attention penalty ρ (variants `certified-tied:log`,
…), stepping in the same rounds, and prints their speed relative to the same model with ρ = exp.
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
import torch.nn.functional as F
from tqdm import tqdm

from accuracy import LABELS, MODEL, OPTIM, RHO_MODELS, model_section  # the accuracy benchmark's settings
from unfoldformer.rho import RHO_FAMILY
from unfoldformer.train import TrainConfig
from unfoldformer.train.build import build_classifier, make_optimizer
from unfoldformer.utils import environment, write_json

NAMES = {"certified-tied": "certified-alternating (tied)", "certified-untied": "certified-alternating (untied)",
         "paper": "paper preset", "standard": "standard pre-LN Transformer",
         "certified-tied-fixed-basis": "certified-alternating (tied), learn_basis=False",
         "certified-untied-cayley": "certified-alternating (untied), Cayley map",
         "energy-transformer": "Energy Transformer (peer)", "crate": "CRATE (peer)",
         "energy-transformer-explicit": "Energy Transformer (peer), explicit n × n step (0.2.0)",
         "certified-joint": "certified (joint, tied, one MM step per layer)",
         "certified-joint-untied": "certified-untied (joint)"}
#: variant -> (kind, model overrides)
VARIANTS = {**{kind: (kind, {}) for kind in LABELS if kind != "paper-as-released"},   # (the released formulas need
            # one head at width 300: not this benchmark's size; they are not trained for accuracy either)
            "certified-tied-fixed-basis": ("certified-tied", {"learn_basis": False}),
            "certified-untied-cayley": ("certified-untied", {"basis_map": "cayley"}),
            "energy-transformer-explicit": ("energy-transformer", {})}
TARGETS = {"certified-tied": {64: 1.2, 256: 1.1}, "certified-untied": {64: 1.05, 256: 1.05},
           "certified-joint": {64: 1.2, 256: 1.1}}

#: joint variant -> the alternating certified model of the same size it is compared with
JOINT_PEERS = {"certified-joint": "certified-tied", "certified-joint-untied": "certified-untied"}


class _Table:
    """A stand-in for the MiniLM table (speed does not depend on its values): (V, 384)."""

    def __init__(self, vocab: int = 30522, dim: int = 384) -> None:
        self.table, self.pad_id = torch.randn(vocab, dim, generator=torch.Generator().manual_seed(0)), 0


def variant_model(variant: str) -> tuple[str, dict]:
    """(kind, model overrides) of a variant; `KIND:RHO` is that certified model with attention penalty ρ."""
    if variant in VARIANTS:
        return VARIANTS[variant]
    kind, _, rho = variant.partition(":")
    return kind, {"rho": rho}


def variant_name(variant: str) -> str:
    kind, _, rho = variant.partition(":")
    return NAMES[variant] if variant in NAMES else f"{NAMES[kind]}, ρ = {rho}"


def training_step(variant: str, table: _Table):
    """A function running one AdamW training step of the benchmark model `variant` on a given batch."""
    kind, overrides = variant_model(variant)
    cfg = TrainConfig.from_dict({"model": {**model_section(kind), **overrides}, "data": {"dataset": "imdb"},
                                 "optim": {k: OPTIM[k] for k in ("lr", "weight_decay")}})
    torch.manual_seed(0)
    model = build_classifier(cfg, table)
    if variant == "energy-transformer-explicit":                     # the explicit reference at every n
        model.encoder.fused = False
    optimizer = make_optimizer(model, cfg)

    def step(batch: tuple[torch.Tensor, torch.Tensor, torch.Tensor]) -> None:
        ids, mask, labels = batch
        logits, _ = model(ids, mask)                                 # (B, classes)
        loss = F.cross_entropy(logits, labels)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
    return step


def make_batch(batch_size: int, n: int, seed: int = 0):
    """Random token ids (B, n), the last 20 % of every row padding, random labels (B,)."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(1, 30000, (batch_size, n), generator=g)      # (B, n)
    mask = torch.zeros(batch_size, n, dtype=torch.bool)              # (B, n) True = padding
    mask[:, max(1, int(0.8 * n)):] = True
    return ids, mask, torch.randint(0, 2, (batch_size,), generator=g)


def measure(n: int, rounds: int, batch_size: int, table: _Table, variants: list[str], warmup: int = 2) -> dict:
    """{"thread": {variant: [s]}, "wall": {variant: [s]}}: one step per variant per round, fresh batches.
    CPU time is this thread's (`time.thread_time`) with one torch thread, the process's otherwise."""
    clock = time.thread_time if torch.get_num_threads() == 1 else time.process_time
    steps = {v: training_step(v, table) for v in variants}
    times: dict[str, dict[str, list[float]]] = {"thread": {v: [] for v in variants}, "wall": {v: [] for v in variants}}
    for r in tqdm(range(warmup + rounds), desc=f"n = {n}", leave=False):
        batch = make_batch(batch_size, n, seed=r)
        order = variants[r % len(variants):] + variants[:r % len(variants)]   # rotating order
        for v in order:
            wall, cpu = time.perf_counter(), clock()
            steps[v](batch)
            cpu, wall = clock() - cpu, time.perf_counter() - wall
            if r >= warmup:
                times["thread"][v].append(cpu)
                times["wall"][v].append(wall)
    return times


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=7)
    p.add_argument("--lengths", type=int, nargs="+", default=[64, 256])
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--variants", nargs="+", choices=list(VARIANTS), default=list(VARIANTS))
    p.add_argument("--json", help="also write the measurements here")
    p.add_argument("--rho", nargs="+", default=[], choices=sorted(set(RHO_FAMILY) - {"exp"}),
                   help="also step the certified models with these attention penalties")
    args = p.parse_args(argv)
    args.variants = list(args.variants) + [f"{m}:{r}" for r in args.rho for m in RHO_MODELS]
    if args.threads:                                                # 0: PyTorch's default (all cores)
        torch.set_num_threads(args.threads)
    torch.set_flush_denormal(True)
    table = _Table()
    load_before = os.getloadavg()[0]
    results = {n: measure(n, args.rounds, args.batch_size, table, args.variants) for n in args.lengths}
    load_after = os.getloadavg()[0]
    med = {n: {kind: {v: statistics.median(t) for v, t in r[kind].items()} for kind in r} for n, r in results.items()}
    # ratios: CPU thread time at one thread (other processes move it far less than wall time); wall time at more
    # threads, where the calling thread's CPU time leaves out the work of the others
    clock = "thread" if torch.get_num_threads() == 1 else "wall"
    lines = ["| model | " + " | ".join(f"n = {n}: s/step (CPU) | n = {n}: s/step (wall) | n = {n}: speed vs standard"
                                      for n in args.lengths) + " |",
             "|---|" + "---|---|---|" * len(args.lengths)]
    for v in args.variants:
        cells = []
        for n in args.lengths:
            cpu, wall = med[n]["thread"][v], med[n]["wall"][v]
            times = med[n][clock]
            ratio = times["standard"] / times[v] if "standard" in times else float("nan")
            target = TARGETS.get(v, {}).get(n)
            cells += [f"{cpu:.3f}", f"{wall:.3f}", f"{ratio:.2f}×" + (f" (target ≥ {target}×)" if target else "")]
            kind = v.partition(":")[0]
            if ":" in v and kind in times:                            # and relative to the same model with exp
                cells[-1] += f" ({times[kind] / times[v]:.2f}× exp)"
            alternating = JOINT_PEERS.get(v)
            if alternating in times:                                  # and relative to the alternating layer
                cells[-1] += f" ({times[alternating] / times[v]:.2f}× alternating)"
        lines.append(f"| {variant_name(v)} | " + " | ".join(cells) + " |")
    print("\n".join(lines))
    print(f"\nB = {args.batch_size}, 20 % padding, a fresh batch per round, {torch.get_num_threads()} thread(s), "
          f"flush-denormal on, median of {args.rounds} rounds after 2 warm-up rounds; ratios from "
          f"{'CPU thread' if clock == 'thread' else 'wall'} time; {environment()}")
    waited = max(statistics.median(r["wall"][v]) / statistics.median(r["thread"][v])
                 for r in results.values() for v in args.variants)
    cores = os.cpu_count() or 1
    if waited > 1.15 or max(load_before, load_after) > cores:
        print(f"warning: the machine was loaded (1-minute load average {load_before:.1f} before, {load_after:.1f} "
              f"after, on {cores} cores; wall time up to {waited:.2f}× the thread time): absolute times are "
              "inflated, the side-by-side ratios much less so")
    if args.json:
        write_json(args.json, {                                     # written whole (temporary file, then rename)
            "batch_size": args.batch_size, "threads": torch.get_num_threads(), "rounds": args.rounds, "model": MODEL,
            "flush_denormal": True, "fresh_batch_per_round": True,
            "clock": "thread_time" if clock == "thread" else "wall",
            "step_times_s": {n: r["thread"] for n, r in results.items()},
            "wall_times_s": {n: r["wall"] for n, r in results.items()},
            "load_average": [load_before, load_after], "machine": environment()}, indent=2)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
