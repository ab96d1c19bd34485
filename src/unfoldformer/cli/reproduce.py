"""`unfoldformer reproduce`: the paper's figures 1–6, `report.md`, `report.html` and `results.json` (THEORY §7).

Settings: `paper.settings.ReproduceSettings` (mode defaults of `--quick` or the full run,
overridden by the options given). Missing data or bad options: one line, exit status 2.
"""
from __future__ import annotations

import argparse
import os
from pathlib import Path

from . import add_device_argument, check_device_option


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--figures", default="1-6", help="figures to run: '1-6', '1,2,5' (default 1-6)")
    parser.add_argument("--datasets", default=None,
                        help="data sets of figures 5-6, e.g. 'imdb,sst2' (default: those of the figures)")
    parser.add_argument("--samples", type=int, default=None, help="evaluation samples per data set (200; quick 32)")
    parser.add_argument("--embeddings", default="minilm",
                        help="minilm (384-d, default) | glove:PATH (e.g. glove.840B.300d.txt) | random (300-d)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default="runs/reproduce")
    parser.add_argument("--data-dir", default=None)
    parser.add_argument("--quick", action="store_true",
                        help="small, fast settings (< 2 minutes; smaller trained models, labelled so)")
    parser.add_argument("--train-examples", type=int, default=None,
                        help="training examples of every trained variant (default: as released 2,000, "
                             "the AdamW recipes all of SST-2 / IMDB train; quick: 200 / 8,000 / 4,000)")
    parser.add_argument("--train-epochs", type=int, default=None, help="epochs of every trained variant (1)")
    parser.add_argument("--accuracy-samples", type=int, default=None,
                        help="accuracy examples per data set (SST-2: all 872 dev; IMDB: 2000 test; quick 200)")
    parser.add_argument("--threads", type=int, default=None,
                        help="cores to use: the trainings and curve sets run on this many worker processes of one "
                             f"thread each (default: the machine's cores, {os.cpu_count()})")
    parser.add_argument("--no-progress", action="store_true", help="no tqdm progress bar")
    add_device_argument(parser, cpu_only=True)


def run(args: argparse.Namespace) -> int:
    check_device_option(args, "reproduce")
    from ..paper.report import print_summary
    from ..paper.reproduce import run_reproduction
    from ..paper.settings import ReproduceSettings

    settings = ReproduceSettings.create(
        args.figures, args.datasets, args.quick, samples=args.samples, embeddings=args.embeddings, seed=args.seed,
        out=args.out, data_dir=args.data_dir,
        train_examples=args.train_examples, train_epochs=args.train_epochs, accuracy_samples=args.accuracy_samples,
        threads=args.threads, progress=not args.no_progress)
    results, timings = run_reproduction(settings)
    print_summary(results, timings, Path(settings.out))
    return 0
