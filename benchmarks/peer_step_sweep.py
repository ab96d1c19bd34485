"""How far the trained Energy Transformer's descent holds: its energy curve on the evaluation split at
its trained step size α and at larger ones (same weights, only α changed at evaluation).

    python benchmarks/peer_step_sweep.py RUN_DIR [--scales 1 2 5 10 20] [--limit 872] [--json FILE]

RUN_DIR is an `energy-transformer` run of `benchmarks/accuracy.py` (its `last.safetensors` is read).
For each α = scale × trained α: the share of samples whose energy never rises over the T steps (up to
float32 round-off, `descent_tolerance`), the share of rising steps, and the accuracy (the function
changes with α).
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch

from unfoldformer.data.batching import eval_batches
from unfoldformer.descent import descent_tolerance, lowered
from unfoldformer.train.build import load_split
from unfoldformer.train.checkpoint import load_classifier
from unfoldformer.utils import environment


@torch.no_grad()
def sweep(run: Path, scales: list[float], limit: int | None) -> dict:
    loaded = load_classifier(run / "last.safetensors")
    cfg, model = loaded.config, loaded.model.eval()
    if cfg.model.kind != "energy-transformer":
        raise SystemExit(f"{run}: an energy-transformer run is needed, got {cfg.model.kind}")
    ds = load_split(cfg, loaded.embeddings, cfg.eval_split, limit)
    batches = eval_batches(ds.lengths(cfg.data.max_length), 64)
    trained = model.encoder.config.energy_step
    tol = descent_tolerance(torch.float32)
    rows = []
    for scale in scales:
        model.encoder.config.energy_step = trained * scale
        n = monotone = correct = 0
        rising = 0.0
        for batch in batches:
            ids, mask, labels = ds.collate(batch, cfg.data.max_length, loaded.embeddings.pad_id)
            logits, out = model(ids, mask, return_energies=True)
            ok = lowered(out.energies[:, :-1], out.energies[:, 1:], tol)        # (B, T)
            monotone += int(ok.all(1).sum())
            rising += float((~ok).double().mean(1).sum())
            correct += int((logits.argmax(1) == labels).sum())
            n += len(batch)
        rows.append({"scale": scale, "step_size": trained * scale, "monotone_share": monotone / n,
                     "rising_step_share": rising / n, "accuracy": correct / n, "n": n})
        print(f"alpha = {trained * scale:.3g}: never rises {100 * monotone / n:.1f} %, rising steps "
              f"{100 * rising / n:.1f} %, accuracy {100 * correct / n:.1f} %")
    model.encoder.config.energy_step = trained
    return {"run": str(run), "dataset": cfg.data.dataset, "split": cfg.eval_split, "trained_step_size": trained,
            "max_length": cfg.data.max_length, "rows": rows, "machine": environment()}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("run", type=Path)
    p.add_argument("--scales", type=float, nargs="+", default=[1, 2, 5, 10, 20])
    p.add_argument("--limit", type=int, help="a fixed seed-0 subset of the eval split")
    p.add_argument("--json", help="also write the results here")
    args = p.parse_args(argv)
    torch.set_num_threads(1)
    result = sweep(args.run, args.scales, args.limit)
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
