"""`unfoldformer lm`: train, evaluate and sample a character language model (certified decoder or standard GPT).

    unfoldformer lm train --out RUN [--model certified|certified-untied|standard] [--data tinyshakespeare|FILE]
                          [--layers 4 --heads 4 --width 128 --context 64 --batch 12 --iters 2000 ...] [--resume]
    unfoldformer lm evaluate RUN [--energies] [--windows N] [--json]
    unfoldformer lm generate RUN --prompt "ROMEO:" [--tokens 200 --temperature 0.8 --top-k 20 --seed 0]

Defaults are nanoGPT's CPU configuration of its character Shakespeare model. The data: a named corpus under
$UNFOLDFORMER_DATA (`tinyshakespeare`, checked by its sha256) or any UTF-8 text file; first 90 % train, last 10 %
validation. Run folders: `lm.train` (config.json, model.safetensors, train.json, state.pt, metrics.csv).
DDP: `torchrun --nproc_per_node N -m unfoldformer lm train ...` (`--batch` a multiple of N; rank 0 writes).
"""
from __future__ import annotations

import argparse
import json
from dataclasses import fields

from ..errors import ConfigError
from . import add_device_argument, check_device_option, check_options


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from ..lm.train import MODELS, LMTrainConfig
    sub = parser.add_subparsers(dest="lm_command", metavar="{train,evaluate,generate}")
    t = sub.add_parser("train", help="train a language model into a run folder")
    t.add_argument("--out", required=True, help="the run folder")
    t.add_argument("--resume", action="store_true", help="continue the run in --out from its last evaluation")
    t.add_argument("--no-progress", action="store_true", help="no progress bar")
    defaults = LMTrainConfig()
    for f in fields(LMTrainConfig):
        kind = {"model": str, "data": str, "eval_windows": int, "lr": float, "min_lr": float}.get(
            f.name, type(getattr(defaults, f.name)))
        extra = {"choices": MODELS} if f.name == "model" else {}
        said = {"lr": "3e-3 for the certified models, 1e-3 for standard", "min_lr": "lr / 10"}.get(
            f.name, getattr(defaults, f.name))
        t.add_argument(f"--{f.name.replace('_', '-')}", type=kind, default=None, metavar=f.name.upper(),
                       help=f"(default {said})", **extra)
    add_device_argument(t)
    e = sub.add_parser("evaluate", help="validation loss (whole split) and the token descent share")
    e.add_argument("run", help="a run folder of `lm train`")
    e.add_argument("--windows", type=int, default=None, help="only the first N validation windows")
    e.add_argument("--energies", action="store_true", help="also every token's conditional energy (certified)")
    e.add_argument("--json", action="store_true", help="print JSON")
    add_device_argument(e)
    g = sub.add_parser("generate", help="sample text from a trained run")
    g.add_argument("run", help="a run folder of `lm train`")
    g.add_argument("--prompt", default="\n", help="the start of the text (default: a newline)")
    g.add_argument("--tokens", type=int, default=200, help="new tokens to sample (default 200)")
    g.add_argument("--temperature", type=float, default=0.8, help="softmax temperature > 0 (default 0.8)")
    g.add_argument("--top-k", type=int, default=None, help="sample among the k likeliest tokens")
    g.add_argument("--seed", type=int, default=0, help="sampling seed (default 0)")
    add_device_argument(g)


def run(args: argparse.Namespace) -> int:
    if args.lm_command is None:
        raise ConfigError("choose a subcommand: lm train, lm evaluate or lm generate")
    device = check_device_option(args)
    if args.lm_command == "train":
        return _train(args, device)
    if args.lm_command == "evaluate":
        return _evaluate(args, device)
    return _generate(args, device)


def _train(args: argparse.Namespace, device: str) -> int:
    from ..lm.train import LMTrainConfig, train
    given = {f.name: getattr(args, f.name) for f in fields(LMTrainConfig) if getattr(args, f.name) is not None}
    if args.resume and given:
        raise ConfigError(f"--resume continues the run with its saved settings; drop {', '.join(sorted(given))}")
    cfg = LMTrainConfig(**given).check()
    row = train(cfg, args.out, resume=args.resume, device=device, progress=not args.no_progress)
    if row:                                         # under torchrun only rank 0 has the run's rows
        print(f"{args.out}: step {row.get('step')}, val loss {row.get('val_loss', float('nan')):.4f}")
    return 0


def _evaluate(args: argparse.Namespace, device: str) -> int:
    import torch

    from ..lm.data import load_text, split
    from ..lm.train import evaluate_model, load_run
    check_options(args, "windows")
    model, tokenizer, cfg = load_run(args.run, device)
    if args.energies and model.standard:
        raise ConfigError("--energies: the standard decoder has no energy")
    _, val = split(torch.tensor(tokenizer.encode(load_text(cfg.data))), cfg.context)
    result = {"run": str(args.run), "model": cfg.model, "data": cfg.data,
              **evaluate_model(model, val, windows=args.windows, energies=args.energies, device=device)}
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        print(" ".join(f"{k}={v:.4f}" if isinstance(v, float) else f"{k}={v}" for k, v in result.items()))
    return 0


def _generate(args: argparse.Namespace, device: str) -> int:
    import torch

    from ..lm.train import load_run
    check_options(args, "top_k")
    check_options(args, "tokens", low=0)
    model, tokenizer, _ = load_run(args.run, device)
    if not args.prompt:
        raise ConfigError("--prompt is empty; give at least one character")
    prompt = torch.tensor([tokenizer.encode(args.prompt)], device=device)
    generator = torch.Generator(device=device).manual_seed(args.seed)
    ids = model.generate(prompt, args.tokens, temperature=args.temperature, top_k=args.top_k, generator=generator)
    print(tokenizer.decode(ids[0].tolist()))
    return 0
