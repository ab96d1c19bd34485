"""Positions (THEORY §3.9): absolute embeddings added to the input, and rotary coordinates.

`ModelConfig.positions` picks one scheme for any encoder:

- ``none``        a bag of tokens (the default);
- ``learned``     a trainable table P (max_positions, d) added to the input: X ← X + P[:n];
- ``sinusoidal``  the fixed table of Vaswani et al. (sin/cos of i / 10000^{2k/d}) times one learned gain g,
                  added to the input: X ← X + g P[:n]. g starts at 0.02·√2, so the table's entries start at
                  RMS 0.02 like the learned table's: unscaled (entries of RMS 1/√2, a norm of √(d/2)) the
                  positions outweigh the token embeddings of the benchmark (norm ≈ 0.3 after the linear map)
                  about 25:1, and an IMDB model at the screening budget stayed at chance (51.2 %);
- ``rotary``      RoPE inside attention. Certified attention (anchored, alternating or joint layer) rotates
                  queries, keys **and values**: the step of §3.3 / §3.7 in rotated coordinates c̃_i = R_i c_i,
                  mapped back with R_iᵀ (`rotate_heads`); the standard baseline rotates queries and keys.

Absolute embeddings are only a different input X, so every guarantee holds unchanged; the classifier adds
them (`AbsolutePositions`), the encoders see the enriched X. Rotary attention keeps every guarantee because
the energy in c̃ is the energy of §3.3 / §3.7 with per-token rotated anchors (THEORY §3.9).

Position of a token: its absolute index i in the sequence (0 … n − 1). The library pads on the right, so
for every real token this is also the number of real tokens before it, and padding never changes a real
token's position (or its result: padded keys take no weight).

Rotation layout: within a head of even width k, coordinates (2t, 2t + 1) rotate by the angle i·θ_t,
θ_t = 10000^{−2t/k}.
"""
from __future__ import annotations

import torch
from torch import Tensor, nn

from .errors import ConfigError

__all__ = ["POSITIONS", "AbsolutePositions", "rope_tables", "rotate_heads", "sinusoidal_table"]

POSITIONS = ("none", "learned", "sinusoidal", "rotary")
ROPE_BASE = 10000.0


def sinusoidal_table(n: int, d: int, dtype: torch.dtype = torch.float32, device=None) -> Tensor:
    """(n, d): entry (i, 2t) = sin(i ω_t), (i, 2t + 1) = cos(i ω_t), ω_t = 10000^{−2t/d} (odd d: last column sin)."""
    i = torch.arange(n, dtype=torch.float64, device=device)[:, None]           # (n, 1)
    omega = ROPE_BASE ** (-torch.arange(0, d, 2, dtype=torch.float64, device=device) / d)   # (⌈d/2⌉,)
    table = torch.zeros(n, d, dtype=torch.float64, device=device)
    table[:, 0::2] = torch.sin(i * omega)
    table[:, 1::2] = torch.cos(i * omega[: d // 2])
    return table.to(dtype)


class AbsolutePositions(nn.Module):
    """X ← X + P[:n] (learned table of `max_positions` rows), or X + g P[:n] (the fixed sinusoidal table, one
    learned gain g)."""

    def __init__(self, kind: str, d: int, max_positions: int | None = None):
        super().__init__()
        if kind not in ("learned", "sinusoidal"):
            raise ConfigError(f"absolute positions are learned or sinusoidal, got {kind!r}")
        self.kind, self.d, self.max_positions = kind, d, max_positions
        self.table = nn.Parameter(torch.randn(max_positions, d) * 0.02) if kind == "learned" else None
        self.gain = nn.Parameter(torch.tensor(0.02 * 2 ** 0.5)) if kind == "sinusoidal" else None

    def forward(self, x: Tensor) -> Tensor:
        """x (B, n, d) -> x + P[:n] (learned) or x + g P[:n] (sinusoidal): (B, n, d)."""
        n = x.shape[1]
        if self.table is None:
            return x + self.gain.to(x.dtype) * sinusoidal_table(n, self.d, x.dtype, x.device)
        if n > self.max_positions:
            raise ConfigError(f"sequence of {n} tokens is longer than max_positions={self.max_positions} "
                              "of the learned position table")
        return x + self.table[:n].to(x.dtype)


def rope_tables(n: int, k: int, dtype: torch.dtype, device=None) -> tuple[Tensor, Tensor]:
    """cos(i θ_t), sin(i θ_t) for positions i < n and pairs t < k/2: two (n, k/2) tables (angles in float64)."""
    if k % 2:
        raise ConfigError(f"rotary positions need an even head width, got {k}")
    i = torch.arange(n, dtype=torch.float64, device=device)[:, None]
    theta = ROPE_BASE ** (-torch.arange(0, k, 2, dtype=torch.float64, device=device) / k)   # (k/2,)
    angle = i * theta                                                           # (n, k/2)
    return torch.cos(angle).to(dtype), torch.sin(angle).to(dtype)


def rotate_heads(C: Tensor, tables: tuple[Tensor, Tensor], inverse: bool = False) -> Tensor:
    """R_i c_i (or R_iᵀ c_i with `inverse`) per token i and head: C (B, n, H, k) head coordinates, blocks
    of the last dimension rotated pairwise (module doc). Returns (B, n, H, k); norms are kept exactly up to
    round-off (each pair is one 2 × 2 rotation)."""
    cos, sin = tables                                                           # (n, k/2) each
    cos, sin = cos[:, None, :], (-sin if inverse else sin)[:, None, :]          # (n, 1, k/2)
    even, odd = C[..., 0::2], C[..., 1::2]                                      # (B, n, H, k/2)
    return torch.stack([even * cos - odd * sin, even * sin + odd * cos], dim=-1).flatten(-2)
