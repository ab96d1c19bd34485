"""Turn a finished distillation run into a zoo encoder: `src/unfoldformer/zoo/encoders/NAME/`.

    python tools/zoo_encoder.py runs/distill-untied minilm-l6-certified [--probes PROBES_JSON]

Reads the run's `model/` (float32), rebuilds its corpus (same sources, length and seed) to take the run's
own held-out windows, and measures on them, against the teacher: the token and sentence cosines and the
relative squared error of the float32 weights and of the weights rounded to float16, and every layer's
energy before and after its step (float64 energies of the float16-stored weights, judged with the float32
descent tolerance, no safeguard: the share of windows where every layer lowered its energy). The weights
are stored in float16 when that moves the held-out sentence cosine by less than `--max-change` (else
float32). The folder (`save_pretrained`: weights, config.json, a Hugging Face-style README.md card,
complete.json) is written to a temporary folder and renamed into place, so it is whole or absent; an
existing entry is refused unless `--replace`. The measures go to
`benchmarks/results/pretrained/zoo-NAME.json`.
"""
from __future__ import annotations

import argparse
import copy
import json
import shutil
import sys
import tempfile
from pathlib import Path

import numpy as np
import torch

from unfoldformer.descent import descent_tolerance, lowered
from unfoldformer.distill import DistilledEncoder, Teacher
from unfoldformer.distill.config import DistillConfig
from unfoldformer.distill.corpus import build_corpus, corpus_texts
from unfoldformer.distill.loop import held_out_measures
from unfoldformer.utils import write_json
from unfoldformer.zoo import ENCODERS_DIR

RESULTS = Path(__file__).resolve().parents[1] / "benchmarks" / "results" / "pretrained"


def descent_share(student: DistilledEncoder, corpus, rows, batch_size: int = 32) -> dict:
    """Windows where every layer lowered its own energy (float64 energies, float32 tolerance), and the largest
    change (E_after - E_before) / (1 + |E_before|) over all layers and windows (negative: every step lowered)."""
    tol = descent_tolerance(torch.float32)
    ok, worst, n = 0, -float("inf"), 0
    with torch.no_grad():
        for start in range(0, len(rows), batch_size):
            ids, mask = corpus.batch(rows[start:start + batch_size], student.word_pieces)
            _, out = student(ids, mask, return_energies=True)
            before, after = out.layer_before, out.layer_after                         # (B, T) float64
            ok += int(lowered(before, after, tol).all(dim=1).sum())
            worst = max(worst, float(((after - before) / (1 + before.abs())).max()))
            n += len(ids)
    return {"windows": n, "every_layer_lowered": ok, "share": ok / n, "worst_relative_change": worst,
            "tolerance": tol}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("run", type=Path)
    parser.add_argument("name")
    parser.add_argument("--probes", type=Path, default=None, help="probes-*.json of this model (its accuracies)")
    parser.add_argument("--max-change", type=float, default=1e-3)
    parser.add_argument("--replace", action="store_true")
    args = parser.parse_args()
    target = ENCODERS_DIR / args.name
    if target.exists() and not args.replace:
        sys.exit(f"{target} exists; pass --replace to write it again")
    settings = json.loads((args.run / "config.json").read_text())["distill"]
    cfg = DistillConfig(**{k: v for k, v in settings.items() if k != "sources"}, sources=tuple(settings["sources"]))
    summary = json.loads((args.run / "summary.json").read_text())
    student = DistilledEncoder.from_pretrained(args.run / "model").eval()
    teacher = Teacher(cfg.teacher)
    corpus = build_corpus(corpus_texts(cfg.sources, cfg.data_dir), teacher.word_pieces, cfg.max_length, cfg.seed)
    n = min(len(corpus), cfg.limit or len(corpus))
    held_out = np.arange(n - cfg.holdout, n)
    rounded = copy.deepcopy(student).half().float()
    full = held_out_measures(student, teacher, corpus, held_out, "cpu")
    half = held_out_measures(rounded, teacher, corpus, held_out, "cpu")
    store_half = abs(full["val_sentence_cosine"] - half["val_sentence_cosine"]) < args.max_change
    descent = descent_share(rounded if store_half else student, corpus, held_out)
    probes = json.loads(args.probes.read_text()) if args.probes else {}
    record = {"name": args.name, "run": str(args.run), "run_id": summary["run_id"], "steps": summary["steps"],
              "batch_size": cfg.batch_size, "epochs": summary["epochs"], "windows": summary["windows"],
              "held_out": len(held_out), "float32": full, "float16": half,
              "stored": "float16" if store_half else "float32", "descent": descent, "probes": probes}
    print(json.dumps(record, indent=1))
    chosen = rounded.half() if store_half else student
    metrics = {"held-out token cosine": round(half["val_token_cosine"] if store_half else full["val_token_cosine"], 4),
               "held-out sentence cosine": round((half if store_half else full)["val_sentence_cosine"], 4),
               "held-out windows where every layer lowered its energy":
                   f"{descent['every_layer_lowered']} / {descent['windows']}"}
    for task, value in (probes.get("accuracy") or {}).items():
        metrics[f"linear probe, {task}"] = round(value, 4)
    chosen.card = {"metrics": metrics,
                   "training": f"{summary['steps']} steps of {cfg.batch_size} windows "
                               f"({summary['epochs']:.2f} epochs), loss {cfg.loss} + {cfg.sentence_weight} x "
                               f"sentence cosine, lr {cfg.lr}; run "
                               f"{summary['run_id']}; weights stored in {record['stored']}, widened to float32 on "
                               "load",
                   "data": f"{summary['windows']:,} windows (SST-2 training sentences, IMDB training and "
                           "unlabelled reviews; <= 128 word pieces; no evaluation split)"}
    ENCODERS_DIR.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=ENCODERS_DIR) as tmp:
        folder = chosen.save_pretrained(Path(tmp) / args.name)
        if target.exists():
            shutil.rmtree(target)
        folder.rename(target)
    write_json(RESULTS / f"zoo-{args.name}.json", record)
    print(f"wrote {target}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
