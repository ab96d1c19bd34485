"""What "a step lowers the energy" means in floating point, and the descent statistics.

Energies are accumulated in float64, but a state stored in a lower precision is rounded to
u = eps/2 relative, which moves E by a few u relative even at a fixed point. A rise therefore
counts only beyond `descent_tolerance(dtype)·(1 + |E|)`, about 16 units of round-off of the
state's dtype (floored at 1e-12 for float64 states, whose energies sum many terms):

| state dtype | u        | tolerance |
|-------------|----------|-----------|
| float64     | 1.1e-16  | 1e-12     |
| float32     | 6.0e-8   | 1e-6      |
| float16     | 4.9e-4   | 8e-3      |
| bfloat16    | 3.9e-3   | 6e-2      |

The same rule serves the safeguard (THEORY §3.5), the evaluation statistics and the reports.
Functions take torch tensors or numpy arrays alike.

What the allowance covers, and the full error bound of the energies it is applied to (THEORY §3.10 (i);
docs/theory.md, "Numerics of the fast paths", "Rounding the state"). The allowance covers the rounding of
the states: E(fl(Y)) − E(Y) is of order u·‖∇E‖‖Y‖, a few u·|E| for states at the energy's own scale (not
near a fixed point with ‖Y‖²/λ ≫ |E|: there the rounded state itself can rise by ½Λ‖δ‖², see the docs).
It must also exceed the error of the *evaluation* of E, which is why every energy a float32 forward
returns is a float64 evaluation of its states (`model.py`; operators converted exactly). With u = 2⁻⁵³,
γ_m = mu/(1 − mu), R² = max ‖a_i − mean‖² over a call's centred head features (width k), that evaluation
errs by at most, per sample,

    |ΔE| ≤ w·[4γ_{k+4}R²·|E_A|  (ρ = exp: the pass's logits, relative on every S_i, `softmax.logit_error_bound`)
            or 4γ_{k+4}R²·Σ_{i<j} ρ'(z_ij) + u·Σ_{i<j} |ρ(z_ij)|  (other ρ: each Gram-form z of centred
            features errs by ≤ 4γ_{k+4}R², `energy.centred_states`; ρ' bounds ρ's change, concavity)]
         + λ⁻¹·γ_{d+1}·‖Y − X‖²                      (anchor: one rounding per difference, float64 row sums)
         + (γ/λ)·[γ_{d+1}‖Y‖² + 2γ_{d+2}Σ_i ‖h_i‖(‖y_i‖‖W₁‖_F + ‖b‖) + γ_m‖H‖²]   (E_H: product, ReLU, sums)
         + γ_{nH}·(the sum of the magnitudes of all terms)             (the final float64 sums)

(h_i = ReLU(y_i W₁ + b), H its rows, m the FFN width). Every factor γ is ~(size)·1.1e-16, so for states
with R², ‖Y‖², ‖H‖² ≲ 10⁸ the bound is below 10⁻⁷(1 + |E|), a tenth of the float32 allowance: a share
judged from these energies (`DescentCounts`) is within its error. A float64 forward evaluates the same way
at its own states; its allowance 10⁻¹²(1 + |E|) covers the bound while the terms' magnitudes stay below
~10³(1 + |E|) — with centred features R² is the spread, not the offset. Where the attention part of the
bound still exceeds a quarter of the tolerance (tokens spread far apart with close pairs), the layer's
float64 evaluation takes E_A of those samples from explicit pair differences instead (`RotatedStack._exact_attention`,
`energy.pair_difference_energy`), so every reported energy stays within the tolerance it is judged with
(`benchmarks/certificate_check.py` counts it on the adversarial strategy).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

__all__ = ["DescentCounts", "descent_tolerance", "lowered", "share_lowered"]

_TOLERANCE = {torch.float64: 1e-12, torch.float32: 1e-6, torch.float16: 8e-3, torch.bfloat16: 6e-2}


def descent_tolerance(dtype: torch.dtype) -> float:
    """Relative round-off allowance when comparing energies of states stored in `dtype` (table above)."""
    if dtype not in _TOLERANCE:
        raise TypeError(f"no descent tolerance for dtype {dtype}; states must be floating point")
    return _TOLERANCE[dtype]


def lowered(before, after, tol: float):
    """True where `after` does not rise above `before` beyond tol·(1 + |before|) (elementwise)."""
    return after <= before + tol * (1.0 + abs(before))


def share_lowered(before, after, tol: float) -> float:
    """Share of steps (all elements of `before`/`after`) that do not rise beyond round-off."""
    ok = lowered(before, after, tol)
    return float(ok.double().mean()) if isinstance(ok, torch.Tensor) else float(ok.mean())


@dataclass
class DescentCounts:
    """Counts of samples whose energy curve never rises and whose every layer descends, over batches.

    `add(energies, layer_before, layer_after, step_scales, tol)` takes one batch of an
    `EncoderOutput` (energies (B, T+1), the rest (B, T)); the shares are the counts over `samples`.
    Sums only, so counts from several processes add up (`merge`).
    """

    samples: int = 0
    monotone: int = 0            # curve E(Y⁰) ≥ … ≥ E(Yᵀ) up to round-off
    monotone_strict: int = 0     # the same without any allowance
    layers_descend: int = 0      # every layer: E_ℓ(Y⁽ℓ⁾) ≤ E_ℓ(Y⁽ℓ⁻¹⁾) up to round-off
    layer_steps: int = 0
    backtracked_steps: int = 0   # layer steps the safeguard shortened or skipped

    def add(self, energies, layer_before, layer_after, step_scales, tol: float) -> None:
        self.samples += int(energies.shape[0])
        self.monotone += int(lowered(energies[:, :-1], energies[:, 1:], tol).all(1).sum())
        self.monotone_strict += int((energies[:, 1:] <= energies[:, :-1]).all(1).sum())
        self.layers_descend += int(lowered(layer_before, layer_after, tol).all(1).sum())
        if step_scales is not None:
            self.layer_steps += int(step_scales.numel())
            self.backtracked_steps += int((step_scales < 1).sum())

    def merge(self, other: DescentCounts) -> DescentCounts:
        return DescentCounts(*(a + b for a, b in zip(self.as_tuple(), other.as_tuple())))

    def as_tuple(self) -> tuple[int, ...]:
        return (self.samples, self.monotone, self.monotone_strict, self.layers_descend, self.layer_steps,
                self.backtracked_steps)

    def shares(self) -> dict:
        n = max(self.samples, 1)
        return {"samples": self.samples, "monotone_share": self.monotone / n,
                "monotone_share_strict": self.monotone_strict / n, "layer_descent_share": self.layers_descend / n,
                "backtracked_layer_share": self.backtracked_steps / self.layer_steps if self.layer_steps else None}
