"""`unfoldformer zoo`: the trained classifiers shipped with the package (name, data, accuracy, size).

Open one with `unfoldformer predict NAME --text "..."` or `uf.load(NAME)` (offline); its card
(`card.md`, `card.json` in the folder printed by `--json`) gives data, recipe, energies and commit.
"""
from __future__ import annotations

import argparse
import json

from ..zoo import ZOO_DIR, card, names


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", action="store_true", help="print the cards as JSON")


def run(args: argparse.Namespace) -> int:
    cards = [card(name) for name in names()]
    if args.json:
        print(json.dumps([{**c, "folder": str(ZOO_DIR / c["name"])} for c in cards], indent=2))
        return 0
    if not cards:
        print("the zoo is empty")
        return 0
    rows = [("name", "data", "accuracy", "size")]
    for c in cards:
        r = c["run"]
        rows.append((c["name"], f"{c['data']['dataset']} ({r['eval_split']}, {r['eval_examples']} examples)",
                     f"{r['accuracy']:.4f}", f"{c['size_bytes'] / 1024:.0f} KiB"))
    widths = [max(len(row[i]) for row in rows) for i in range(4)]
    for row in rows:
        print("  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip())
    return 0
