"""Command-line interface: a thin dispatcher over the experiments, training and probe modules.

Subcommands are registered in `COMMANDS` as (module, help); each module provides
`add_arguments(parser)` and `run(args) -> int`. Modules are imported lazily so that
`unfoldformer --help` stays fast.
"""
from __future__ import annotations

import argparse
import importlib
import sys

COMMANDS: dict[str, tuple[str, str]] = {
    "demo": ("unfoldformer.experiments.demo", "energy trace of a certified model on random inputs"),
    "presets": ("unfoldformer.experiments.demo_presets", "list the model presets and their settings"),
    "reproduce": ("unfoldformer.experiments.reproduce", "reproduce the paper's figures 1-6 and write a report"),
    "probe": ("unfoldformer.experiments.probe_report", "probe a pretrained Transformer: how energy-like is each layer"),
    "train": ("unfoldformer.train_cli", "train a classifier (certified, paper or standard Transformer)"),
    "evaluate": ("unfoldformer.evaluate_cli", "evaluate a saved checkpoint: accuracy and energy curves"),
}


def build_parser(argv: list[str]) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="unfoldformer", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    wanted = next((a for a in argv if not a.startswith("-")), None)
    for name, (module, help_text) in COMMANDS.items():
        p = sub.add_parser(name, help=help_text, description=help_text)
        if name == wanted:  # only import the module of the command being run
            importlib.import_module(module).add_arguments(p)
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser(argv)
    args, extra = parser.parse_known_args(argv)
    if args.command is None:
        parser.print_help()
        return 2
    module = importlib.import_module(COMMANDS[args.command][0])
    if extra and not getattr(module, "ACCEPTS_EXTRA_ARGS", False):
        parser.error(f"unrecognized arguments: {' '.join(extra)}")
    if extra:
        args.extra = extra
    return int(module.run(args) or 0)


if __name__ == "__main__":
    raise SystemExit(main())
