"""How fast the joint step can be in eager PyTorch at the smallest shape: the step's arithmetic alone, written as
plainly as eager PyTorch allows, beside `nn.TransformerEncoder`'s fastest path and the library's encoders.

`floor` is 4 tied joint layers on (B, n, d) = (64, 16, 64), 4 heads, FFN 256, then a LayerNorm, under
`torch.inference_mode`: per layer the FFN's hidden layer (one addmm and an in-place ReLU) and output (one mm), the
anchor mix (lerp), head coordinates centred on their mean, the logits a_i·a_j − ½‖a_j‖² (one baddbmm), the diagonal
masked, softmax and log-sum-exp, the weighted average (one bmm), the gate (sigmoid) and two lerps: the operations of
`JointStack.run` for ρ = exp with nothing else. It leaves out what the library adds to them: padding (masks, counted
means), the position prior, length normalisation, the float32 precision check (THEORY §3.10), the input's
finiteness check and the exponential's floor. Its output is not the library's (random weights, no learned scales):
only its time is compared. `standard`, `joint-tied` and `joint-untied` are `shared_machine.py`'s models and calls.
The four run alternated call by call in one process (torch imported first), medians over `--rounds`.

    python benchmarks/small_shape_floor.py [--threads 1 2] [--rounds 60] [--json FILE]
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

ROOT = Path(__file__).resolve().parent
sys.path.insert(0, str(ROOT))
import shared_machine as sm  # noqa: E402  (same folder)
from unfoldformer.utils import environment, write_json  # noqa: E402

RESULTS = ROOT / "results" / "speed" / "small_shape_floor.json"
B, N, D, H, M, DEPTH = 64, 16, 64, 4, 256, 4


def floor_forward():
    """The plain joint forward (module doc): a zero-argument call."""
    g = torch.Generator().manual_seed(0)
    dh = D // H
    X = torch.randn(B, N, D, generator=g)
    W = torch.randn(D, M, generator=g) / D ** 0.5
    b = 0.1 * torch.randn(M, generator=g)
    scales = torch.full((H, 1), 0.5)                                # s_h
    shift = F.softplus(-torch.zeros(H))                             # log(1 + 1/ν) at ν = 1
    diagonal = torch.eye(N, dtype=torch.bool)

    def layer(Y):
        hidden = torch.addmm(b, Y.reshape(B * N, D), W).relu_()     # (B·n, m)
        P = torch.lerp(X, (hidden @ W.T).view(B, N, D), 0.5)        # (B, n, d) anchor mix
        C = Y.view(B, N, H, dh)                                     # (B, n, H, dh)
        a = ((C - C.mean(1, keepdim=True)) * scales).transpose(1, 2).reshape(B * H, N, dh)   # (B·H, n, dh)
        half = 0.5 * a.square().sum(-1)                             # (B·H, n) ½‖a_j‖²
        logits = torch.baddbmm(-half[:, None, :], a, a.transpose(1, 2)).masked_fill_(diagonal, -1e30)
        weights = torch.softmax(logits, -1)                         # (B·H, n, n)
        log_mass = (torch.logsumexp(logits, -1) - half).view(B, H, N).transpose(1, 2)   # (B, n, H)
        average = torch.bmm(weights, C.transpose(1, 2).reshape(B * H, N, dh))           # (B·H, n, dh)
        average = average.view(B, H, N, dh).transpose(1, 2)         # (B, n, H, dh)
        gate = torch.sigmoid(log_mass - shift)[..., None]           # (B, n, H, 1)
        p = torch.lerp(C, P.view(B, N, H, dh), 0.5)
        return torch.lerp(p, average, gate).reshape(B, N, D)

    def forward():
        with torch.inference_mode():
            Y = X
            for _ in range(DEPTH):
                Y = layer(Y)
            return F.layer_norm(Y, (D,))
    return forward


def measure(threads: int, rounds: int) -> dict:
    torch.set_num_threads(threads)
    calls = {"standard": sm.make_step("inference", "standard", (B, N, D)), "floor": floor_forward(),
             "joint-tied": sm.make_step("inference", "joint-tied", (B, N, D)),
             "joint-untied": sm.make_step("inference", "joint-untied", (B, N, D))}
    for call in calls.values():
        for _ in range(3):
            call()
    times = {name: [] for name in calls}
    for _ in range(rounds):
        for name, call in calls.items():
            t0 = time.perf_counter()
            call()
            times[name].append(time.perf_counter() - t0)
    return {name: statistics.median(v) for name, v in times.items()}


def table(results: dict) -> str:
    names = ["standard", "floor", "joint-tied", "joint-untied"]
    lines = ["| threads | " + " | ".join(f"{n} ms (×)" for n in names) + " |", "|---" * (len(names) + 1) + "|"]
    for threads, medians in results["threads"].items():
        std = medians["standard"]
        lines.append(f"| {threads} | " + " | ".join(f"{1e3 * medians[n]:.2f} ({std / medians[n]:.2f}×)" for n in names)
                     + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    p.add_argument("--rounds", type=int, default=60)
    p.add_argument("--json", type=Path, default=RESULTS)
    args = p.parse_args(argv)
    results = {"shape": [B, N, D], "heads": H, "ffn": M, "depth": DEPTH, "rounds": args.rounds,
               "environment": environment(), "seconds": "median wall time per forward, the four alternated",
               "threads": {str(t): measure(t, args.rounds) for t in args.threads}}
    write_json(args.json, results)
    print(table(results))


if __name__ == "__main__":
    main()
