"""Which constraint of the certified decoder costs the most: a standard pre-LN GPT with one constraint at a time.

    python benchmarks/lm_ablation.py --variant tiedmlp,nonorm [--iters 2000] [--seed 0]

Variants (comma-separated; none = the standard block, `gpt.py`'s shape written again here so that each
constraint is one switch):
- `tiedmlp`: the MLP's output weight is its input weight transposed (W₂ = W₁ᵀ) with ReLU, as the tied FFN energy
  E_H requires;
- `nonorm`: no LayerNorm inside the blocks (the certified step has none; the final norm stays);
- `qk`: queries = keys (one map per head, W_Q = W_K);
- `vk`: values = keys (W_V = W_K), the output map W_O = W_Kᵀ per head.
nanoGPT's CPU configuration (4 layers, 4 heads, width 128, context 64, batch 12, AdamW 1e-3, 100 warm-up steps,
cosine to 1e-4, weight decay 0.1 on matrices, clipping 1), the whole validation split; one JSON per variant in
benchmarks/results/lm/ablation/. Run with OMP_NUM_THREADS=1.
"""
from __future__ import annotations

import argparse
import math
import os
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F_nn
from torch import Tensor, nn

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "src"))

from unfoldformer.lm.data import batches, load_text, split, validation_windows  # noqa: E402
from unfoldformer.lm.tokenizer import CharTokenizer  # noqa: E402
from unfoldformer.train.build import lr_factor  # noqa: E402
from unfoldformer.utils import write_json  # noqa: E402

OUT = ROOT / "benchmarks" / "results" / "lm" / "ablation"
VARIANTS = ("tiedmlp", "nonorm", "qk", "vk")


class Block(nn.Module):
    def __init__(self, d: int, H: int, variants: set[str]):
        super().__init__()
        self.H, self.v = H, variants
        self.ln1 = nn.Identity() if "nonorm" in variants else nn.LayerNorm(d)
        self.ln2 = nn.Identity() if "nonorm" in variants else nn.LayerNorm(d)
        self.q, self.k = nn.Linear(d, d), nn.Linear(d, d)
        self.val, self.out = nn.Linear(d, d), nn.Linear(d, d)
        self.fc1 = nn.Linear(d, 4 * d)
        self.fc2 = None if "tiedmlp" in variants else nn.Linear(4 * d, d)
        self.b2 = nn.Parameter(torch.zeros(d))

    def forward(self, y: Tensor) -> Tensor:
        B, n, d = y.shape
        h = self.ln1(y)
        k = self.k(h)
        q = k if "qk" in self.v else self.q(h)
        v = k if "vk" in self.v else self.val(h)

        def heads(t: Tensor) -> Tensor:
            return t.view(B, n, self.H, d // self.H).transpose(1, 2)          # (B, H, n, dh)
        a = F_nn.scaled_dot_product_attention(heads(q), heads(k), heads(v), is_causal=True)
        a = a.transpose(1, 2).reshape(B, n, d)
        y = y + (a @ self.k.weight if "vk" in self.v else self.out(a))     # W_O = W_Kᵀ with tied values
        h = F_nn.relu(self.fc1(self.ln2(y))) if "tiedmlp" in self.v else F_nn.gelu(self.fc1(self.ln2(y)))
        return y + (h @ self.fc1.weight + self.b2 if self.fc2 is None else self.fc2(h))


class GPT(nn.Module):
    def __init__(self, V: int, context: int, variants: set[str], d: int = 128, H: int = 4, depth: int = 4):
        super().__init__()
        self.embed, self.pos = nn.Embedding(V, d), nn.Embedding(context, d)
        self.blocks = nn.ModuleList(Block(d, H, variants) for _ in range(depth))
        self.norm = nn.LayerNorm(d)
        for p in self.parameters():
            if p.dim() >= 2:
                nn.init.normal_(p, std=0.02)

    def forward(self, ids: Tensor) -> Tensor:
        y = self.embed(ids) + self.pos(torch.arange(ids.shape[1]))[None]
        for block in self.blocks:
            y = block(y)
        return self.norm(y) @ self.embed.weight.T                        # (B, n, V) tied head


def run(variants: list[str], iters: int, seed: int) -> Path:
    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    torch.manual_seed(seed)
    text = load_text("tinyshakespeare")
    tok = CharTokenizer.from_text(text)
    train, val = split(torch.tensor(tok.encode(text)), 64)
    model = GPT(tok.vocab_size, 64, set(variants))
    decay = [p for p in model.parameters() if p.dim() >= 2]
    rest = [p for p in model.parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1}, {"params": rest, "weight_decay": 0.0}],
                            lr=1e-3, betas=(0.9, 0.99))
    g = torch.Generator().manual_seed(seed)
    start = time.perf_counter()
    for step in range(iters):
        for group in opt.param_groups:
            group["lr"] = 1e-3 * lr_factor(step, 100, iters, 0.1)
        x, y = batches(train, 64, 12, g)
        loss = F_nn.cross_entropy(model(x).flatten(0, 1), y.flatten())
        opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
    train_s = time.perf_counter() - start
    model.eval()
    vx, vy = validation_windows(val, 64)
    total = 0.0
    with torch.no_grad():
        for s in range(0, len(vx), 64):
            total += float(F_nn.cross_entropy(model(vx[s:s + 64]).flatten(0, 1), vy[s:s + 64].flatten(),
                                              reduction="sum"))
    name = "-".join(variants) or "none"
    path = OUT / f"{name}-seed{seed}-iters{iters}.json"
    record = {"variants": variants, "seed": seed, "iters": iters, "val_loss": total / vy.numel(),
              "params": sum(p.numel() for p in model.parameters() if p.grad is not None),   # the ones in use
              "train_s": train_s}
    if not math.isfinite(record["val_loss"]):
        raise SystemExit(f"{name}: the validation loss is not finite")
    write_json(path, record)
    print(f"{path}: val loss {record['val_loss']:.4f}", flush=True)
    return path


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--variant", default="", help=f"comma-separated: {', '.join(VARIANTS)}")
    p.add_argument("--iters", type=int, default=2000)
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args()
    variants = [v for v in args.variant.split(",") if v]
    unknown = set(variants) - set(VARIANTS)
    if unknown:
        p.error(f"unknown variant(s) {sorted(unknown)}: choose from {', '.join(VARIANTS)}")
    run(variants, args.iters, args.seed)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
