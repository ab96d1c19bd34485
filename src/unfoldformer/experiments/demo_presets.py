"""`unfoldformer presets`: list the model presets of `model.PRESETS` with their settings."""
from __future__ import annotations

import argparse
import json

from ..model import ModelConfig, list_presets


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", action="store_true", help="print the resolved configs as JSON")


def run(args: argparse.Namespace) -> int:
    resolved = {name: ModelConfig.preset(name).to_dict() for name in list_presets()}
    if args.json:
        print(json.dumps(resolved, indent=2))
        return 0
    for name, cfg in resolved.items():
        print(f"{name}: d_model={cfg['d_model']} heads={cfg['n_heads']} depth={cfg['depth']} tied={cfg['tied']} "
              f"attention={cfg['attention']} ffn={cfg['ffn']} rho={cfg['rho']} safeguard={cfg['safeguard']} "
              f"certified={cfg['certified']}")
    return 0
