"""`unfoldformer demo`: the energy trace of a certified model on random inputs (THEORY §3).

Builds a preset (default `certified`, the joint layer: the recommended certified model), runs it on random inputs
with padding, and prints E(Y⁽ᵗ⁾) per layer with the share of layer, attention and FFN steps that lower
their energy and the share of samples whose curve never rises. A joint layer (THEORY §3.7) is one step,
so it has no sub-step shares, and its curves never rise; the demo also runs the other certified layer
of the same size on the same inputs (joint `certified` ↔ `certified-alternating`, safeguard off), whose whole
layers can raise the energy. Writes nothing
unless `--out` is given (then `demo.json`, `config.json` and
`complete.json`, the folder built whole or not at all: `runs.staged_output`).
"""
from __future__ import annotations

import argparse

import torch

from ..config import PRESETS, ModelConfig
from ..contracts import check_seed
from ..descent import descent_tolerance, lowered, share_lowered
from ..model import UnfoldedTransformer
from ..runs import check_output_folder, staged_output
from ..utils import write_json
from . import add_device_argument, check_device_option, check_options

OUTPUT_FILES = ("config.json", "demo.json")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--preset", default="certified", choices=sorted(p for p in PRESETS if p != "standard"))
    parser.add_argument("--safeguard", action="store_true", help="whole-layer descent by backtracking (THEORY §3.5)")
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--tokens", type=int, default=32)
    parser.add_argument("--depth", type=int, default=None, help="override the preset's depth")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default=None, help="folder for demo.json and config.json")
    add_device_argument(parser)


def energy_trace(cfg: ModelConfig, batch: int, tokens: int, seed: int, safeguard: bool = False,
                 device: str = "cpu", contrast: bool = True) -> dict:
    torch.manual_seed(seed)
    model = UnfoldedTransformer(cfg).eval().to(device)
    x = torch.randn(batch, tokens, cfg.d_model).to(device)           # (B, n, d), drawn on the CPU
    pad = torch.zeros(batch, tokens, dtype=torch.bool, device=device)
    pad[batch // 2:, tokens * 3 // 4:] = True                        # half the batch padded
    tol = descent_tolerance(x.dtype)
    joint = cfg.layer == "joint"
    with torch.no_grad():
        out = model(x, pad, return_energies="steps", safeguard=safeguard)   # curve and sub-step terms
    result = {
        "mean_energy_per_layer": out.energies.mean(0).tolist(),
        "share_layer_steps_lowering": share_lowered(out.layer_before, out.layer_after, tol),
        "share_attention_steps_lowering": None if joint else share_lowered(out.attention_before,
                                                                           out.attention_after, tol),
        "share_ffn_steps_lowering": None if joint else share_lowered(out.ffn_before, out.ffn_after, tol),
        "share_curves_never_rising": float(lowered(out.layer_before, out.layer_after, tol).all(1).double().mean()),
        "mean_safeguard_step_scale": float(out.step_scales.mean()),
    }
    if cfg.attention == "anchored" and cfg.ffn == "tied" and contrast:   # the other layer kind, same size and inputs
        same = {k: getattr(cfg, k) for k in ("d_model", "n_heads", "depth", "tied", "rho", "ffn_hidden")}
        other = ModelConfig.preset("certified-alternating" if joint else "certified", **same)
        result["other_preset"] = other.preset_name
        result["other_share_curves_never_rising"] = energy_trace(other, batch, tokens, seed, contrast=False,
                                                                 device=device)["share_curves_never_rising"]
    return result


def run(args: argparse.Namespace) -> int:
    check_options(args, "batch", "tokens", "depth")
    check_seed("--seed", args.seed)
    device = check_device_option(args)
    overrides = {} if args.depth is None else {"depth": args.depth}
    cfg = ModelConfig.preset(args.preset, **overrides)
    if args.out is not None:                                       # every check of the folder, before any work
        check_output_folder("--out", args.out, "demo", OUTPUT_FILES.__contains__)
    result = energy_trace(cfg, args.batch, args.tokens, args.seed, args.safeguard, device)
    print(f"preset {args.preset}: d_model={cfg.d_model} heads={cfg.n_heads} depth={cfg.depth} "
          f"attention={cfg.attention} ffn={cfg.ffn} safeguard={args.safeguard}")
    print(f"{'layer':>5}  {'mean energy E(Y_t)':>20}")
    for t, e in enumerate(result["mean_energy_per_layer"]):
        print(f"{t:>5}  {e:>20.6f}")
    for key in ("layer", "attention", "ffn"):
        share = result[f"share_{key}_steps_lowering"]
        if share is not None:
            print(f"share of {key} steps that do not raise the energy: {share:.1%}")
    print(f"share of samples whose curve never rises: {result['share_curves_never_rising']:.1%}")
    if "other_preset" in result:
        kind = "the alternating layer" if cfg.layer == "joint" else "the joint layer (THEORY §3.7)"
        print(f"{kind} (preset {result['other_preset']}) on the same inputs, no safeguard: "
              f"curve never rises on {result['other_share_curves_never_rising']:.1%} of samples")
    if args.out is not None:
        config = {"model": cfg.to_dict(), "seed": args.seed, "batch": args.batch, "tokens": args.tokens,
                  "safeguard": args.safeguard}
        with staged_output(args.out, "demo", config, owned=OUTPUT_FILES.__contains__) as out:
            write_json(out / "config.json", config)
            write_json(out / "demo.json", result)
    return 0
