"""The joint layer's certificate under its arithmetic (issue 37; docs/theory.md, "Numerics of the fast paths",
"Rounding the state"), on drawn models (`strategies.joint_models`: every ρ, isotropic and free metrics, rotary,
learned steps and bases, tied and untied, λ down to 1e-4, γ down to 1e-6) and adversarial token sets
(`strategies.token_sets`: offsets and norms up to 1e3, far clusters, identical tokens, padding), float64 and
float32. Each drawn model runs plain (`return_energies=True`) and with `safeguard=True`; an independent
evaluation of the layer energy from explicit pair differences in long double (numpy, `tests/references.py`)
judges it:

- reported rises not confirmed: the curve says E rose beyond descent_tolerance·(1 + |E|), the reference does not;
- safeguard backtracks of joint layers: float64 steps the safeguard shortened or skipped; float32 samples it
  kept at their state (scale 0), and of those how many the reference confirms as real rises;
- accepted float32 steps rising beyond the tolerance under the reference;
- reported energies whose error (against the reference) exceeds the tolerance they are judged with;
- plain and traced forwards not bit-identical.

Depth-1 models are judged against the reference (its states are X and the output); depth-2 models (tied or
untied) count backtracks and the bit-identity. Usage:
    python benchmarks/certificate_check.py --cases N [--seed S] [--json FILE]
Chunks with different --seed add up (`--merge FILE ...` sums them into --json).
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np
import torch
from hypothesis import HealthCheck, given, seed, settings
from hypothesis import strategies as st

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
from references import reference_layer_energy  # noqa: E402
from strategies import joint_models, token_sets  # noqa: E402
from unfoldformer.descent import descent_tolerance  # noqa: E402
from unfoldformer.joint import JointStack  # noqa: E402

LD = np.longdouble
VERBOSE = False
COUNTS = ("models", "float64_models", "float32_models", "layer_steps", "reported_rises", "rises_unconfirmed",
          "float64_backtracks", "float32_kept", "float32_kept_unconfirmed", "float32_accepted",
          "float32_accepted_rising", "energies", "energies_beyond_tolerance", "plain_traced_differ")


def _rise(before, after, tol: float):
    return after > before + tol * (1 + abs(before))


def judge(model, X: torch.Tensor, pad: torch.Tensor, counts: dict) -> None:
    dtype = X.dtype
    tol = descent_tolerance(dtype)
    depth = model.config.depth
    with torch.no_grad():
        plain = model(X, pad)
        traced = model(X, pad, return_energies=True)
        guarded = model(X, pad, safeguard=True)
    counts["models"] += 1
    counts["float64_models" if dtype == torch.float64 else "float32_models"] += 1
    counts["plain_traced_differ"] += int(not torch.equal(plain.hidden, traced.hidden))
    counts["layer_steps"] += traced.step_scales.numel()
    scales = guarded.step_scales
    if dtype == torch.float64:
        counts["float64_backtracks"] += int((scales < 1).sum())
    else:
        counts["float32_kept"] += int((scales == 0).sum())
        counts["float64_backtracks"] += int(((scales > 0) & (scales < 1)).sum())   # a halving: never for joint
    reported = _rise(traced.layer_before, traced.layer_after, tol)            # (B, depth)
    counts["reported_rises"] += int(reported.sum())
    if depth != 1:
        return
    # The reference judges the states the model stepped between, in the model's coordinates: a model with a
    # learned basis steps in its basis (X̃ = fl(XQ), Ỹ⁺); the returned hidden state is one more rounding (the
    # change of basis) away from them.
    with torch.no_grad():
        stack = JointStack(model, X, ~pad, exact=True)
        Xt = stack.anchor(0)
        Yt = stack.trial(0, stack.start(), None, None, 1.0, False, False).output
    e0 = reference_layer_energy(stack, Xt, Xt, pad)
    e1 = reference_layer_energy(stack, Yt, Xt, pad)
    real = np.array([bool(_rise(a, b, tol)) for a, b in zip(e0, e1)])
    counts["rises_unconfirmed"] += int((reported[:, 0].numpy() & ~real).sum())
    for lib, ref in ((traced.layer_before[:, 0], e0), (traced.layer_after[:, 0], e1)):
        err = np.abs(lib.numpy().astype(LD) - ref)
        beyond = err > tol * (1 + np.abs(ref))
        counts["energies"] += len(ref)
        counts["energies_beyond_tolerance"] += int(beyond.sum())
        counts["worst_energy_error_over_tol"] = max(counts.get("worst_energy_error_over_tol", 0.0),
                                                    float((err / (tol * (1 + np.abs(ref)))).max()))
        if beyond.any() and VERBOSE:
            cfg = model.config
            print("beyond:", dtype, cfg.rho, cfg.metric, cfg.positions, "basis", cfg.learn_basis, cfg.anchor_weight,
                  cfg.ffn_weight, float(X.abs().max()), (err / (tol * (1 + np.abs(ref))))[beyond], ref[beyond])
    if dtype != torch.float64:
        kept = (scales[:, 0] == 0).numpy()
        counts["float32_kept_unconfirmed"] += int((kept & ~real).sum())
        counts["float32_accepted"] += int((~kept).sum())
        counts["float32_accepted_rising"] += int((~kept & real).sum())   # accepted: the plain step's state (same bits)


def run(cases: int, seed_value: int) -> dict:
    counts = {k: 0 for k in COUNTS}

    @seed(seed_value)
    @settings(max_examples=cases, deadline=None, database=None, suppress_health_check=list(HealthCheck))
    @given(data=st.data())
    def body(data):
        dtype = data.draw(st.sampled_from([torch.float32, torch.float64]))
        d = data.draw(st.sampled_from([2, 4, 6, 8]))
        depth = data.draw(st.sampled_from([1, 1, 2]))
        model = data.draw(joint_models(d, dtype, depth=depth))
        _, X, pad = data.draw(token_sets(d=d, dtype=dtype, max_n=6, with_input=True))
        judge(model, X, pad, counts)
    body()
    return counts


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cases", type=int, default=200, help="drawn models")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", help="write the counts to this file (written whole)")
    parser.add_argument("--merge", nargs="+", help="sum these chunk files into --json instead of running")
    parser.add_argument("--verbose", action="store_true", help="print each energy beyond its tolerance")
    args = parser.parse_args(argv)
    global VERBOSE
    VERBOSE = args.verbose
    torch.set_num_threads(1)
    if args.merge:
        chunks = [json.loads(Path(p).read_text()) for p in args.merge]
        counts = {k: sum(c[k] for c in chunks) for k in COUNTS}
        counts["worst_energy_error_over_tol"] = max(c.get("worst_energy_error_over_tol", 0.0) for c in chunks)
        counts["seconds"] = sum(c["seconds"] for c in chunks)
        counts["chunks"] = [{"cases": c["cases"], "seed": c["seed"]} for c in chunks]
    else:
        start = time.perf_counter()
        counts = run(args.cases, args.seed)
        counts.update(cases=args.cases, seed=args.seed, seconds=time.perf_counter() - start)
    print(json.dumps(counts, indent=1))
    if args.json:
        from unfoldformer.utils import environment, write_json
        write_json(args.json, {**counts, "machine": environment()})


if __name__ == "__main__":
    main()
