"""`unfoldformer presets`: list the model presets of `config.PRESETS` with their settings."""
from __future__ import annotations

import argparse
import json

from ..config import PRESETS, ModelConfig


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", action="store_true", help="print the resolved configs as JSON")


def run(args: argparse.Namespace) -> int:
    resolved = {name: ModelConfig.preset(name).to_dict() for name in PRESETS}
    if args.json:
        print(json.dumps(resolved, indent=2))
        return 0
    for name, cfg in resolved.items():
        settings = " ".join(f"{k}={v}" for k, v in cfg.items() if v is not None and k != "preset_name")
        print(f"{name}: {settings}")
    return 0
