"""Fine-tuning from the distilled encoder against the same architecture from scratch and MiniLM itself.

    python benchmarks/pretrained_finetune.py --models distilled scratch minilm --seeds 0 1 2 \
        [--encoder minilm-l6-certified] [--train-examples 2000] [--epochs 3]
Accuracy is that of the final weights (no selection on the dev split), as in the accuracy benchmark.
    python benchmarks/pretrained_finetune.py --table            # results/pretrained/finetune.md

SST-2 (the dev split, 872 sentences, all of it), a seeded subset of `--train-examples` training sentences,
`--epochs` epochs, at most 64 word pieces; the accuracy benchmark's optimiser (AdamW, lr 1e-3, weight decay
0.01, 10 % warmup then cosine, batch 32, clipping 1.0) for the certified models:
- `distilled`: `unfoldformer train --model.init ENCODER` (its certified layers and MiniLM's input layer;
  a pooled LayerNorm and a new head; every layer keeps its certificate);
- `scratch`: the same classifier with the encoder's layers at a fresh seeded initialisation (a
  `DistilledEncoder` of the same config, saved and passed as `--model.init`);
- `minilm`: all-MiniLM-L6-v2 itself (transformers), mean pooling over real tokens, a linear head, every
  weight trained, AdamW lr 5e-5 (lr 1e-3 diverges a pretrained BERT), the same batches, warmup and schedule.
Results: `benchmarks/results/pretrained/finetune-<model>-seed<k>.json`, written whole.
"""
from __future__ import annotations

import argparse
import json
import math
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "src"))

from unfoldformer.data import load_dataset  # noqa: E402
from unfoldformer.data.batching import seeded_subset  # noqa: E402
from unfoldformer.recipe import TrainConfig  # noqa: E402
from unfoldformer.utils import write_json  # noqa: E402

RESULTS = HERE / "results" / "pretrained"
OPTIM = {"lr": 1e-3, "weight_decay": 0.01, "warmup": 0.1, "batch_size": 32, "grad_clip": 1.0}
MAX_LENGTH = {"sst2": 64, "imdb": 126}
EVAL = {"sst2": ("dev", None), "imdb": ("test", 1000)}             # (split, fixed seeded subset or all)


def certified(model: str, seed: int, args) -> dict:
    from unfoldformer.distill import DistilledEncoder
    from unfoldformer.train import train
    with tempfile.TemporaryDirectory() as tmp:
        init = args.encoder
        if model == "scratch":                                            # same architecture, fresh layers
            torch.manual_seed(seed)
            fresh = DistilledEncoder(DistilledEncoder.from_pretrained(args.encoder).config)
            init = str(fresh.save_pretrained(Path(tmp) / "scratch"))
        cfg = TrainConfig.from_dict({
            "model": {"init": init, "trainable_embeddings": args.trainable_embeddings},
            "data": {"dataset": args.dataset, "max_length": MAX_LENGTH[args.dataset], "embeddings": "minilm",
                     "max_train_examples": args.train_examples, "max_eval_examples": EVAL[args.dataset][1]},
            "optim": {**OPTIM, "lr": args.lr, "epochs": args.epochs, "seed": seed},
            "run": {"out_dir": str(Path(tmp) / "run"), "progress": False, "checkpoint_every": 10_000}})
        summary = train(cfg)
    final = summary["final"]                                              # the final weights: no selection on dev
    return {"accuracy": final["eval_accuracy"], "eval_n": final["eval_n"], "steps": summary["steps"],
            "train_loss": final["train_loss"], "lr": args.lr, "trainable_embeddings": args.trainable_embeddings}


def minilm(seed: int, args) -> dict:
    from unfoldformer.distill import Teacher, mean_pool
    teacher = Teacher("minilm")
    bert = teacher.model.train()
    bert.requires_grad_(True)
    torch.manual_seed(seed)
    head = torch.nn.Linear(teacher.dim, 2)
    split, limit = EVAL[args.dataset]
    train_set, dev = load_dataset(args.dataset, "train"), load_dataset(args.dataset, split)
    rows = seeded_subset(len(train_set), args.train_examples)          # the training pipeline's subsets
    kept = seeded_subset(len(dev), limit)
    dev = dev if kept is None else [dev[i] for i in kept]
    texts, labels = [train_set[i].text for i in rows], torch.tensor([train_set[i].label for i in rows])
    params = list(bert.parameters()) + list(head.parameters())
    optimizer = torch.optim.AdamW(params, lr=args.minilm_lr, weight_decay=OPTIM["weight_decay"])
    steps_per_epoch = math.ceil(len(texts) / OPTIM["batch_size"])
    total, warm = args.epochs * steps_per_epoch, int(round(OPTIM["warmup"] * args.epochs * steps_per_epoch))
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: (s + 1) / max(warm, 1) if s < warm else
                                                 0.5 * (1 + math.cos(math.pi * (s - warm) / max(total - warm, 1))))

    def logits(batch_texts):
        ids, mask = teacher.word_pieces.encode(batch_texts, MAX_LENGTH[args.dataset] + 2)
        states = bert(input_ids=ids, attention_mask=(~mask).long()).last_hidden_state      # (B, n, d)
        return head(mean_pool(states, mask))

    generator = np.random.default_rng(seed)
    for _ in range(args.epochs):
        order = generator.permutation(len(texts))
        for start in range(0, len(texts), OPTIM["batch_size"]):
            idx = order[start:start + OPTIM["batch_size"]]
            loss = torch.nn.functional.cross_entropy(logits([texts[i] for i in idx]), labels[idx])
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(params, OPTIM["grad_clip"])
            optimizer.step()
            schedule.step()
    bert.eval()
    correct = 0
    with torch.no_grad():
        for start in range(0, len(dev), 64):
            part = dev[start:start + 64]
            correct += int((logits([e.text for e in part]).argmax(-1) == torch.tensor([e.label for e in part])).sum())
    return {"accuracy": correct / len(dev), "lr": args.minilm_lr}


def variant(model: str, lr: float, trainable_embeddings: bool) -> str:
    """The result files' name of a model at its settings: `distilled`, or `distilled-lr0.0003-embeddings`
    for a certified model at another lr than the benchmark's 1e-3 or with its word-piece table trained."""
    if model == "minilm":
        return model
    return model + ("" if lr == OPTIM["lr"] else f"-lr{lr:g}") + ("-embeddings" if trainable_embeddings else "")


def _label(rec: dict) -> str:
    """A row's model column: the name, with the settings that differ from the benchmark's."""
    settings = []
    if rec["model"] != "minilm" and rec.get("lr", OPTIM["lr"]) != OPTIM["lr"]:
        settings.append(f"lr {rec['lr']:g}")
    if rec.get("trainable_embeddings"):
        settings.append("word table trained")
    return rec["model"] + (f" ({', '.join(settings)})" if settings else "")


def table() -> str:
    rows: dict = {}
    for path in sorted(RESULTS.glob("finetune-*-seed*.json")):
        rec = json.loads(path.read_text())
        rows.setdefault((rec["dataset"], _label(rec)), []).append(100 * rec["accuracy"])
    lines = ["| data (evaluation) | model | accuracy, mean ± sd (%) | seeds |", "|---|---|---|---|"]
    for dataset, evaluation in (("sst2", "SST-2 dev"), ("imdb", "IMDB test, 1,000")):
        for label in sorted((k[1] for k in rows if k[0] == dataset), key=lambda k: (k.split()[0] != "distilled",
                                                                                     k.split()[0], k)):
            acc = np.array(rows[dataset, label])
            spread = f" ± {acc.std(ddof=1):.1f}" if len(acc) > 1 else " (one seed)"
            seeds = ", ".join(f"{a:.1f}" for a in acc)
            lines.append(f"| {evaluation} | {label} | {acc.mean():.1f}{spread} | {seeds} |")
    return "\n".join(lines) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dataset", choices=tuple(MAX_LENGTH), default="sst2")
    parser.add_argument("--models", nargs="+", default=["distilled", "scratch", "minilm"])
    parser.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    parser.add_argument("--encoder", default="minilm-l6-certified")
    parser.add_argument("--train-examples", type=int, default=2000)
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--minilm-lr", type=float, default=5e-5)
    parser.add_argument("--lr", type=float, default=OPTIM["lr"], help="the certified models' peak lr")
    parser.add_argument("--trainable-embeddings", action="store_true",
                        help="train the certified models' word-piece table too (outside the energy)")
    parser.add_argument("--table", action="store_true")
    args = parser.parse_args()
    if args.table:
        text = table()
        (RESULTS / "finetune.md").write_text(text)
        print(text)
        return 0
    for seed in args.seeds:
        for model in args.models:
            name = variant(model, args.lr, args.trainable_embeddings)
            path = RESULTS / f"finetune-{args.dataset}-{name}-seed{seed}.json"
            if path.exists():
                continue
            started = time.time()
            result = minilm(seed, args) if model == "minilm" else certified(model, seed, args)
            record = {"model": model, "seed": seed, "encoder": args.encoder if model != "minilm" else None,
                      "dataset": args.dataset, "eval": "dev (872)" if args.dataset == "sst2" else "test (1,000)",
                      "train_examples": args.train_examples, "epochs": args.epochs,
                      "max_length": MAX_LENGTH[args.dataset], **result, "wall_s": time.time() - started}
            write_json(path, record)
            print(f"{model} seed {seed}: {100 * record['accuracy']:.2f} % ({record['wall_s']:.0f} s)", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
