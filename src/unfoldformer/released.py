"""The formulas of the authors' released code, defects included (THEORY §7.1).

Used only by the `paper-as-released` preset, to show what the released energy E_rel does on
the same inputs as the corrected model. Nothing here is certified: the energy uses the metric
W Wᵀ while attention uses WᵀW, no key-norm bias, ½‖Y W‖² instead of ½‖Y‖², and the FFN weight
is "normalised" by squaring it (twice, after training). See THEORY §7 for the list of defects.
"""
from __future__ import annotations

import torch
from torch import Tensor, nn

from . import energy as E

__all__ = ["ReleasedAttention", "ReleasedFFN", "released_normalize"]


def released_normalize(W_f: Tensor, bound: float = 0.95) -> Tensor:
    """The released weight normalisation: U·clip(Λ, −b, b)·Uᵀ of W_f W_fᵀ (squares W_f; §7.1)."""
    evals, evecs = torch.linalg.eigh(W_f @ W_f.T)
    return (evecs * evals.clamp(-bound, bound)) @ evecs.T


class ReleasedAttention(nn.Module):
    """Y ← softmax(Y WᵀW Yᵀ) Y, no scaling, no key-norm bias; energy uses W Wᵀ instead (§7.1)."""

    def __init__(self, d: int):
        super().__init__()
        self.W = nn.Parameter(nn.init.xavier_normal_(torch.empty(d, d)))

    def forward(self, Y: Tensor, X: Tensor, padding_mask: Tensor | None, scale: float = 1.0) -> Tensor:
        valid = E.check_states(Y, padding_mask)
        a = Y @ self.W.T                                           # (B, n, d): logits a aᵀ = Y WᵀW Yᵀ
        logits = (a @ a.transpose(1, 2)).masked_fill(~valid[:, None, :], float("-inf"))  # (B, n, n)
        new = torch.softmax(logits, dim=-1) @ Y
        return torch.where(valid[..., None], Y + scale * (new - Y), Y)

    def energy(self, Y: Tensor, X: Tensor, padding_mask: Tensor | None) -> Tensor:
        """Σ_{i>j} −exp(−½‖(y_i − y_j) W‖²) + ½‖Y W‖²_F (metric W Wᵀ, as released)."""
        valid = E.check_states(Y, padding_mask)
        YW = (Y.to(torch.float64) @ self.W.to(torch.float64)) * valid[..., None]
        return E.attention_energy(Y, self.W.T, "exp", padding_mask) + 0.5 * YW.pow(2).sum(dim=(1, 2))


class ReleasedFFN(nn.Module):
    """Y ← −Y·½(W_f + W_fᵀ) + b [then ReLU]; energy ½tr(Y W_f Yᵀ) + ½‖Y − 1b‖² (§7.1)."""

    def __init__(self, d: int, relu: bool):
        super().__init__()
        self.relu = relu
        self.W_f = nn.Parameter(nn.init.xavier_normal_(torch.empty(d, d)))
        self.b = nn.Parameter(nn.init.xavier_normal_(torch.empty(1, d)))
        self.normalize_()

    @torch.no_grad()
    def normalize_(self) -> None:
        """Apply the released normalisation in place (calling it twice squares again, as released)."""
        self.W_f.copy_(released_normalize(self.W_f))

    def forward(self, Y: Tensor, padding_mask: Tensor | None, scale: float = 1.0) -> Tensor:
        valid = E.check_states(Y, padding_mask)
        new = -Y @ (0.5 * (self.W_f + self.W_f.T)) + self.b       # (B, n, d)
        new = torch.relu(new) if self.relu else new
        return torch.where(valid[..., None], Y + scale * (new - Y), Y)

    def energy(self, Y: Tensor, padding_mask: Tensor | None) -> Tensor:
        valid = E.check_states(Y, padding_mask)
        w = valid[..., None].to(torch.float64)
        Yd, Wf, b = Y.to(torch.float64) * w, self.W_f.to(torch.float64), self.b.to(torch.float64)
        return 0.5 * ((Yd @ Wf) * Yd).sum(dim=(1, 2)) + 0.5 * ((Yd - b) * w).pow(2).sum(dim=(1, 2))
