"""Float32 accuracy of the fast paths on the adversarial token sets of tests/strategies.py (issue 20;
docs/theory.md, "Numerics of the fast paths"). Prints one line per measure:

1. plain vs traced forward: max |hidden(model(x)) − hidden(model(x, return_energies=True))| / max |hidden|,
   certified models (d = 16, depth 2, tied and untied, 1 and 2 heads, strong FFNs: W1 × 3, b ~ N(0, 0.3),
   s_h × e^{0.5});
2. the fused pass against a float64 pair-difference formula on the same rounded inputs: log S_i
   (|Δ| / max(1, |log S_i|), real queries with another real token) and E_A (|Δ| / |E_A|);
3. every ρ's `attention_step` in float32 against its float64 result on the same inputs, relative to the
   spread of the float64 output (max ‖y⁺_i − mean‖), on sets with a common offset of norm 1e3;
4. safeguard-accepted layers (depth-1 certified models, strong FFNs) whose energy rises under an independent
   float64 evaluation (pair differences, written here from THEORY §3.3–3.4) at the returned float32
   states: beyond `descent_tolerance(float32)·(1 + |E|)` and beyond `descent_tolerance(float64)·(1 + |E|)`.

Usage: python benchmarks/numerics_check.py [--cases N] [--threads 1] [--json FILE]
"""
from __future__ import annotations

import argparse
import copy
import sys
from pathlib import Path

import torch
from hypothesis import HealthCheck, given, settings

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
from strategies import token_sets  # noqa: E402
from unfoldformer.config import ModelConfig  # noqa: E402
from unfoldformer.descent import descent_tolerance  # noqa: E402
from unfoldformer.model import UnfoldedTransformer  # noqa: E402
from unfoldformer.rho import RHO_FAMILY, get_rho  # noqa: E402
from unfoldformer.softmax import attention_pass, mass_energy  # noqa: E402
from unfoldformer.steps import attention_step, isotropic_factors  # noqa: E402

D64 = torch.float64


def _run(strategy, cases: int, body) -> None:
    @settings(max_examples=cases, deadline=None, derandomize=True, database=None,
              suppress_health_check=list(HealthCheck))
    @given(batch=strategy)
    def run(batch):
        body(batch)
    run()


def _model(heads: int, seed: int, depth: int = 2, tied: bool = True) -> UnfoldedTransformer:
    torch.manual_seed(seed)
    cfg = ModelConfig.preset("certified-alternating", d_model=16, n_heads=heads, depth=depth, ffn_hidden=32,
                             anchor_weight=0.5,
                             tied=tied)
    model = UnfoldedTransformer(cfg)
    with torch.no_grad():
        for layer in model.layers:
            layer.ffn.W1.mul_(3.0)
            layer.ffn.b.normal_(0.0, 0.3)
        for name, param in model.named_parameters():   # a basis off the identity (exp(0) = I at init)
            if "basis" in name:
                param.add_(0.3 * torch.randn_like(param))
            layer.attention.log_scale.add_(0.5)
    return model


def plain_vs_traced(cases: int, tied: bool) -> float:
    worst = [0.0]
    models = [_model(h, s, tied=tied) for h in (1, 2) for s in (0, 1)]

    def body(batch):
        Y, _, pad = batch
        for model in models:
            with torch.no_grad():
                plain = model(Y, pad).hidden
                traced = model(Y, pad, return_energies=True).hidden
            scale = float(traced.abs().max()) or 1.0
            worst[0] = max(worst[0], float((plain - traced).abs().max()) / scale)
    _run(token_sets(d=16, dtype=torch.float32, max_n=10), cases, body)
    return worst[0]


def _pair_log_mass(C: torch.Tensor, scales: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
    """log Σ_{j≠i real} e^{−z_ij} in float64 from pair differences: (B, n, H)."""
    a = (C.double() * scales.double()[:, None]).transpose(1, 2)      # (B, H, n, dh)
    z = 0.5 * (a[:, :, :, None] - a[:, :, None]).pow(2).sum(-1)       # (B, H, n, n)
    n = C.shape[1]
    pair = valid[:, None, :, None] & valid[:, None, None, :] & ~torch.eye(n, dtype=torch.bool)
    return torch.logsumexp(torch.where(pair, -z, -torch.inf), dim=-1).transpose(1, 2)


def fused_vs_float64(cases: int) -> tuple[float, float]:
    worst = [0.0, 0.0]

    def body(batch):
        Y, _, pad = batch
        B, n, d = Y.shape
        H = 2 if d % 2 == 0 else 1
        valid = ~pad
        C = Y.view(B, n, H, d // H)
        scales = torch.linspace(0.5, 1.5, H, dtype=torch.float32)
        res = attention_pass(C, scales, valid, average=False)
        ref = _pair_log_mass(C, scales, valid)
        has = valid[..., None] & (valid.sum(1) > 1)[:, None, None] & torch.isfinite(ref)
        if has.any():
            err = (res.log_mass.double() - ref).abs() / ref.abs().clamp_min(1.0)
            worst[0] = max(worst[0], float(err[has].max()))
        e = mass_energy(res, valid)
        e_ref = -0.5 * torch.where(has, ref.exp(), 0.0).sum((1, 2))
        rel = (e - e_ref).abs() / e_ref.abs().clamp_min(1e-300)
        rel = torch.where(e_ref == 0, (e - e_ref).abs(), rel)
        worst[1] = max(worst[1], float(rel.max()))
    _run(token_sets(dtype=torch.float32, max_n=10), cases, body)
    return worst[0], worst[1]


def rho_steps(cases: int) -> dict[str, float]:
    worst = {name: 0.0 for name in sorted(RHO_FAMILY)}

    def body(batch):
        Y, _, pad = batch
        B, n, d = Y.shape
        g = torch.Generator().manual_seed(n * 31 + d)
        offset = torch.randn(d, generator=g, dtype=D64)
        Y = (Y.double() + 1e3 * offset / offset.norm()).float()     # a common offset of norm 1e3, rounded once
        H = 2 if d % 2 == 0 else 1
        fac = isotropic_factors(torch.linspace(0.5, 1.5, H, dtype=torch.float32), d)
        for name in worst:
            out = attention_step(Y, fac, get_rho(name), 1.0, pad)
            ref = attention_step(Y.double(), fac.double(), get_rho(name), 1.0, pad)
            valid = ~pad
            mean = (ref * valid[..., None]).sum(1, keepdim=True) / valid.sum(1)[:, None, None]
            spread = float((ref - mean).norm(dim=-1)[valid].max())
            if spread > 1.0:                                         # u·1e3/spread: the output's own rounding
                worst[name] = max(worst[name], float((out.double() - ref).abs().max()) / spread)
    _run(token_sets(dtype=torch.float32, max_n=10, max_offset=1e2, min_norm=1.0, max_norm=1e2,
                    shapes=("gaussian", "clusters", "duplicates")), cases, body)
    return worst


def _exact_energy(model64: UnfoldedTransformer, Y: torch.Tensor, X: torch.Tensor, pad: torch.Tensor) -> torch.Tensor:
    """E(Y) of a depth-1 certified model in float64 from pair differences (THEORY §3.3, §3.4): (B,)."""
    layer = model64.layer(0)
    att, ffn = layer.attention, layer.ffn
    valid = ~pad
    F = att.factors()                                                # (H, dh, d)
    a = torch.einsum("bnd,hkd->bhnk", Y, F)                          # (B, H, n, dh)
    z = 0.5 * (a[:, :, :, None] - a[:, :, None]).pow(2).sum(-1)       # (B, H, n, n)
    n = Y.shape[1]
    upper = torch.triu(torch.ones(n, n, dtype=torch.bool), 1)
    pair = valid[:, None, :, None] & valid[:, None, None, :] & upper
    e_att = torch.where(pair, -torch.exp(-z), 0.0).sum((1, 2, 3))
    anchor = 0.5 * torch.where(valid[..., None], (Y - X) ** 2, 0.0).sum((1, 2)) / att.lam
    hidden = torch.relu(Y @ ffn.W1 + ffn.b)
    e_ffn = 0.5 * (torch.where(valid[..., None], Y ** 2, 0.0).sum((1, 2))
                   - torch.where(valid[..., None], hidden ** 2, 0.0).sum((1, 2)))
    return e_att + anchor + e_ffn


def safeguard_rises(cases: int, depth: int = 4) -> tuple[int, int, int, float]:
    """Final layers of tied depth-`depth` models: the state before it is the output of the same model at
    depth − 1 (same parameters, same decisions)."""
    counts = [0, 0, 0, 0.0]          # accepted layers, rises (tol32), rises (tol64), max |E_reported − E64| / tol32
    pairs = []
    for h, seed in ((1, 2), (2, 3), (4, 4)):
        full = _model(h, seed, depth=depth)
        short = _model(h, seed, depth=depth - 1)
        short.load_state_dict(full.state_dict())
        pairs.append((short, full, copy.deepcopy(full).double()))
    tol32, tol64 = descent_tolerance(torch.float32), descent_tolerance(D64)

    def body(batch):
        Y, _, pad = batch
        for short, full, model64 in pairs:
            with torch.no_grad():
                prev = short(Y, pad, safeguard=True).hidden
                out = full(Y, pad, safeguard=True)
                before = _exact_energy(model64, prev.double(), Y.double(), pad)
                after = _exact_energy(model64, out.hidden.double(), Y.double(), pad)
            accepted = out.step_scales[:, -1] > 0
            counts[0] += int(accepted.sum())
            counts[1] += int((accepted & (after > before + tol32 * (1 + before.abs()))).sum())
            counts[2] += int((accepted & (after > before + tol64 * (1 + before.abs()))).sum())
            gap = (out.energies[:, -1] - after).abs() / (tol32 * (1 + after.abs()))
            counts[3] = max(counts[3], float(gap.max()))
    _run(token_sets(d=16, dtype=torch.float32, max_n=24, max_batch=4, max_offset=10.0, min_norm=0.1, max_norm=10.0),
         cases, body)
    return tuple(counts)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cases", type=int, default=400,
                        help="hypothesis cases per measure (safeguard: 2 × N batches, each on 3 models)")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--json", help="also write the measurements to this file (written whole)")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    out: dict = {"cases": args.cases, "threads": args.threads, "plain_vs_traced": {}}
    for tied in (True, False):
        err = out["plain_vs_traced"]["tied" if tied else "untied"] = plain_vs_traced(args.cases, tied)
        print(f"plain vs traced forward ({'tied' if tied else 'untied'}), max relative difference of hidden: "
              f"{err:.3g}")
    lm, en = fused_vs_float64(args.cases)
    out["fused"] = {"log_mass": lm, "energy": en}
    print(f"fused pass vs float64 pair differences: log-mass {lm:.3g}, energy {en:.3g} (relative)")
    out["rho_steps"] = rho_steps(args.cases)
    for name, err in out["rho_steps"].items():
        print(f"attention_step rho={name} at offset 1e3 vs its float64 result: {err:.3g} (relative to spread)")
    acc, r32, r64, gap = safeguard_rises(args.cases * 2)
    out["safeguard"] = {"accepted": acc, "rising_beyond_tol32": r32, "rising_beyond_tol64": r64, "reported_gap": gap}
    print(f"safeguard: {acc} accepted final layers; rising under an independent float64 evaluation: {r32} beyond "
          f"tol(float32), {r64} beyond tol(float64); reported final energy vs float64: {gap:.3g} × tol(float32)")
    if args.json:
        from unfoldformer.utils import environment, write_json
        write_json(args.json, {**out, "machine": environment()})


if __name__ == "__main__":
    main()
