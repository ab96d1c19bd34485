"""`unfoldformer distill`: distil all-MiniLM-L6-v2 into a certified joint encoder (resumable).

    unfoldformer distill --out runs/distill                       # tied, 6 layers, the full corpus
    unfoldformer distill --out runs/distill --resume              # continue after a stop or a kill
    unfoldformer distill --out runs/untied --no-tied --steps 40000
    torchrun --nproc_per_node 2 -m unfoldformer distill --out runs/distill

Every option is a field of `unfoldformer.distill.config.DistillConfig` (docs/guides/pretrained.md).
With --resume the run's own config.json is the base and only the options given change it (where, how
often it logs, and --steps to extend it; anything else is refused).
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import os
import typing
from pathlib import Path


def _fields():
    from ..distill.config import DistillConfig
    hints = typing.get_type_hints(DistillConfig)
    return DistillConfig, [(f, hints[f.name]) for f in dataclasses.fields(DistillConfig)]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from ..distill.config import field_type
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    parser.epilog = __doc__.split("\n", 2)[2]
    config_cls, fields = _fields()
    parser.add_argument("--resume", action="store_true", help="continue the run in --out from its checkpoint")
    parser.add_argument("--print-config", action="store_true", help="print the resolved settings as JSON and exit")
    for f, hint in fields:
        flag = "--" + f.name.replace("_", "-")
        base = field_type(hint)
        default = f.default if f.default is not dataclasses.MISSING else f.default_factory()
        help_text = f"(default {default!r})"
        if base is bool:
            parser.add_argument(flag, action=argparse.BooleanOptionalAction, default=None, help=help_text)
        elif typing.get_origin(base) is tuple:
            parser.add_argument(flag, nargs="+", default=None, metavar="NAME", help=help_text)
        else:
            parser.add_argument(flag, type=base, default=None, metavar=f.name.upper(), help=help_text)


def build_config(args: argparse.Namespace):
    """Defaults (or, with --resume, the run's config.json) with the options given."""
    config_cls, fields = _fields()
    given = {f.name: getattr(args, f.name) for f, _ in fields if getattr(args, f.name) is not None}
    base: dict = {}
    saved = Path(given.get("out", config_cls.out)) / "config.json"
    if args.resume and saved.is_file():
        base = json.loads(saved.read_text())["distill"]
    return config_cls.from_dict({**base, **given})


def run(args: argparse.Namespace) -> int:
    from ..distill.loop import distill
    from ..runs import check_device
    cfg = build_config(args)
    check_device("--device", cfg.device)
    if args.print_config:
        print(cfg.to_json())
        return 0
    summary = distill(cfg, resume=args.resume)
    if int(os.environ.get("RANK", "0")) == 0:
        print(f"done: {summary['steps']} steps ({summary['epochs']:.2f} epochs), held-out sentence cosine "
              f"{summary.get('val_sentence_cosine', float('nan')):.4f}; model in {Path(cfg.out) / 'model'}")
    return 0
