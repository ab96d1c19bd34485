"""`unfoldformer evaluate`: accuracy and energy-curve statistics of a saved checkpoint.

    unfoldformer evaluate CHECKPOINT [--data-dir DIR] [--split SPLIT] [--max-length N | --full-length]
                          [--safeguard {preset,on,off}] [--no-energies] [--output FILE]

CHECKPOINT is a `.safetensors` weights file, a `checkpoint.pt` or a run folder (its best weights).
Energy statistics (unfolded models only): share of samples whose energy curve E(Y⁰), …, E(Yᵀ)
never rises (beyond the model's float32 round-off allowance; `monotone_share_strict` without it),
share whose every layer descends its own energy, share of layer steps the safeguard shortened,
and the mean curve. The safeguard follows the preset unless `--safeguard on|off` is given.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("checkpoint", help="weights (.safetensors), checkpoint.pt, or a run folder")
    parser.add_argument("--data-dir", help="folder with the data files (default: the saved config's)")
    parser.add_argument("--split", help="labelled split (default: the config's evaluation split)")
    parser.add_argument("--max-length", type=int, help="truncation (default: the config's data.max_length)")
    parser.add_argument("--full-length", action="store_true", help="no truncation")
    parser.add_argument("--batch-size", type=int, help="examples per batch (long texts get fewer)")
    parser.add_argument("--max-examples", type=int, help="evaluate a fixed random subset of this size")
    parser.add_argument("--safeguard", choices=("preset", "on", "off"), default="preset",
                        help="backtracking safeguard of unfolded models at evaluation (default: the preset's)")
    parser.add_argument("--no-energies", action="store_true", help="skip the energy statistics")
    parser.add_argument("--device", default="cpu", help="cpu or cuda")
    parser.add_argument("--output", help="also write the result as JSON to this file")


def run(args: argparse.Namespace) -> int:
    from .data import DataFormatError
    from .train import CheckpointError, ConfigError, evaluate_checkpoint
    safeguard = {"preset": None, "on": True, "off": False}[args.safeguard]
    try:
        result = evaluate_checkpoint(args.checkpoint, data_dir=args.data_dir, split=args.split,
                                     max_length=args.max_length, full_length=args.full_length,
                                     batch_size=args.batch_size, energies=not args.no_energies,
                                     safeguard=safeguard, max_examples=args.max_examples, device=args.device,
                                     progress=True)
    except (ConfigError, CheckpointError, DataFormatError) as exc:
        print(f"unfoldformer evaluate: error: {exc}", file=sys.stderr)
        return 2
    text = json.dumps(result, indent=2)
    print(text)
    if args.output:
        Path(args.output).write_text(text + "\n", encoding="utf-8")
    return 0
