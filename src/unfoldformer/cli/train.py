"""`unfoldformer train`: train a classifier from a config file plus dotted overrides.

    unfoldformer train [--config FILE] [--resume] [--print-config] [--device D] [--section.key VALUE ...]

Examples::

    unfoldformer train --data.dataset sst2 --run.out_dir runs/sst2
    unfoldformer train --config cfg.yaml --optim.lr 3e-4 --model.depth 12
    unfoldformer train --run.out_dir runs/sst2 --resume        # reuses runs/sst2/config.json
    unfoldformer train --run.out_dir runs/sst2 --resume --optim.epochs 5   # extends a finished run
    unfoldformer train --data.train_file reviews.csv --data.text_column review --data.label_column stars \
                       --run.out_dir runs/mine                 # your own file (see docs/guides/own-data.md)
    torchrun --nproc_per_node 2 -m unfoldformer train --config cfg.yaml

Sections and keys: see `unfoldformer.train.TrainConfig` (model.kind, model.<ModelConfig field>,
data.dataset, data.max_length, optim.lr, optim.epochs, optim.batch_size, run.out_dir, ...);
`--print-config` shows them all with their resolved values (the model fields the kind's preset fills in).
`--device` is `--run.device` (auto, cpu, cuda, cuda:N, mps).
Exit status 2 on an invalid config or an unreadable checkpoint (before any training).
"""
from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

ACCEPTS_EXTRA_ARGS = True


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    parser.epilog = __doc__.split("\n", 2)[2]
    parser.add_argument("--config", metavar="FILE", help="JSON or YAML config file (default: built-in defaults)")
    parser.add_argument("--resume", action="store_true",
                        help="continue the run in run.out_dir from its last checkpoint (new run if none)")
    parser.add_argument("--print-config", action="store_true", help="print the resolved config as JSON and exit")
    parser.add_argument("--device", default=None, metavar="DEVICE",
                        help="auto, cpu, cuda, cuda:N or mps: the same as --run.device (default auto)")


def build_config(config: str | None, overrides: list[str], resume: bool):
    """Config from `config` (or, when resuming without one, the run's own config.json) plus overrides."""
    from ..contracts import check_path_given
    from ..train import TrainConfig
    check_path_given("--config", config)                          # '' would silently mean the defaults
    cfg = (TrainConfig.load(config) if config is not None else TrainConfig()).with_overrides(list(overrides))
    saved = Path(cfg.run.out_dir) / "config.json"
    if resume and config is None and saved.is_file():
        cfg = TrainConfig.load(saved).with_overrides(list(overrides))
    return cfg


def run(args: argparse.Namespace) -> int:
    from ..runs import check_device
    from ..train import train
    overrides = list(args.extra)
    if args.device is not None:
        check_device("--device", args.device)
        overrides += ["--run.device", args.device]
    cfg = build_config(args.config, overrides, args.resume)
    if args.print_config:
        from ..persist.rebuild import resolve_init
        cfg.validate(check_data=False)
        print(json.dumps(resolve_init(cfg).resolved_dict(), indent=2))   # model.init: its encoder's architecture
        return 0
    summary = train(cfg, resume=args.resume, config_file=args.config)
    if int(os.environ.get("RANK", "0")) == 0:
        best = summary["best"] or {}
        accuracy = best.get("eval_accuracy", float("nan"))
        print(f"done: {summary['steps']} steps, best {cfg.eval_split} accuracy {accuracy:.4f} at step "
              f"{best.get('step')}, {summary['tokens_per_s']:.0f} tokens/s; outputs in {summary['out_dir']}")
    return 0
