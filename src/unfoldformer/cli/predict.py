"""`unfoldformer predict`: labels, probabilities and energy curves of a trained classifier.

    unfoldformer predict RUN [--text T ...] [--file F] [--json] [--safeguard] [--full-length] [--device D]

RUN is a run folder (its best weights), a `.safetensors` file or a `checkpoint.pt`. Texts come
from `--text` (repeatable), `--file` (one text per line; `-` reads standard input), or both.
Prints the class names, then one line per text (label name, probabilities in class order, the energy
curve per real token E(Y⁽ᵗ⁾)/n), or JSON with `--json` (with the raw curve E(Y⁽ᵗ⁾) as well).
A NaN or infinite probability or energy is refused (exit 2, naming the text). Weights without checksums
need their run folder's manifest or `--trust-unverified`.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from ..errors import ConfigError
from . import add_device_argument, check_device_option


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("run", help="run folder, weights (.safetensors) or checkpoint.pt")
    parser.add_argument("--text", action="append", default=[], help="a text to classify (repeatable)")
    parser.add_argument("--file", help="a file with one text per line ('-': standard input)")
    parser.add_argument("--json", action="store_true", help="print the predictions as JSON")
    parser.add_argument("--safeguard", action="store_true", help="whole-layer descent by backtracking (THEORY §3.5)")
    parser.add_argument("--no-energies", action="store_true", help="skip the energy curves")
    parser.add_argument("--full-length", action="store_true", help="no truncation (default: the training length)")
    parser.add_argument("--data-dir", help="data folder (vocabularies built from data: random / GloVe embeddings)")
    add_device_argument(parser)
    parser.add_argument("--trust-unverified", action="store_true",
                        help="read weights without checksums that no run-folder manifest vouches for")


def read_texts(args: argparse.Namespace) -> list[str]:
    texts = list(args.text)
    if args.file is not None:
        if not args.file.strip():
            raise ConfigError("--file is empty; give a file name, or - for standard input")
        try:
            lines = sys.stdin.read() if args.file == "-" else Path(args.file).read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise ConfigError(f"--file {args.file}: cannot read it ({exc})") from None
        texts += [line for line in lines.splitlines() if line.strip()]
    if not texts:
        raise ConfigError("no texts: pass --text TEXT (repeatable) or --file FILE")
    return texts


def run(args: argparse.Namespace) -> int:
    from ..inference import load

    device = check_device_option(args)
    texts = read_texts(args)
    predictor = load(args.run, data_dir=args.data_dir, max_length=None if args.full_length else -1, device=device,
                     trust_unverified=args.trust_unverified)
    predictions = predictor(texts, energies=not args.no_energies, safeguard=args.safeguard)
    if args.json:
        print(json.dumps([p.to_dict() for p in predictions], indent=2))
        return 0
    width = max(8, *(len(name) for name in predictor.label_names))
    print(f"classes: {', '.join(predictor.label_names)}; E/n = the energy curve E(Y0) ... E(YT) per real token")
    for p in predictions:
        probs = " ".join(f"{v:.3f}" for v in p.probabilities)
        line = f"{p.label_name:{width}s} p=[{probs}]"
        if p.energies is not None:
            curve = " ".join(f"{e:.4g}" for e in p.energies_per_token)
            if p.never_rises is not None:                        # tied: one energy, one curve
                line += f"  E/n: {curve} ({'never rises' if p.never_rises else 'rises'})"
            else:                                                # untied: E_ℓ per layer, not one curve
                line += f"  E_ℓ/n: {curve} ({'every layer descends' if p.layers_descend else 'a layer rises'})"
        print(f"{line}  | {p.text[:60]}")
    return 0
