"""Independent float reference energies for the certificate tests and `benchmarks/certificate_check.py`: the
joint layer's energy written from THEORY §2/§3.7 with explicit pair differences c_i − c_j in long double (numpy),
never through the library's Gram path or fused pass. Only the operators are read from the library (its float64
frame: the stored parameters converted exactly, W̃ = QᵀW₁, s_h or A_h per contiguous head, rotary rotations)."""
from __future__ import annotations

import numpy as np
import torch

from unfoldformer.rho import get_rho

LD = np.longdouble


def reference_layer_energy(stack, Yt: torch.Tensor, Xt: torch.Tensor, pad: torch.Tensor) -> np.ndarray:
    """E(Ỹ) of a depth-1 joint model in its own coordinates (the states Ỹ, X̃ the model stepped between;
    `stack` a `JointStack` built with exact=True), in long double: (B,)."""
    f = stack.frame64(0)
    layer = f.layer
    att = layer.attention
    H = att.H
    gamma = float(layer.gamma.detach()) if isinstance(layer.gamma, torch.Tensor) else float(layer.gamma)
    lam = float(att.lam.detach()) if isinstance(att.lam, torch.Tensor) else float(att.lam)
    C = stack.heads(Yt.double().where(~pad[..., None], 0.0), H)       # (B, n, H, dh), rotated with rotary
    if f.A is None:
        maps = torch.stack([s * torch.eye(C.shape[-1], dtype=torch.float64) for s in f.scales.detach()])
    else:
        maps = f.A.detach()                                             # (H, dh, dh) A_h
    A = maps.double().numpy().astype(LD)
    W, b = f.W.detach().double().numpy().astype(LD), f.b.detach().double().numpy().astype(LD)
    rho = get_rho(att.rho)
    out = []
    for s in range(Yt.shape[0]):
        real = ~pad[s]
        c = C[s][real].numpy().astype(LD)                               # (n, H, dh)
        y, x = Yt[s][real].double().numpy().astype(LD), Xt[s][real].double().numpy().astype(LD)
        n = c.shape[0]
        a = np.einsum("ijhe,hke->hijk", c[:, None] - c[None], A)        # (H, n, n, dh) explicit pair differences
        zz = 0.5 * (a * a).sum(-1)                                      # (H, n, n)
        upper = np.triu(np.ones((n, n), bool), 1)
        vals = rho.value(torch.from_numpy(zz.astype(np.float64))).numpy().astype(LD)
        e_att = (vals * upper).sum() / (n if att.length_norm else 1)
        h = np.maximum(y @ W + b, 0)
        e_h = 0.5 * (y * y).sum() - 0.5 * (h * h).sum()
        out.append(e_att + (0.5 * ((y - x) ** 2).sum() + LD(gamma) * e_h) / LD(lam))
    return np.array(out, dtype=LD)
