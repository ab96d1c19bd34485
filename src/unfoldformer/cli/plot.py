"""`unfoldformer plot RUN`: the loss, accuracy and energy figures of a run folder.

Writes `loss.png`, `accuracy.png` and (energy models) `energy.png` into RUN from its `metrics.csv`
(`unfoldformer.train.figures`); training writes them at its end too (`--run.plots false`: not).
A finished run's manifest (`complete.json`) is checked first (every file but the figures) and re-pinned
after, so the folder still proves itself and a file changed before the plot is still refused.
"""
from __future__ import annotations

import argparse


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("run", help="a run folder (written by unfoldformer train)")


def run(args: argparse.Namespace) -> int:
    from pathlib import Path

    from ..runs import check_output_location, refresh_manifest, verify_manifest
    from ..train.figures import FIGURES, plot_run

    check_output_location("RUN", Path(args.run))
    verify_manifest(args.run, skip=FIGURES)                       # a changed file is refused, not re-pinned
    for path in plot_run(args.run):
        print(path)
    refresh_manifest(args.run)
    return 0
