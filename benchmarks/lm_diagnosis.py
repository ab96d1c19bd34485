"""Why the certified decoder trails the standard one: what its attention does, and screens of variants.

    python benchmarks/lm_diagnosis.py attention        # n-gram baselines + attention statistics of the trained runs
    python benchmarks/lm_diagnosis.py screen --variant strict,innorm,rotary [--iters 500]
    python benchmarks/lm_diagnosis.py estimator --run RUN [--draws 200]   # nanoGPT's 20-batch loss estimate

`attention` needs the 2,000-iteration scratch folders of `benchmarks/lm.py run` (certified and certified-untied);
it writes benchmarks/results/lm/diagnosis/attention.json:
- count n-gram models of the validation split, fitted on the training split (add-0.1 smoothing): the loss a model
  reaches from the current character alone (bigram) or the last two (trigram);
- per layer of each certified run, on 32 validation windows: the attention rows' effective number of keys
  (exp of the weights' entropy) over the visible keys m_i, the weight on the token itself and on the previous
  token against the uniform 1/m_i, the attention's share of the step's target (the gate ν'd_i/(ν'd_i + 1)), and
  the learned scales s_h. Positions 8 and later (enough keys to tell uniform from peaked).

`screen` trains the tied certified decoder for a few hundred iterations with variants that are *not* library
options (they change the step inside this process only, so their token energies are not evaluated) and writes
benchmarks/results/lm/diagnosis/screen-<variants>.json:
- `strict`: the self pair out of each conditional energy (keys j < i; THEORY §3.11 allows it): the step can then
  attend to a neighbour instead of always weighting itself most (β_ii = ρ'(0) is the largest weight);
- `innorm`: the decoder's input X = LayerNorm(E[ids] + P[i]) (no affine), states of norm √d instead of ~0.5, so
  that distances are large enough for peaked attention;
- `rotary`: rotary positions in the decoder (THEORY §3.9) besides the learned absolute ones;
- `lam<λ>` / `normnone`: λ and no length normalisation;
- `keysfree`: per-head maps and free context keys (`--keys free`); `untied`: one layer per depth; `lr<x>`: peak lr;
- `sphere`: every head block of the state on the sphere of radius √dh (the input projected, each step's result
  projected back). With the isotropic majoriser of each token's head block, the projected step minimises it over the
  sphere, so every token's energy still falls (tied layers: the blocks are those of the one shared basis);
- `bias64`: the library's `relative_bias=64`; `stepbias` (with it, tied): a bias table per step besides it;
- `ffn<k>`: an FFN of k·width hidden units instead of 4·width (the tied model's capacity; `ffn16` gives the tied
  layer about the standard decoder's parameter count); `wd<x>`: AdamW's weight decay (default 0.1, nanoGPT's);
- `standardtied`: the standard pre-LN GPT decoder with one block shared by its 4 layers (all other variants
  apply to the certified decoder): what tying the layers costs a decoder that is not certified;
- `nanogpt`: the standard decoder as nanoGPT's model: no biases, its initialisation (`_as_nanogpt`), which of
  our standard decoder's differences from nanoGPT's moves its loss toward nanoGPT's reported 1.88;
- `learnsteps`: the library's `learn_steps=True` (the step size α and the FFN weight γ learned, one pair per
  layer; a tied decoder's steps share one);
- `sharedffn` / `sharedattn`: the untied decoder with one FFN (or one attention) shared by its 4 layers, the other
  part per layer: which shared part costs the tied decoder its loss;
- `relbias[K]`: the library's `relative_bias=64` with b = K θ instead of 10 θ (K = 1 by default): pair weights
  e^{b} > 0 in each token's conditional energy. The committed `relbias`, `relbias10` and
  `keysfree-normnone-relbias-lr3e-3` screens ran before the library had the option, through a pass of explicit
  differences of the same energy (commit 174d619); `relbias10` is `bias64`.
`estimator` reads a trained run folder (`unfoldformer lm train`) and compares its loss on the whole validation split
with nanoGPT's estimate of it (`estimate_loss`: the mean over 20 batches of 12 random windows of 64 characters), drawn
`--draws` times with independent windows: how far a single reported estimate, such as nanoGPT's 1.88, may fall from
the whole split's loss. Writes benchmarks/results/lm/diagnosis/estimator-<run folder name>.json.
Run with OMP_NUM_THREADS=1.
"""
from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

import torch
import torch.nn.functional as F_nn
from torch import Tensor, nn

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "src"))

import unfoldformer.causal as causal  # noqa: E402
import unfoldformer.layers as causal_layers  # noqa: E402
import unfoldformer.lm.model as lm_model  # noqa: E402
import unfoldformer.lm.train as lm_train  # noqa: E402
from unfoldformer.config import ModelConfig  # noqa: E402
from unfoldformer.lm.data import load_text, split, validation_windows  # noqa: E402
from unfoldformer.lm.tokenizer import CharTokenizer  # noqa: E402
from unfoldformer.utils import write_json  # noqa: E402

OUT = ROOT / "benchmarks" / "results" / "lm" / "diagnosis"
SCRATCH = Path(os.environ.get("UNFOLDFORMER_SCRATCH", "/tmp/unfoldformer-lm-runs"))
FROM = 8                                      # statistics over positions i ≥ FROM


def ngram_losses() -> dict:
    """Validation cross-entropy (nats) of count unigram, bigram and trigram models fitted on the training split."""
    text = load_text("tinyshakespeare")
    tok = CharTokenizer.from_text(text)
    train, val = split(torch.tensor(tok.encode(text)), 64)
    V = tok.vocab_size
    out = {}
    for order in (1, 2, 3):
        counts = torch.full((V,) * order, 0.1, dtype=torch.float64)
        index = tuple(train[k: len(train) - order + 1 + k] for k in range(order))
        counts.index_put_(index, torch.ones(len(index[0]), dtype=torch.float64), accumulate=True)
        logp = (counts / counts.sum(-1, keepdim=True)).log()
        vindex = tuple(val[k: len(val) - order + 1 + k] for k in range(order))
        out[("unigram", "bigram", "trigram")[order - 1]] = float(-logp[vindex].mean())
    return out


def _row(a: Tensor, k: Tensor, log_nu: Tensor, strict: bool, scales: list[float]) -> dict:
    """The statistics of one layer's pass: queries a and keys k (B, n, H, dh), log ν' (H,) or (B, n, H) (with
    log μ_h added for maps)."""
    at, kt = a.double().transpose(1, 2), k.double().transpose(1, 2)   # (B, H, n, dh)
    n = at.shape[2]
    logits = at @ kt.transpose(-1, -2) - 0.5 * kt.square().sum(-1)[:, :, None, :]   # (B, H, n, n)
    seen = torch.ones(n, n, dtype=torch.bool).tril(-1 if strict else 0)
    seen[0, 0] = True                                              # row 0 (never counted): no empty row
    logits = logits.masked_fill(~seen, float("-inf"))
    w = torch.softmax(logits, -1)                                  # (B, H, n, n) the rows' weights
    entropy = -(w * w.clamp_min(1e-300).log()).sum(-1)             # (B, H, n)
    m = torch.arange(1, n + 1, dtype=torch.float64) - (1 if strict else 0)
    m[0] = 1
    own = torch.diagonal(w, dim1=-2, dim2=-1)                      # (B, H, n)
    prev = torch.diagonal(w, offset=-1, dim1=-2, dim2=-1)          # (B, H, n − 1) weight on j = i − 1
    log_deg = torch.logsumexp(logits, -1) - 0.5 * at.square().sum(-1)
    nu = log_nu.double()
    nu = nu.permute(0, 2, 1) if nu.dim() == 3 else nu[None, :, None]   # (B or 1, H, n or 1)
    gate = torch.sigmoid(nu + log_deg)                             # (B, H, n) the attention's share
    return {"effective_keys_share": float((entropy.exp() / m)[..., FROM:].mean()),
            "self_weight": float(own[..., FROM:].mean()), "previous_weight": float(prev[..., FROM - 1:].mean()),
            "uniform_weight": float((1 / m)[FROM:].mean()), "gate": float(gate[..., FROM:].mean()),
            "scales": scales}


def attention_statistics(folder: Path, windows: int = 32, strict: bool = False) -> list[dict]:
    """Per layer of the run in `folder`: the module doc's statistics, recorded around `causal.causal_targets`
    and `causal.mapped_targets` (`strict`: of the step without the self pair, keys j < i). For per-head maps
    the `scales` column holds ‖A_h‖₂."""
    model, tok, cfg = lm_train.load_run(folder)
    model.eval()
    _, val = split(torch.tensor(tok.encode(load_text(cfg.data))), cfg.context)
    x, _ = validation_windows(val, cfg.context)
    rows, tied, mapped = [], causal.causal_targets, causal.mapped_targets

    def recorded(C, P, scales, log_nu, valid, rho, *, last_only=False, bias=None):
        a = (C - C[:, :1]) * scales[:, None]                           # (B, n, H, dh) no padding here
        rows.append(_row(a, a, log_nu, strict, [round(float(s), 4) for s in scales]))
        return tied(C, P, scales, log_nu, valid, rho, last_only=last_only, bias=bias)

    def recorded_mapped(C, keys, P, A, mu, log_nu, valid, rho, *, last_only=False, bias=None):
        queries = torch.einsum("bnhk,hlk->bnhl", C, A)                 # c A_hᵀ
        norms = torch.linalg.matrix_norm(A.double(), ord=2)
        rows.append(_row(queries, queries if keys is None else keys, log_nu + mu.log(), strict,
                         [round(float(v), 4) for v in norms]))
        return mapped(C, keys, P, A, mu, log_nu, valid, rho, last_only=last_only, bias=bias)

    causal.causal_targets, causal.mapped_targets = recorded, recorded_mapped
    try:
        with torch.no_grad():
            model(x[:windows])
    finally:
        causal.causal_targets, causal.mapped_targets = tied, mapped
    return rows


def attention() -> Path:
    record = {"ngram_val_loss": ngram_losses(), "from_position": FROM, "models": {}}
    for name in ("certified", "certified-untied", "certified-normnone-keysfree", "certified-untied-normnone-keysfree"):
        for seed in (0, 1, 2):
            folder = SCRATCH / f"{name}-seed{seed}-iters2000"
            if (folder / "model.safetensors").is_file():
                record["models"][f"{name}-seed{seed}"] = attention_statistics(folder)
    path = OUT / "attention.json"
    write_json(path, record)
    print(path, record["ngram_val_loss"], flush=True)
    return path


_library_average = causal._softmax_average


def _strict_average(a, k, V, valid, last_only):
    """`causal._softmax_average` without the self pair: query i sees keys j < i (a row without keys: weight 0).
    The library's pass on keys shifted by one: query i + 1 in its causal mode sees keys ≤ i."""
    none = torch.full_like(a[:, :1, :, 0], -1e30)                   # (B, 1, H) log d of a row without keys
    if a.shape[1] == 1:
        return torch.zeros_like(V[:, -1:]), none
    if last_only:
        return _library_average(a, k[:, :-1], V[:, :-1], valid[:, :-1], True)
    out, log_deg = _library_average(a[:, 1:], k[:, :-1], V[:, :-1], valid[:, :-1], False)
    return torch.cat([torch.zeros_like(V[:, :1]), out], 1), torch.cat([none, log_deg], 1)


def _step_bias_variant() -> None:
    """Screen only, tied decoders with `bias64`: besides the layer's one table, a bias table per step ℓ (depth, H, K),
    b_ℓ = 10 (θ + θ_ℓ), so that the one layer's heads may prefer other offsets at each application. Each step's
    pair weights are still positive constants of each token's energy. The step is told ℓ by counting calls (every
    forward here applies the layers in order)."""
    init, step = lm_model.LanguageModel.__init__, causal.causal_joint_step
    calls = {"n": 0}

    def with_tables(self, config):
        init(self, config)
        depth = config.decoder["depth"]
        for module in self.modules():
            if isinstance(module, causal_layers.AnchoredAttention) and hasattr(module, "relative_bias_table"):
                module.step_bias = torch.nn.Parameter(torch.zeros(depth, *module.relative_bias_table.shape))

    def stepped(f, Y, Xr, valid, alpha, rotary, *, last_only=False):
        att = f.layer.attention
        ell = calls["n"] % att.step_bias.shape[0]
        calls["n"] += 1
        f = f._replace(bias=f.bias + causal_layers.RELATIVE_BIAS_SCALE * att.step_bias[ell].to(f.bias.dtype))
        return step(f, Y, Xr, valid, alpha, rotary, last_only=last_only)

    lm_model.LanguageModel.__init__ = with_tables
    causal.causal_joint_step = stepped


def _as_nanogpt(model: nn.Module) -> nn.Module:
    """The standard decoder as nanoGPT's model (its `model.py`, `bias=False`): no biases in the linear maps and
    LayerNorms (zero and frozen), weights N(0, 0.02), the residual projections N(0, 0.02/√(2L))."""
    blocks = model.decoder.blocks
    with torch.no_grad():
        for module in model.modules():
            if isinstance(module, (nn.Linear, nn.LayerNorm)) and module.bias is not None:
                module.bias.zero_()
                module.bias.requires_grad_(False)
            if isinstance(module, nn.Linear):
                module.weight.normal_(0.0, 0.02)
        for block in blocks:
            for proj in (block.out, block.proj):
                proj.weight.normal_(0.0, 0.02 / (2 * len(blocks)) ** 0.5)
    return model


def screen(variants: list[str], iters: int, seed: int) -> Path:
    """Train the tied certified decoder with `variants` (module doc) and record its whole-split validation loss."""
    known = {"strict", "innorm", "rotary", "normnone", "keysfree", "untied", "sphere", "bias64", "stepbias",
             "sharedffn", "sharedattn", "learnsteps", "standardtied", "nanogpt"}
    lam, lr, bias_scale, ffn, wd = 1.0, 1e-3, None, None, 0.1
    for v in variants:
        if v.startswith("ffn"):
            ffn = int(v[3:])
        elif v.startswith("wd"):
            wd = float(v[2:])
        elif v.startswith("relbias"):
            bias_scale = float(v[7:] or 1)
        elif v.startswith("lam"):
            lam = float(v[3:])
        elif v.startswith("lr"):
            lr = float(v[2:])
        elif v not in known:
            raise SystemExit(f"unknown variant {v!r}: choose from {sorted(known)}, lam<λ>, lr<x>, "
                             "ffn<k>, wd<x> or relbias<K>")
    if "strict" in variants:
        causal._softmax_average = _strict_average
    if "rotary" in variants or ffn is not None or "learnsteps" in variants:   # decoder fields the LM config lacks
        plain = lm_train.decoder_config

        def decoder_config(cfg):
            fields = {"positions": "rotary"} if "rotary" in variants else {}
            if ffn is not None:
                fields["ffn_hidden"] = ffn * cfg.width
            if "learnsteps" in variants:
                fields["learn_steps"] = True
            return ModelConfig.from_dict({**plain(cfg).to_dict(), **fields})
        lm_train.decoder_config = decoder_config
    if "innorm" in variants:
        raw = lm_model.LanguageModel.inputs

        def inputs(self, ids, start=0):
            x = raw(self, ids, start)
            return F_nn.layer_norm(x, x.shape[-1:])
        lm_model.LanguageModel.inputs = inputs
    if "sphere" in variants:
        step = causal.causal_joint_step

        def on_sphere(Y: Tensor, H: int) -> Tensor:                 # (B, n, d): each head block at radius √dh
            B, n, d = Y.shape
            C = Y.reshape(B, n, H, d // H)
            return (C * ((d // H) ** 0.5 / C.norm(dim=-1, keepdim=True).clamp_min(1e-12))).reshape(B, n, d)

        def sphere_step(f, Y, Xr, valid, alpha, rotary, *, last_only=False):
            H = f.layer.attention.H
            return on_sphere(step(f, on_sphere(Y, H), Xr, valid, alpha, rotary, last_only=last_only), H)
        causal.causal_joint_step = sphere_step
    if bias_scale is not None:                                      # the library's biases, b = Kθ
        causal_layers.RELATIVE_BIAS_SCALE = bias_scale
    if "stepbias" in variants:
        _step_bias_variant()
    shared = [part for part, name in (("ffn", "sharedffn"), ("attention", "sharedattn")) if name in variants]
    if shared:
        build = lm_train.build_model

        def build_shared(cfg, tokenizer):
            model = build(cfg, tokenizer)
            layers = model.decoder.layers
            for layer in layers[1:]:
                for part in shared:                                  # one module object for every layer
                    setattr(layer, part, getattr(layers[0], part))
            return model
        lm_train.build_model = build_shared
    if "standardtied" in variants:
        build = lm_train.build_model

        def build_tied_gpt(cfg, tokenizer):
            model = build(cfg, tokenizer)
            blocks = model.decoder.blocks
            model.decoder.blocks = nn.ModuleList([blocks[0]] * len(blocks))   # one GPT block applied 4 times
            return model
        lm_train.build_model = build_tied_gpt
    if "nanogpt" in variants:
        build = lm_train.build_model

        def build_nanogpt(cfg, tokenizer):
            return _as_nanogpt(build(cfg, tokenizer))
        lm_train.build_model = build_nanogpt
    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    name = "-".join(variants) or "plain"
    untied = "untied" in variants or bool(shared)
    kind = "standard" if {"standardtied", "nanogpt"} & set(variants) else "certified-untied" if untied else "certified"
    cfg = lm_train.LMTrainConfig(model=kind, iters=iters,
                                 lr=lr, min_lr=lr / 10, keys="free" if "keysfree" in variants else "tied",
                                 relative_bias=64 if "bias64" in variants or bias_scale is not None else 0,
                                 seed=seed, eval_interval=max(1, iters // 4),
                                 eval_windows=100, anchor_weight=lam, weight_decay=wd,
                                 attention_norm="none" if "normnone" in variants else "length",
                                 basis="learned")                  # the committed screens' decoders had one
    folder = SCRATCH / "screens" / f"{name}-seed{seed}-iters{iters}"
    lm_train.train(cfg, folder, resume=(folder / "state.pt").is_file(), device="cpu", progress=False)
    model, tok, cfg = lm_train.load_run(folder)
    _, val = split(torch.tensor(tok.encode(load_text(cfg.data))), cfg.context)
    result = lm_train.evaluate_model(model, val)
    path = OUT / f"screen-{name}-seed{seed}-iters{iters}.json"
    write_json(path, {"variants": variants, "seed": seed, "iters": iters, "val_loss": result["val_loss"],
                      "stats": [] if kind == "standard" else attention_statistics(folder, strict="strict" in variants)})
    print(f"{path}: val loss {result['val_loss']:.4f}", flush=True)
    return path


@torch.no_grad()
def estimator(folder: Path, draws: int, batches: int = 20, batch: int = 12, seed: int = 0) -> Path:
    """The whole split's loss and `draws` nanoGPT estimates of it (module doc)."""
    from unfoldformer.lm.data import batches as random_windows
    model, tok, cfg = lm_train.load_run(folder)
    _, val = split(torch.tensor(tok.encode(load_text(cfg.data))), cfg.context)
    whole = lm_train.evaluate_model(model, val)["val_loss"]
    g = torch.Generator().manual_seed(seed)
    estimates = []
    for _ in range(draws):
        losses = []
        for _ in range(batches):
            x, y = random_windows(val, cfg.context, batch, g)      # (batch, context) each, as nanoGPT's get_batch
            losses.append(float(model(x, y)[1]))
        estimates.append(sum(losses) / batches)
    ranked = sorted(estimates)
    mean = sum(estimates) / draws
    std = (sum((e - mean) ** 2 for e in estimates) / (draws - 1)) ** 0.5
    record = {"run": folder.name, "model": cfg.model, "seed": cfg.seed, "iters": cfg.iters, "whole_split": whole,
              "draws": draws, "batches": batches, "batch": batch, "context": cfg.context, "mean": mean, "std": std,
              "min": ranked[0], "max": ranked[-1], "p05": ranked[int(0.05 * draws)],
              "p95": ranked[int(0.95 * draws) - 1],
              "share_within_0.05_of_1.88": sum(abs(e - 1.88) <= 0.05 for e in estimates) / draws}
    path = OUT / f"estimator-{folder.name}.json"
    write_json(path, record)
    print(f"{path}: whole split {whole:.4f}; 20-batch estimates {mean:.4f} ± {std:.4f} "
          f"(5–95 %: {record['p05']:.4f}–{record['p95']:.4f})", flush=True)
    return path


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    sub.add_parser("attention")
    s = sub.add_parser("screen")
    s.add_argument("--variant", default="", help="comma-separated: strict, innorm, rotary, normnone, keysfree, "
                   "untied, sphere, bias64, stepbias, lam<λ>, lr<x>, relbias<K>")
    s.add_argument("--iters", type=int, default=500)
    s.add_argument("--seed", type=int, default=0)
    e = sub.add_parser("estimator")
    e.add_argument("--run", type=Path, required=True, help="a run folder of `unfoldformer lm train`")
    e.add_argument("--draws", type=int, default=200)
    args = p.parse_args()
    if args.cmd == "attention":
        attention()
    elif args.cmd == "estimator":
        estimator(args.run, args.draws)
    else:
        screen([v for v in args.variant.split(",") if v], args.iters, args.seed)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
