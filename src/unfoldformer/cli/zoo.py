"""`unfoldformer zoo`: the trained classifiers shipped with the package (name, data, accuracy, size), then
the pretrained encoders (name, layers, size).

Open a classifier with `unfoldformer predict NAME --text "..."` or `uf.load(NAME)` (offline); its card
(`card.md`, `card.json` in the folder printed by `--json`) gives data, recipe, energies and commit.
Open an encoder with `uf.from_pretrained(NAME)` (a `DistilledEncoder`; its card is the folder's README.md).
"""
from __future__ import annotations

import argparse
import json

from ..zoo import ZOO_DIR, card, encoder_folder, encoder_names, names


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", action="store_true", help="print the cards as JSON")


def run(args: argparse.Namespace) -> int:
    cards = [card(name) for name in names()]
    if args.json:
        print(json.dumps([{**c, "folder": str(ZOO_DIR / c["name"])} for c in cards], indent=2))
        return 0
    if not cards and not encoder_names():
        print("the zoo is empty")
        return 0
    rows = [("name", "data", "accuracy", "size")]
    for c in cards:
        r = c["run"]
        rows.append((c["name"], f"{c['data']['dataset']} ({r['eval_split']}, {r['eval_examples']} examples)",
                     f"{r['accuracy']:.4f}", f"{c['size_bytes'] / 1024:.0f} KiB"))
    _print_rows(rows)
    if encoder_names():
        print("\npretrained encoders (uf.from_pretrained(NAME)):")
        _print_rows([("name", "layers", "size"), *(_encoder_row(name) for name in encoder_names())])
    return 0


def _print_rows(rows: list[tuple[str, ...]]) -> None:
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    for row in rows:
        print("  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip())


def _encoder_row(name: str) -> tuple[str, str, str]:
    folder = encoder_folder(name)
    config = json.loads((folder / "config.json").read_text(encoding="utf-8"))["init"]["config"]
    tying = "tied" if config.get("tied") else "untied"
    layers = f"{config.get('preset_name')}, {tying}, depth {config.get('depth')}, d {config.get('d_model')}"
    size = sum(p.stat().st_size for p in folder.iterdir() if p.is_file())
    return name, layers, f"{size / 1024:.0f} KiB"
