"""Train a certified classifier on your own labelled file, evaluate it and predict by label name.

    python examples/own_data.py [OUT_DIR]

Writes a small three-class CSV (`message`, `queue` columns) into OUT_DIR (default: a temporary folder),
trains the joint certified model on it through the Python API — the same run as
`unfoldformer train --data.train_file tickets.csv --data.text_column message --data.label_column queue
--model.kind certified` — then evaluates the held-out split the run made, and predicts new texts,
printing each label by name with its per-token energy curve E/n. Any CSV, TSV, JSONL, Parquet file or
`datasets` folder works the same way (docs/guides/own-data.md). UNFOLDFORMER_EXAMPLE_TINY=1 runs at a
tiny size (the test suite does).
"""
from __future__ import annotations

import csv
import os
import random
import sys
import tempfile
from pathlib import Path

import unfoldformer as uf
from unfoldformer.train import TrainConfig, evaluate_checkpoint, train

TINY = os.environ.get("UNFOLDFORMER_EXAMPLE_TINY") == "1"
WORDS = {"billing": "card refund invoice charged payment twice".split(),
         "shipping": "parcel courier tracking delivery arrived late".split(),
         "account": "login password locked email reset username".split()}
FILLER = "please help my the was again still with".split()


def write_tickets(path: Path, rows: int, seed: int = 0) -> None:
    """A three-class CSV: each message mixes its queue's words with filler words."""
    rng = random.Random(seed)
    with open(path, "w", newline="", encoding="utf-8") as handle:
        writer = csv.writer(handle)
        writer.writerow(["message", "queue"])
        for i in range(rows):
            queue = list(WORDS)[i % 3]
            words = rng.sample(WORDS[queue], 3) + rng.sample(FILLER, 4)
            rng.shuffle(words)
            writer.writerow([" ".join(words), queue])


def main() -> int:
    out = Path(sys.argv[1]) if len(sys.argv) > 1 else Path(tempfile.mkdtemp(prefix="unfoldformer-own-data-"))
    out.mkdir(parents=True, exist_ok=True)
    write_tickets(out / "tickets.csv", rows=60 if TINY else 600)
    cfg = TrainConfig().with_overrides([
        "--data.train_file", str(out / "tickets.csv"), "--data.text_column", "message",
        "--data.label_column", "queue", "--model.kind", "certified",
        "--model.depth", "2" if TINY else "6", "--optim.epochs", "2" if TINY else "4",
        "--optim.batch_size", "8", "--run.out_dir", str(out / "run"), "--run.progress", "false",
        "--run.tensorboard", "false", "--run.device", "cpu"])
    train(cfg)
    result = evaluate_checkpoint(out / "run" / "last.safetensors")
    print(f"held-out accuracy {result['accuracy']:.3f} on {result['n']} messages; classes {result['label_names']}")
    predictor = uf.load(out / "run" / "last.safetensors")
    for p in predictor.predict(["I was charged twice, please refund my card", "my parcel tracking says late"]):
        curve = " ".join(f"{e:.3g}" for e in p.energies_per_token)
        print(f"{p.label_name:8s} p={[round(x, 3) for x in p.probabilities]}  E/n: {curve}  | {p.text}")
        assert p.label_name in WORDS
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
