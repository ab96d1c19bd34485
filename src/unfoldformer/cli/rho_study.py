"""`unfoldformer rho-study`: what the attention penalty ρ changes, measured (THEORY §4).

Writes figures, `rho_study.md` and `results.json` into `--out` (see `unfoldformer.rho_study.report`).
`--quick` trains its own tiny models and runs alone; the full study reads the trained models and the
accuracy of `benchmarks/accuracy.py --rho` from `--results` (rows without a result file are reported
missing).
"""
from __future__ import annotations

import argparse
from pathlib import Path

from . import add_device_argument, check_device_option


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--rhos", default="exp,log,lp,truncated,linear", help="comma-separated ρ names (exp needed)")
    parser.add_argument("--datasets", default=None, help="comma-separated: sst2,imdb (default: both; --quick: sst2)")
    parser.add_argument("--samples", type=int, default=None, help="sentences per dataset (default 128; --quick 48)")
    parser.add_argument("--quick", action="store_true",
                        help="small models trained here on 1,000 sentences; a few minutes on 2 cores")
    parser.add_argument("--seed", type=int, default=0, help="sentences, initial weights and quick training")
    parser.add_argument("--results", default=None,
                        help="accuracy-benchmark results folder (default: benchmarks/results if it exists here)")
    parser.add_argument("--runs-dir", default=None, help="folder of the benchmark's run folders, if moved")
    parser.add_argument("--data-dir", default=None, help="folder with SST-2.zip / aclImdb_v1.tar.gz")
    parser.add_argument("--threads", type=int, default=1, help="torch CPU threads")
    parser.add_argument("--out", default="rho_study", help="output folder")
    add_device_argument(parser, cpu_only=True)


def run(args: argparse.Namespace) -> int:
    check_device_option(args, "rho-study")
    from tqdm import tqdm

    from ..rho_study import RhoStudySettings, run_rho_study
    from ..rho_study.models import SOURCES

    results = args.results
    if results is None and Path("benchmarks/results").is_dir():
        results = "benchmarks/results"
    settings = RhoStudySettings(rhos=args.rhos, datasets=args.datasets, samples=args.samples, quick=args.quick,
                                seed=args.seed, data_dir=args.data_dir, results_dir=results, runs_dir=args.runs_dir,
                                threads=args.threads, out=args.out)
    total = len(settings.datasets) * len(SOURCES) * len(settings.rhos)
    bars: list = []                                 # the bar starts with the first model, after every check

    def step(description: str) -> None:
        if not bars:
            bars.append(tqdm(total=total, desc="rho-study", unit="model"))
        bars[0].set_postfix_str(description)
        bars[0].update(1)
    try:
        summary = run_rho_study(settings, progress=step)
    finally:
        for bar in bars:
            bar.close()
    print(f"rho-study: {total} models in {summary['wall_seconds']:.0f} s -> {settings.out}/rho_study.md")
    return 0
