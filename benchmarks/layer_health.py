"""Per-layer health of trained certified models: do the tokens keep their size and spread, and how
many ReLU units of the FFN step are active? Explains a run that ends at chance (`accuracy_study.py`).

    python benchmarks/layer_health.py RUN_DIR [RUN_DIR ...] [--samples 64] [--json FILE]

For each run folder (an `unfoldformer train` run of an unfolded model with the tied FFN, F2) and a
fixed random sample of its evaluation split at its training length, per layer ℓ: the mean token norm
after the attention step and after the layer, the share of (token, unit) pairs with ReLU(Y W1 + b) > 0
in the FFN step, and the token spread (mean distance of a token to the mean token of the sample);
and the standard deviation of the classifier's logits over the samples (≈ 0: the output no longer
depends on the input). Prints a markdown table; `--json` writes the numbers whole or not at all.
"""
from __future__ import annotations

import argparse
import random
import sys
from pathlib import Path

import torch

from unfoldformer.data import load_dataset
from unfoldformer.train import load_classifier
from unfoldformer.utils import write_json


def _mean_norm(Y: torch.Tensor, real: torch.Tensor) -> float:
    return Y[real].norm(dim=-1).mean().item()                     # Y (B, n, d), real (B, n)


def _spread(Y: torch.Tensor, real: torch.Tensor) -> float:
    tokens = Y[real]                                               # (N, d)
    return (tokens - tokens.mean(0)).norm(dim=-1).mean().item()


@torch.no_grad()
def health(run_dir: Path, samples: int, data_dir: str | None) -> dict:
    """The per-layer statistics of one run's final weights on `samples` fixed evaluation examples."""
    loaded = load_classifier(run_dir / "last.safetensors", data_dir=data_dir)
    cfg, model = loaded.config, loaded.model
    examples = load_dataset(cfg.data.dataset, cfg.eval_split, cfg.data.data_dir)
    examples = random.Random(0).sample(examples, min(samples, len(examples)))
    enc = loaded.embeddings.encode([e.text for e in examples], cfg.data.max_length)
    mask, real = enc.padding_mask, ~enc.padding_mask               # (B, n) bool
    X = model.project(model.embedding(enc.ids))                    # (B, n, d)
    Y, layers, blocks = X, [], model.encoder.layers
    for i in range(cfg.model_config().depth):                      # a tied model has one block, run depth times
        layer = blocks[i % len(blocks)]
        after_attention = layer.attention(Y, X, mask)              # (B, n, d), U of `UnfoldedLayer.forward`
        pre = after_attention @ layer.ffn.W1 + layer.ffn.b         # (B, n, m)
        Y = layer.ffn(after_attention, mask)                       # the layer's output, from the same U
        layers.append({"norm_after_attention": _mean_norm(after_attention, real),
                       "relu_active": (pre[real] > 0).float().mean().item(),
                       "norm_after_layer": _mean_norm(Y, real), "spread_after_layer": _spread(Y, real)})
    logits, _ = model(enc.ids, mask)                               # (B, C)
    return {"run": str(run_dir), "kind": cfg.model.kind, "lr": cfg.optim.lr, "samples": len(examples),
            "input_norm": _mean_norm(X, real), "input_spread": _spread(X, real),
            "logit_std": logits.std(0).mean().item(), "layers": layers}


def table(records: list[dict]) -> str:
    head = "| run | layer | norm after attention | ReLU active (%) | norm after layer | spread after layer |"
    lines = [head, "|---|---|---|---|---|---|"]
    for r in records:
        name = Path(r["run"]).name
        lines.append(f"| {name} (logit std {r['logit_std']:.2g}) | input | – | – | {r['input_norm']:.3f} | "
                     f"{r['input_spread']:.3f} |")
        for i, s in enumerate(r["layers"], 1):
            lines.append(f"| {name} | {i} | {s['norm_after_attention']:.3f} | {100 * s['relu_active']:.1f} | "
                         f"{s['norm_after_layer']:.3f} | {s['spread_after_layer']:.4f} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("runs", nargs="+", type=Path, help="run folders of `unfoldformer train`")
    p.add_argument("--samples", type=int, default=64)
    p.add_argument("--data-dir", help="data folder (default: the one saved with each run, or $UNFOLDFORMER_DATA)")
    p.add_argument("--json", type=Path, help="write the numbers here")
    args = p.parse_args(argv)
    torch.set_num_threads(1)
    records = []
    for run in args.runs:
        print(f"layer health: {run}", file=sys.stderr)
        records.append(health(run, args.samples, args.data_dir))
    print(table(records))
    if args.json:
        write_json(args.json, {"samples": args.samples, "runs": records})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
