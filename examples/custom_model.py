"""A certified layer inside your own model: embedding -> CertifiedEncoder -> mean pooling -> head.

    python examples/custom_model.py [--steps 30] [--d-model 32] [--layers 4]

Trains a few steps on random token data (label: whether token 1 occurs more often than token 2) and
prints the loss and, every few steps, the model's energy curve E(Y⁽⁰⁾) … E(Y⁽ᵀ⁾) per token (E/n).
Runs in seconds on a CPU.
"""
from __future__ import annotations

import argparse

import torch
from torch import nn

import unfoldformer as uf


class MyClassifier(nn.Module):
    """The user's own module: any embedding, a certified encoder, any pooling and head."""

    def __init__(self, vocab: int, d_model: int, nhead: int, layers: int, n_classes: int = 2):
        super().__init__()
        self.embed = nn.Embedding(vocab, d_model, padding_idx=0)
        layer = uf.CertifiedEncoderLayer(d_model, nhead, dim_feedforward=4 * d_model)   # defaults certify
        self.encoder = uf.CertifiedEncoder(layer, num_layers=layers)                     # tied: one energy
        self.head = nn.Linear(d_model, n_classes)

    def forward(self, ids: torch.Tensor, return_energies: bool = False):
        pad = ids == 0                                              # (B, n) True = padding, as in PyTorch
        out = self.encoder(self.embed(ids), src_key_padding_mask=pad, return_energies=return_energies)
        hidden = out.hidden if return_energies else out             # (B, n, d)
        keep = (~pad).unsqueeze(-1).to(hidden.dtype)                # (B, n, 1)
        logits = self.head((hidden * keep).sum(1) / keep.sum(1).clamp_min(1))
        return (logits, out) if return_energies else logits


def random_batch(g: torch.Generator, batch: int, length: int, vocab: int):
    ids = torch.randint(1, vocab, (batch, length), generator=g)
    lengths = torch.randint(2, length + 1, (batch,), generator=g)
    ids[torch.arange(length)[None, :] >= lengths[:, None]] = 0    # padding at the end
    labels = ((ids == 1).sum(1) > (ids == 2).sum(1)).long()
    return ids, labels


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--d-model", type=int, default=32)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--vocab", type=int, default=8)
    p.add_argument("--length", type=int, default=12)
    args = p.parse_args(argv)
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(0)
    model = MyClassifier(args.vocab, args.d_model, args.heads, args.layers)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    every = max(1, args.steps // 3)
    for step in range(1, args.steps + 1):
        ids, labels = random_batch(g, 32, args.length, args.vocab)
        loss = nn.functional.cross_entropy(model(ids), labels)
        opt.zero_grad()
        loss.backward()
        opt.step()
        if step % every == 0 or step == args.steps:
            with torch.no_grad():
                _, out = model(ids, return_energies=True)
            per_token = out.energies / (ids != 0).sum(1, keepdim=True)            # (B, T + 1) E/n
            curve = " ".join(f"{v:.3f}" for v in per_token.mean(0).tolist())
            print(f"step {step:3d}  loss {loss.item():.4f}  mean E/n per layer: {curve}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
