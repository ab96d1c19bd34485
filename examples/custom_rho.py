"""Bring your own attention penalty ρ: check it, register it, and watch the certified steps descend with it.

    python examples/custom_rho.py

ρ must be concave and non-decreasing on [0, ∞). `uf.check_rho` lists the conditions a candidate fails;
`uf.register_rho` refuses one that fails and makes a good one nameable everywhere (`rho="sqrt1"` in a
`ModelConfig`, `--model.rho sqrt1` in training configs run from this process). UNFOLDFORMER_EXAMPLE_TINY=1
runs at a tiny size (the test suite does).
"""
from __future__ import annotations

import os

import torch

import unfoldformer as uf

TINY = os.environ.get("UNFOLDFORMER_EXAMPLE_TINY") == "1"


def main() -> int:
    sqrt1 = uf.custom_rho(lambda z: torch.sqrt(z + 1.0), name="sqrt1")     # ρ' by autograd
    print("check sqrt(z + 1):", uf.check_rho(sqrt1))
    print("check z²:", uf.check_rho(uf.custom_rho(lambda z: z ** 2, name="square")))   # convex: refused
    uf.register_rho(sqrt1)

    # one attention step on its own energy (Theorem A: PSD metric FᵀF, α ∈ (0, 1])
    B, n, d, k = (2, 6, 8, 4) if TINY else (8, 64, 32, 16)
    torch.manual_seed(0)
    Y = torch.randn(B, n, d, dtype=torch.float64)                        # (B, n, d)
    F = torch.randn(1, k, d, dtype=torch.float64) / d ** 0.5             # (H, k, d)
    pad = torch.zeros(B, n, dtype=torch.bool)
    pad[0, n - 2:] = True
    before = uf.attention_energy(Y, F, "sqrt1", pad)                     # (B,) float64
    after = uf.attention_energy(uf.attention_step(Y, F, "sqrt1", alpha=1.0, padding_mask=pad), F, "sqrt1", pad)
    print("attention energy before / after one step:", before.tolist(), after.tolist())
    assert (after <= before + uf.descent_tolerance(torch.float64) * (1 + before.abs())).all()

    # a whole certified model with it, safeguard on: the curve never rises
    depth = 2 if TINY else 6
    model = uf.UnfoldedTransformer(uf.ModelConfig.preset("certified-alternating", d_model=d, n_heads=2, depth=depth,
                                                         rho="sqrt1")).eval()
    with torch.no_grad():
        E = model(Y.float(), pad, safeguard=True).energies              # (B, depth + 1)
    print("energy curve of the first input, safeguard on:", [round(v, 3) for v in E[0].tolist()])
    tol = uf.descent_tolerance(torch.float32)
    rise = (E.diff(dim=1) / (1 + E[:, :-1].abs())).max().item()        # largest relative rise of any layer
    print(f"largest layer rise relative to 1 + |E|: {rise:.1e} (float32 round-off allowance {tol:.0e})")
    assert rise <= tol
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
