"""What the position prior (docs/theory.md §4e) costs: the `certified` encoder with `position_prior=64` against
the same model with 0, side by side in one process, the two alternated, 1 thread, the median of the last 12 of 15
rounds, inference (no autograd) and a training step (forward and backward of a mean square). Prints one line per
shape and mode; no result file (a measurement for the theory page, not a speed target).

    python benchmarks/position_prior_speed.py
"""
from __future__ import annotations

import statistics
import time

import torch

from unfoldformer.config import ModelConfig
from unfoldformer.model import UnfoldedTransformer

SHAPES = ((64, 16, 64, 4), (32, 256, 128, 6))      # (batch, tokens, width, depth)


def _seconds(model, X: torch.Tensor, pad: torch.Tensor, train: bool) -> float:
    start = time.perf_counter()
    if train:
        model(X, pad).hidden.square().mean().backward()
    else:
        with torch.no_grad():
            model(X, pad)
    return time.perf_counter() - start


def main() -> None:
    torch.set_num_threads(1)
    for B, n, d, depth in SHAPES:
        torch.manual_seed(0)
        models = {k: UnfoldedTransformer(ModelConfig.preset("certified", d_model=d, depth=depth, ffn_hidden=4 * d,
                                                            position_prior=k)) for k in (0, 64)}
        X = torch.randn(B, n, d)                                        # (B, n, d)
        pad = torch.zeros(B, n, dtype=torch.bool)
        pad[B // 2:, n * 3 // 4:] = True                                # half the batch a quarter padded
        for train in (False, True):
            times: dict[int, list[float]] = {k: [] for k in models}
            for _ in range(15):
                for k, model in models.items():
                    times[k].append(_seconds(model, X, pad, train))
            ms = {k: 1000 * statistics.median(v[3:]) for k, v in times.items()}
            print(f"B {B}, n {n}, d {d}, depth {depth}, {'training step' if train else 'inference'}: "
                  f"no prior {ms[0]:.2f} ms, prior {ms[64]:.2f} ms, prior costs {ms[64] / ms[0] - 1:+.1%}")


if __name__ == "__main__":
    main()
