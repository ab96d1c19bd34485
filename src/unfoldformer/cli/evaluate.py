"""`unfoldformer evaluate`: accuracy and energy-curve statistics of a saved checkpoint.

    unfoldformer evaluate CHECKPOINT [--data-dir DIR] [--split SPLIT] [--max-length N | --full-length]
                          [--safeguard] [--no-energies] [--device DEVICE] [--output FILE]

CHECKPOINT is a `.safetensors` weights file, a `checkpoint.pt` or a run folder (its best weights).
Energy statistics (unfolded models only): share of samples whose energy curve E(Y⁰), …, E(Yᵀ)
never rises (beyond the model's float32 round-off allowance; `monotone_share_strict` without it),
share whose every layer descends its own energy, share of layer steps the safeguard shortened,
and the mean curve. `--safeguard` evaluates with whole-layer descent by backtracking (THEORY §3.5).
Every option is checked before any work (sizes >= 1, device present, labelled split, `--output`
writable); the run folder's manifest and the weights' checksums are verified (weights without
checksums need the manifest or `--trust-unverified`); a NaN or infinite loss or energy is refused
(exit 2, naming the example), never reported; `--output` is written atomically (whole or absent).
"""
from __future__ import annotations

import argparse
import json

from . import add_device_argument


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("checkpoint", help="weights (.safetensors), checkpoint.pt, or a run folder")
    parser.add_argument("--data-dir", help="folder with the data files (default: the saved config's)")
    parser.add_argument("--split", help="labelled split (default: the config's evaluation split)")
    parser.add_argument("--max-length", type=int, help="truncation (default: the config's data.max_length)")
    parser.add_argument("--full-length", action="store_true", help="no truncation")
    parser.add_argument("--batch-size", type=int, help="examples per batch (long texts get fewer)")
    parser.add_argument("--max-examples", type=int, help="evaluate a fixed random subset of this size")
    parser.add_argument("--safeguard", action="store_true",
                        help="backtracking safeguard: whole-layer descent by construction (unfolded models)")
    parser.add_argument("--no-energies", action="store_true", help="skip the energy statistics")
    add_device_argument(parser)
    parser.add_argument("--output", help="also write the result as JSON to this file")
    parser.add_argument("--trust-unverified", action="store_true",
                        help="read weights without checksums that no run-folder manifest vouches for")


def run(args: argparse.Namespace) -> int:
    from ..errors import ConfigError
    from ..runs import check_device, check_output_location
    from ..train import evaluate_checkpoint
    from ..utils import write_json
    from . import check_options

    check_options(args, "max_length", "batch_size", "max_examples")
    if args.full_length and args.max_length is not None:
        raise ConfigError("--max-length and --full-length exclude each other")
    check_device("--device", args.device)
    if args.output is not None:
        check_output_location("--output", args.output, folder=False)
    result = evaluate_checkpoint(args.checkpoint, data_dir=args.data_dir, split=args.split,
                                 max_length=args.max_length, full_length=args.full_length,
                                 batch_size=args.batch_size, energies=not args.no_energies,
                                 safeguard=args.safeguard, max_examples=args.max_examples, device=args.device,
                                 progress=True, trust_unverified=args.trust_unverified)
    print(json.dumps(result, indent=2))
    if args.output:
        write_json(args.output, result)
    return 0
