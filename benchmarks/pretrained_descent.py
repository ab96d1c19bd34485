"""Every layer of the distilled encoders beside the probe of their teacher, on the same texts.

    python benchmarks/pretrained_descent.py            # writes benchmarks/results/pretrained/descent-sst2.json
    python benchmarks/pretrained_descent.py --table    # prints its table (make_docs.py writes it into the docs)

The texts are the probe's (`unfoldformer probe --model minilm --dataset sst2 --samples 200`: 200 SST-2 dev
sentences, `probe.report.sample_texts`, seed 0, at most 128 word pieces), read from the teacher's probe record
`benchmarks/results/probe/minilm-sst2.json`, whose per-layer columns are set beside the students'. For each zoo
encoder (`minilm-l6-certified`, `minilm-l6-certified-untied`) and each layer ℓ: the share of sentences whose layer
energy E_ℓ fell (float64 energies of the float32 states, judged with the float32 descent tolerance, no
safeguard) and the median relative change (E_ℓ(after) − E_ℓ(before)) / |E_ℓ(before)|, the probe's definition.
The teacher's energy is the one the probe builds from the PSD parts of each layer's own heads (THEORY §6): a
measurement of a model trained without any energy; the students' is the energy their layers are certified on.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

from unfoldformer.descent import descent_tolerance, lowered
from unfoldformer.distill import DistilledEncoder
from unfoldformer.probe.report import sample_texts
from unfoldformer.utils import write_json

ROOT = Path(__file__).resolve().parent.parent
PROBE = ROOT / "benchmarks" / "results" / "probe" / "minilm-sst2.json"
OUT = ROOT / "benchmarks" / "results" / "pretrained" / "descent-sst2.json"
STUDENTS = ("minilm-l6-certified", "minilm-l6-certified-untied")


def student_layers(name: str, texts: list[str], max_length: int, batch_size: int = 32) -> dict:
    """Per layer of zoo encoder `name` on `texts`: share of texts whose layer energy fell, median relative change."""
    model = DistilledEncoder.from_pretrained(name).eval()
    tol = descent_tolerance(torch.float32)
    fell, rel, energies = [], [], []
    with torch.no_grad():
        for start in range(0, len(texts), batch_size):
            ids, mask = model.word_pieces.encode(texts[start:start + batch_size], max_length)
            _, out = model(ids, mask, return_energies=True)
            before, after = out.layer_before, out.layer_after     # (B, T) float64
            fell.append(lowered(before, after, tol))
            rel.append((after - before) / before.abs())
            energies.append(torch.stack([before, after], -1))     # (B, T, 2)
    fell_all, rel_all = torch.cat(fell), torch.cat(rel)           # (N, T)
    medians = torch.cat(energies).median(0).values                 # (T, 2) median E_ℓ before, after
    return {"share_lowered": fell_all.double().mean(0).tolist(),
            "median_relative_change": rel_all.median(0).values.tolist(),
            "median_energy_before": medians[:, 0].tolist(), "median_energy_after": medians[:, 1].tolist(),
            "every_layer_lowered": int(fell_all.all(1).sum()), "texts": len(texts), "tolerance": tol}


def run() -> Path:
    probe = json.loads(PROBE.read_text())
    cfg = probe["config"]
    texts = sample_texts(cfg["dataset"], cfg["split"], probe["samples"], cfg["seed"])
    record = {"texts": {k: cfg[k] for k in ("dataset", "split", "seed", "max_length")} | {"samples": len(texts)},
              "teacher": {"command": probe["command"], "per_layer": probe["per_layer"]}, "students": {}}
    for name in STUDENTS:
        t0 = time.perf_counter()
        record["students"][name] = student_layers(name, texts, cfg["max_length"]) | {
            "seconds": time.perf_counter() - t0}
        print(name, record["students"][name], flush=True)
    write_json(OUT, record)
    return OUT


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--table", action="store_true", help="print the table from the results file")
    args = parser.parse_args()
    if args.table:
        from docs_reports import pretrained_descent  # same folder
        sys.stdout.write(pretrained_descent(OUT.parents[1]))
    else:
        print(run())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
