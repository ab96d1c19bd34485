"""Training-step speed of the accuracy benchmark's four models, measured side by side.

The accuracy runs report each model's training tokens/s, but those runs take tens of minutes
each and, on a shared 2-core machine, overlap with other work, so their ratios mix machine
load into the model cost. This benchmark measures the ratio directly: the four models are
built exactly as in `benchmarks/accuracy.py` (width 128, depth 6, 4 heads, FFN width 512,
frozen 384-d table + one linear map, mean pooling, linear head, AdamW), and one training step
(forward, backward, optimizer step) of each runs in turn, round after round, on the same
batch, so every model sees the same machine state. Reported: the median step time over the
rounds and the speed relative to the standard Transformer (its median time / the model's).

Batches: 32 sequences at the benchmark's training lengths, SST-2 n = 64 and IMDB n = 256,
with the last 20 % of every sequence padding (exercising the padding masks).

    python benchmarks/train_speed.py [--rounds 7] [--lengths 64 256] [--threads 1] [--json FILE]
    python benchmarks/train_speed.py --rho log lp truncated linear --json FILE

`--rho` adds the certified models with each named attention penalty ρ (keys `certified-tied:log`, …),
stepping in the same rounds, and prints their speed relative to the same model with ρ = exp.
"""
from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from accuracy import MODEL, OPTIM, RHO_MODELS, model_section  # the accuracy benchmark's settings (same folder)
from unfoldformer.rho import RHO_FAMILY
from unfoldformer.train import KINDS, TrainConfig
from unfoldformer.train.build import build_classifier, make_optimizer
from unfoldformer.utils import environment

NAMES = {"certified-tied": "certified (tied)", "certified-untied": "certified (untied)",
         "paper": "paper preset", "standard": "standard pre-LN Transformer"}


class _Table:
    """A stand-in for the MiniLM table (speed does not depend on its values): (V, 384)."""

    def __init__(self, vocab: int = 30522, dim: int = 384) -> None:
        self.table, self.pad_id = torch.randn(vocab, dim, generator=torch.Generator().manual_seed(0)), 0


def training_step(kind: str, batch: tuple[torch.Tensor, torch.Tensor, torch.Tensor], table: _Table):
    """A closure running one AdamW training step of the benchmark model `kind` on `batch`."""
    model, _, rho = kind.partition(":")                               # "certified-tied:log": that model, ρ = log
    cfg = TrainConfig.from_dict({"model": model_section(model, rho or "exp"), "data": {"dataset": "imdb"},
                                 "optim": {k: OPTIM[k] for k in ("lr", "weight_decay")}})
    torch.manual_seed(0)
    model = build_classifier(cfg, table)
    optimizer = make_optimizer(model, cfg)
    ids, mask, labels = batch

    def step() -> None:
        logits, _ = model(ids, mask)                                 # (B, classes)
        loss = F.cross_entropy(logits, labels)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
    return step


def make_batch(batch_size: int, n: int, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(1, 30000, (batch_size, n), generator=g)      # (B, n)
    mask = torch.zeros(batch_size, n, dtype=torch.bool)              # (B, n) True = padding
    mask[:, max(1, int(0.8 * n)):] = True
    return ids, mask, torch.randint(0, 2, (batch_size,), generator=g)


def measure(n: int, rounds: int, batch_size: int, table: _Table, kinds=KINDS) -> dict[str, list[float]]:
    batch = make_batch(batch_size, n)
    steps = {kind: training_step(kind, batch, table) for kind in kinds}
    for step in steps.values():                                      # warm-up (allocations, caches)
        step()
    times: dict[str, list[float]] = {kind: [] for kind in steps}
    for _ in range(rounds):
        for kind, step in steps.items():
            start = time.perf_counter()
            step()
            times[kind].append(time.perf_counter() - start)
    return times


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=7)
    p.add_argument("--lengths", type=int, nargs="+", default=[64, 256])
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--json", help="also write the measurements here")
    p.add_argument("--rho", nargs="+", default=[], choices=sorted(set(RHO_FAMILY) - {"exp"}),
                   help="also step the certified models with these attention penalties")
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    table = _Table()
    kinds = KINDS + tuple(f"{m}:{r}" for r in args.rho for m in RHO_MODELS)
    results = {n: measure(n, args.rounds, args.batch_size, table, kinds) for n in args.lengths}
    lines = ["| model | " + " | ".join(f"n = {n}: s/step (median of {args.rounds}) | n = {n}: speed vs standard"
                                      for n in args.lengths) + " |",
             "|---|" + "---|---|" * len(args.lengths)]
    for kind in kinds:
        cells = []
        for n in args.lengths:
            med, base = statistics.median(results[n][kind]), statistics.median(results[n]["standard"])
            cells += [f"{med:.3f}", f"{base / med:.2f}×"]
            if ":" in kind:                                            # and relative to the same model with exp
                cells[-1] += f" ({statistics.median(results[n][kind.partition(':')[0]]) / med:.2f}× exp)"
        model, _, rho = kind.partition(":")
        lines.append(f"| {NAMES[model]}{f', ρ = {rho}' if rho else ''} | " + " | ".join(cells) + " |")
    print("\n".join(lines))
    print(f"\nB = {args.batch_size}, 20 % padding, {args.threads} thread(s); {environment()}")
    if args.json:
        Path(args.json).write_text(json.dumps({"batch_size": args.batch_size, "threads": args.threads,
                                               "model": MODEL, "step_times_s": results,
                                               "machine": environment()}, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
