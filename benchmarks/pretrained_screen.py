"""Screening of distillation settings on a small slice: loss, sentence term, readout, frozen vs trained input.

    python benchmarks/pretrained_screen.py --settings base cosine no-sentence      # one result file per setting
    python benchmarks/pretrained_screen.py --table                                 # the table of all of them

Every setting trains the same student (certified joint, tied, MiniLM's width 384, depth 6, 12 heads,
FFN 1536, ρ = exp) for `--steps` steps of 16 windows on the first 2,000 windows of the seeded SST-2
training corpus (sentences, at most 64 pieces), holding out its last 256, and reports the held-out token
cosine, sentence cosine (mean-pooled, the quantity a probe reads) and ‖p − t‖² / ‖t‖² of the final weights.
Results: benchmarks/results/pretrained/screen-<setting>.json, written whole.
"""
from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "src"))

from unfoldformer.distill.config import DistillConfig  # noqa: E402
from unfoldformer.distill.loop import distill  # noqa: E402
from unfoldformer.utils import write_json  # noqa: E402

RESULTS = HERE / "results" / "pretrained"
BASE = dict(sources=("sst2",), limit=2000, holdout=256, max_length=64, batch_size=16, tied=True, loss="mse",
            sentence_weight=1.0, readout="linear", trainable_embeddings=False, lr=1e-3, warmup=0.05,
            checkpoint_every=10_000, eval_every=10_000, log_every=50, seed=0)
SETTINGS = {
    "base": {},                                             # mse + 1.0 x sentence cosine, frozen input, linear
    "cosine": {"loss": "cosine"},
    "no-sentence": {"sentence_weight": 0.0},
    "trained-input": {"trainable_embeddings": True},
    "identity-readout": {"readout": "identity"},
    "layernorm-readout": {"readout": "layernorm"},
}


def run(name: str, steps: int) -> dict:
    cfg_fields = {**BASE, **SETTINGS[name], "steps": steps}
    with tempfile.TemporaryDirectory() as tmp:
        cfg = DistillConfig(out=str(Path(tmp) / "run"), **cfg_fields)
        started = time.time()
        summary = distill(cfg)
    result = {"setting": name, "changes": SETTINGS[name], "config": {**cfg.to_dict(), "out": None},
              "wall_s": round(time.time() - started, 1),
              **{k: summary[k] for k in ("steps", "epochs", "windows", "held_out")},
              **{k: round(v, 4) for k, v in summary.items() if k.startswith("val_")}}
    write_json(RESULTS / f"screen-{name}.json", result)
    return result


def table() -> str:
    rows = ["| setting | changes | held-out token cosine | held-out sentence cosine | ‖p − t‖²/‖t‖² | s |",
            "|---|---|---|---|---|---|"]
    for name in SETTINGS:
        path = RESULTS / f"screen-{name}.json"
        if path.is_file():
            r = json.loads(path.read_text())
            changes = r["changes"] or "mse + sentence, frozen, linear"
            rows.append(f"| {name} | {changes} | {r['val_token_cosine']:.4f} | {r['val_sentence_cosine']:.4f} | "
                        f"{r['val_token_rel_mse']:.4f} | {r['wall_s']:.0f} |")
    return "\n".join(rows)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--settings", nargs="+", choices=list(SETTINGS), default=[])
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--table", action="store_true", help="print the table of the results on disk")
    args = parser.parse_args()
    for name in args.settings:
        result = run(name, args.steps)
        print(json.dumps(result), flush=True)
    if args.table:
        print(table())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
