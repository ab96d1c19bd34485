"""`unfoldformer plot RUN`: the loss, accuracy and energy figures of a run folder.

Writes `loss.png`, `accuracy.png` and (energy models) `energy.png` into RUN from its `metrics.csv`
(`unfoldformer.train.figures`); training writes them at its end too (`--run.plots false`: not).
"""
from __future__ import annotations

import argparse


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("run", help="a run folder (written by unfoldformer train)")


def run(args: argparse.Namespace) -> int:
    from pathlib import Path

    from ..runs import check_output_location
    from ..train.figures import plot_run

    check_output_location("RUN", Path(args.run))
    for path in plot_run(args.run):
        print(path)
    return 0
