"""Fresh tasks at default settings: certified models against `nn.TransformerEncoder` on tasks nobody here tuned for.

    python benchmarks/fresh_tasks.py run --task digits --model joint-tied --lr 3e-3 --seed 0
    python benchmarks/fresh_tasks.py run --task keywords --model standard --seed 0      # through the CLI
    python benchmarks/fresh_tasks.py run --task listops --model joint-tied --seed 0
    python benchmarks/fresh_tasks.py run --task imdb8 --model standard --seed 0         # through the CLI
    python benchmarks/fresh_tasks.py baselines       # ListOps read-outs without attention (the gap's diagnosis)

Each cell writes benchmarks/results/fresh/TASK-MODEL-lrLR-seedS.json (accuracy, final training loss, parameters,
step time, settings); `make_docs.py` builds the table of docs/results/fresh.md from those files.

Tasks (data: `fresh_data.py`, every generator seeded):
- `digits`: sklearn's 8 × 8 digits as 16 tokens of 2 × 2 pixels (row-major patches), a linear input map to width 64
  plus a learned position table, 4 layers, 4 heads, FFN 256, a final LayerNorm, mean pooling, a linear head; AdamW
  (weight decay 0.01), batch 64, 600 steps, constant lr; 1,437 training and 360 test images (a fixed seeded split).
- `keywords`: a 3-topic keyword CSV (240 rows, `fresh_data.keyword_csv`, seed 0) trained with the command line,
  `python -m unfoldformer train --data.train_file F --model.d_model 16 --model.depth 2 --optim.epochs 3`, every
  other setting the CLI's default (lr 1e-3 unless `--lr`), scored on the CLI's held-out 10 % (24 rows).
- `imdb8`: IMDB's star ratings as 8 classes (1–4 and 7–10, from the file names), trained with the command line
  on a seeded 6,000 of the training reviews and scored on a seeded 2,000 of the test reviews
  (`--data.eval_file`), 128 word pieces, 1 epoch, every other setting the CLI's default (width 128, depth 6,
  MiniLM's frozen word-piece table, lr 1e-3, batch 32).
- `listops`: ListOps with LRA's rules (MAX, MIN, MED, SM over digits, nested; `fresh_data.listops_tokens`) reduced
  to fit two shared CPU cores: 2,000 training and 2,000 test expressions of at most 512 tokens (depth ≤ 10, ≤ 10
  arguments), width 64, 4 layers, batch 32, 300 steps; otherwise as `digits` (token embeddings instead of patches).

Models: `standard` (pre-LN `nn.TransformerEncoder`, GELU, dropout 0, final LayerNorm), `joint-tied` and
`joint-untied` (the `certified` preset through `CertifiedEncoder`, THEORY §3.7), `alternating-tied` (the
`certified-alternating` preset, for reference). Certified models take the preset's defaults: nothing is tuned per task.
Control (diagnosis only, `results/fresh/diagnosis/`): `standard-tied`, one pre-LN `nn.TransformerEncoderLayer` applied
`depth` times, the standard model with its weights tied across depth as the tied certified stack's are.
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch
from torch import nn

import fresh_data
import unfoldformer as uf
from unfoldformer.config import ModelConfig
from unfoldformer.utils import write_json

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "benchmarks" / "results" / "fresh"
MODELS = ("standard", "joint-tied", "joint-untied", "alternating-tied", "standard-tied")
#: Controls, not cells of the suite: their files go to results/fresh/diagnosis/.
CONTROLS = ("standard-tied",)
#: The CLI's `model.kind` of each model (keywords).
CLI_KINDS = {"standard": "standard", "joint-tied": "certified", "joint-untied": "certified-untied",
             "alternating-tied": "certified-alternating"}
#: Per task: width, depth, steps, batch, default lr (the issue's settings).
SETTINGS = {"digits": dict(width=64, depth=4, steps=600, batch=64, lr=3e-3),
            "listops": dict(width=64, depth=4, steps=300, batch=32, lr=1e-3, train=2000, test=2000),
            "keywords": dict(width=16, depth=2, epochs=3, lr=1e-3),
            "imdb8": dict(train=6000, test=2000, max_length=128, epochs=1, lr=1e-3)}


class SharedLayerEncoder(nn.Module):
    """One `nn.TransformerEncoderLayer` applied `depth` times (the weights tied across depth, as the tied certified
    stack's are): the control that separates what tying costs from what the certified layer costs."""

    def __init__(self, layer: nn.Module, depth: int):
        super().__init__()
        self.layer, self.depth = layer, depth

    def forward(self, src: torch.Tensor, src_key_padding_mask: torch.Tensor | None = None) -> torch.Tensor:
        for _ in range(self.depth):
            src = self.layer(src, src_key_padding_mask=src_key_padding_mask)   # (B, n, width)
        return src


def encoder(model: str, width: int, depth: int, overrides: dict | None = None) -> nn.Module:
    """The model's encoder with 4 heads and FFN 4·width; a final LayerNorm follows in `Classifier`. `overrides`:
    `ModelConfig` fields of a certified model (the diagnosis runs; the suite itself uses none)."""
    if model in ("standard", "standard-tied"):
        layer = nn.TransformerEncoderLayer(width, 4, 4 * width, dropout=0.0, activation="gelu", batch_first=True,
                                           norm_first=True)
        if model == "standard-tied":
            return SharedLayerEncoder(layer, depth)
        return nn.TransformerEncoder(layer, depth, enable_nested_tensor=False)
    preset = "certified-alternating" if model.startswith("alternating") else "certified"
    cfg = ModelConfig.preset(preset, d_model=width, n_heads=4, ffn_hidden=4 * width, depth=depth,
                             tied=not model.endswith("untied"), **(overrides or {}))
    return uf.CertifiedEncoder.from_config(cfg)


class Classifier(nn.Module):
    """Input map (+ learned positions) → encoder → final LayerNorm → mean over real tokens → linear head."""

    def __init__(self, model: str, inputs, n_tokens: int, width: int, depth: int, n_classes: int,
                 overrides: dict | None = None, pool: str = "mean"):
        super().__init__()
        self.inputs = inputs()                                     # built here, after the seed is set
        self.positions = nn.Parameter(0.02 * torch.randn(n_tokens, width))
        self.encoder = encoder(model, width, depth, overrides)
        self.pool = pool                                           # "mean"; "mean+first" (diagnosis only)
        read = 2 * width if pool == "mean+first" else width
        self.norm, self.head = nn.LayerNorm(width), nn.Linear(read, n_classes)

    def forward(self, x: torch.Tensor, pad: torch.Tensor | None = None) -> torch.Tensor:
        h = self.inputs(x) + self.positions[: x.shape[1]]          # (B, n, width)
        h = self.norm(self.encoder(h, src_key_padding_mask=pad))   # (B, n, width)
        pooled = uf.classifier.masked_mean(h, pad)                 # (B, width)
        if self.pool == "mean+first":
            pooled = torch.cat([pooled, h[:, 0]], dim=-1)          # (B, 2·width) and the first token's state
        return self.head(pooled)                                   # (B, C)


def _data(task: str, s: dict):
    """(x_train, pad_train, y_train, x_test, pad_test, y_test, input map factory, tokens, classes) at the settings `s`
    (ListOps: `train` expressions; the suite's 2,000 are the first 2,000 of any larger set)."""
    if task == "digits":
        x, y = fresh_data.digits_patches()
        order = torch.randperm(len(y), generator=torch.Generator().manual_seed(1234))
        tr, te = order[:1437], order[1437:]
        return x[tr], None, y[tr], x[te], None, y[te], lambda: nn.Linear(4, s["width"]), 16, 10
    ids_tr, pad_tr, y_tr = fresh_data.listops_tokens(s["train"], seed=0)
    ids_te, pad_te, y_te = fresh_data.listops_tokens(s["test"], seed=1)   # the first 500: the old test
    n = max(ids_tr.shape[1], ids_te.shape[1])
    grow = lambda t, fill: torch.nn.functional.pad(t, (0, n - t.shape[1]), value=fill)   # noqa: E731
    table = lambda: nn.Embedding(len(fresh_data.LISTOPS_VOCAB), s["width"], padding_idx=0)  # noqa: E731
    return (grow(ids_tr, 0), grow(pad_tr, True), y_tr, grow(ids_te, 0), grow(pad_te, True), y_te, table, n, 10)


def run_in_process(task: str, model: str, lr: float, seed: int, overrides: dict | None = None,
                   pool: str = "mean", steps: int | None = None, train: int | None = None) -> dict:
    s = SETTINGS[task] | ({} if steps is None else {"steps": steps}) | ({} if train is None else {"train": train})
    xtr, ptr, ytr, xte, pte, yte, inputs, n_tokens, n_classes = _data(task, s)
    torch.manual_seed(seed)
    net = Classifier(model, inputs, n_tokens, s["width"], s["depth"], n_classes, overrides, pool)
    opt = torch.optim.AdamW(net.parameters(), lr=lr, weight_decay=0.01)
    g = torch.Generator().manual_seed(seed)
    losses, start = [], time.perf_counter()
    for _ in range(s["steps"]):
        idx = torch.randint(0, len(ytr), (s["batch"],), generator=g)
        pad = None if ptr is None else ptr[idx]
        loss = nn.functional.cross_entropy(net(xtr[idx], pad), ytr[idx])
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    step_ms = 1000 * (time.perf_counter() - start) / s["steps"]
    net.eval()
    with torch.no_grad():
        right = torch.cat([net(xte[i:i + 256], None if pte is None else pte[i:i + 256]).argmax(1) == yte[i:i + 256]
                           for i in range(0, len(yte), 256)])              # (test,) bool
    first = {"accuracy_first500": right[:500].double().mean().item()} if task == "listops" else {}
    return {"accuracy": right.double().mean().item(), **first, "correct": "".join("01"[int(c)] for c in right),
            "train_loss": sum(losses[-50:]) / len(losses[-50:]),
            "params": sum(p.numel() for p in net.parameters()), "step_ms": step_ms, "test_examples": len(yte),
            "settings": s | {"lr": lr}}


def _imdb8_csv(path: Path, split: str, k: int, stream: int) -> None:
    """A seeded k of IMDB `split` as a text,label CSV, the label the review's star rating."""
    import csv

    from pretrained import imdb_ratings  # same folder: the ratings from the archive's file names
    from unfoldformer.data import load_imdb
    from unfoldformer.data.batching import seeded_subset
    reviews, stars = load_imdb(split), imdb_ratings(split)
    with path.open("w", newline="", encoding="utf-8") as f:
        writer = csv.writer(f)
        writer.writerow(["text", "label"])
        for i in seeded_subset(len(reviews), k, 0, stream):
            writer.writerow([reviews[i].text, str(stars[i])])


def run_cli(model: str, lr: float, seed: int, overrides: dict | None = None, task: str = "keywords") -> dict:
    """A task trained and scored through the command line (keywords, imdb8)."""
    s = SETTINGS[task]
    with tempfile.TemporaryDirectory() as tmp:
        data, out = Path(tmp) / f"{task}.csv", Path(tmp) / "run"
        if task == "keywords":
            data.write_text(fresh_data.keyword_csv(240, seed=0))
            sizes = ["--model.d_model", str(s["width"]), "--model.depth", str(s["depth"])]
        else:                                                       # imdb8: the CLI's default model sizes
            _imdb8_csv(data, "train", s["train"], 1)
            _imdb8_csv(Path(tmp) / "test.csv", "test", s["test"], 2)
            sizes = ["--data.eval_file", str(Path(tmp) / "test.csv"), "--data.max_length", str(s["max_length"])]
        cmd = [sys.executable, "-m", "unfoldformer", "train", "--data.train_file", str(data),
               "--model.kind", CLI_KINDS[model], *sizes,
               "--optim.epochs", str(s["epochs"]), "--optim.lr", str(lr), "--optim.seed", str(seed),
               "--run.out_dir", str(out), "--run.progress", "false", "--run.plots", "false",
               "--run.tensorboard", "false", "--run.threads", "1"]
        for name, value in (overrides or {}).items():
            cmd += [f"--model.{name}", str(value)]
        subprocess.run(cmd, check=True, capture_output=True, text=True)
        summary = json.loads((out / "summary.json").read_text())
    final = summary["final"]
    return {"accuracy": final["eval"]["accuracy"] if "eval" in final else final.get("eval_accuracy"),
            "train_loss": final.get("train_loss", final.get("loss")), "params": final.get("params"),
            "step_ms": 1000 * summary["train_time_s"] / max(summary["steps"], 1), "steps": summary["steps"],
            "settings": s | {"lr": lr}, "final": final}


def listops_baselines(c_grid=(0.1, 1.0, 10.0, 100.0)) -> dict:
    """What simple read-outs of ListOps reach (the diagnosis of the certified models' gap): logistic regression on
    (a) the bag of tokens (each token's frequency in the expression) and (b) the bag plus the identity of the first
    token (the outermost operator: one position every expression has). The same training and test expressions as
    the suite (`SETTINGS`); C chosen on the last 400 training expressions, then refitted on all 2,000 and scored
    once on the test."""
    import numpy as np
    from sklearn.linear_model import LogisticRegression
    ids_tr, pad_tr, y_tr = fresh_data.listops_tokens(SETTINGS["listops"]["train"], seed=0)
    ids_te, pad_te, y_te = fresh_data.listops_tokens(SETTINGS["listops"]["test"], seed=1)
    vocab = len(fresh_data.LISTOPS_VOCAB)

    def bag(ids, pad):                                              # (N, V) token frequencies
        counts = torch.zeros(ids.shape[0], vocab, dtype=torch.float64)
        counts.scatter_add_(1, ids, (~pad).to(torch.float64))
        return (counts / counts.sum(1, keepdim=True)).numpy()

    def first(ids):                                                 # (N, V) one-hot of the first token
        return np.eye(vocab)[ids[:, 0].numpy()]
    features = {"bag of tokens": (bag(ids_tr, pad_tr), bag(ids_te, pad_te)),
                "bag of tokens + first token": (np.hstack([bag(ids_tr, pad_tr), first(ids_tr)]),
                                                np.hstack([bag(ids_te, pad_te), first(ids_te)]))}
    ytr, yte = y_tr.numpy(), y_te.numpy()
    out = {"majority class": float(np.bincount(yte).max() / len(yte))}
    for name, (xtr, xte) in features.items():
        fit = lambda c, x, y: LogisticRegression(C=c, max_iter=5000).fit(x, y)   # noqa: E731
        best = max(c_grid, key=lambda c: fit(c, xtr[:1600], ytr[:1600]).score(xtr[1600:], ytr[1600:]))
        out[name] = {"accuracy": float(fit(best, xtr, ytr).score(xte, yte)), "C": best}
    return out


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run", help="one cell: task, model, lr, seed")
    run.add_argument("--task", choices=tuple(SETTINGS), required=True)
    run.add_argument("--model", choices=MODELS, required=True)
    run.add_argument("--lr", type=float, default=None, help="default: the task's (SETTINGS)")
    run.add_argument("--seed", type=int, default=0)
    run.add_argument("--set", nargs="*", default=[], metavar="FIELD=VALUE",
                     help="ModelConfig overrides of a certified model (diagnosis only), e.g. anchor_weight=16")
    run.add_argument("--pool", choices=("mean", "mean+first"), default="mean",
                     help="read-out (diagnosis only): mean over tokens, or that and the first token's state")
    run.add_argument("--steps", type=int, default=None, help="training steps (diagnosis only; default: the task's)")
    run.add_argument("--train", type=int, default=None,
                     help="ListOps training expressions (diagnosis only; default 2,000)")
    sub.add_parser("baselines", help="ListOps read-outs without attention (bag of tokens, + first token)")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    if args.command == "baselines":
        record = listops_baselines()
        write_json(OUT / "diagnosis" / "listops-baselines.json", record)
        print(json.dumps(record))
        return
    if args.model in CONTROLS and args.task in ("keywords", "imdb8"):
        parser.error(f"--model {args.model} is a control of the in-process tasks (digits, listops)")
    if args.train is not None and args.task != "listops":
        parser.error("--train is for listops")
    if (args.pool != "mean" or args.steps is not None) and args.task in ("keywords", "imdb8"):
        parser.error(f"--pool and --steps are for the in-process tasks (digits, listops); {args.task} runs through "
                     "the CLI")
    lr = SETTINGS[args.task]["lr"] if args.lr is None else args.lr
    overrides = {k: json.loads(v) if v[:1].isdigit() or v in ("true", "false") else v
                 for k, v in (item.split("=", 1) for item in args.set)}
    record = run_cli(args.model, lr, args.seed, overrides, args.task) if args.task in ("keywords", "imdb8") \
        else run_in_process(args.task, args.model, lr, args.seed, overrides, args.pool, args.steps, args.train)
    record = {"task": args.task, "model": args.model, "lr": lr, "seed": args.seed, **record,
              "default_lr": lr == SETTINGS[args.task]["lr"], "threads": 1, "overrides": overrides,
              "pool": args.pool}
    tag = "".join(f"-{k}{v}" for k, v in sorted(overrides.items())) + ("" if args.pool == "mean" else "-pool_first")
    tag += ("" if args.steps is None else f"-steps{args.steps}") + ("" if args.train is None else f"-train{args.train}")
    diagnosis = overrides or args.pool != "mean" or args.steps is not None or args.train is not None \
        or args.model in CONTROLS
    folder = OUT / "diagnosis" if diagnosis else OUT                # the table reads only the suite's cells
    write_json(folder / f"{args.task}-{args.model}{tag}-lr{lr:g}-seed{args.seed}.json", record)
    print(json.dumps({k: record[k] for k in ("task", "model", "lr", "seed", "accuracy", "train_loss")}))


if __name__ == "__main__":
    main()
