"""Running the measures of the ρ study on one model: the first step's kernel, attention maps of fixed
sentences, and the depth dynamics t = 0 … T of three step sequences (THEORY §3.1, §3.3):

- `model`: the model's own layers (anchored attention + tied FFN), energy E = E_A + E_H + λ⁻¹½‖Y − X‖²;
- `anchored`: the anchored attention steps alone, energy λ⁻¹½‖Y − X‖² + E_A (with the anchor);
- `anchored_unit`: the same with λ replaced by λ / ρ'(0), i.e. the kernel scaled to ρ'(0) = 1: the
  anchored step weighs attention by ν·ρ'(z), so a kernel's overall size ρ'(0) acts like λ; this one
  compares kernel shapes only;
- `attention`: the plain MM step on E_A with the same heads and step size (without the anchor); the
  row normalisation makes it depend on the kernel's shape only.

Tied models run T = 12 steps of their one layer, untied ones their `depth` layers. Random-init models
also run the attention-only sequences with the head distances rescaled so that the median z at t = 0
is 0.1 … 30 (`SWEEP_Z`), the anchor weight ν = λ s_h² kept at the model's: the kernels differ most
where the distances sit on their slopes.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch
from torch.nn.utils import parametrize

from .. import energy as E
from .. import steps as S
from ..data import load_dataset, seeded_subset
from ..data.batching import eval_batches
from ..rho import get_rho
from .measures import AttentionStats, Dynamics, attention_stats, row_weights, run_dynamics
from .models import Source
from .settings import STEPS, RhoStudySettings

__all__ = ["DYNAMICS", "Inputs", "SWEEP_Z", "TIMES", "load_inputs", "study_model"]

DYNAMICS = ("model", "anchored", "anchored_unit", "attention")
SWEEP_Z = (0.1, 1.0, 3.0, 10.0, 30.0)
TIMES = (6, 12)
MAP_SENTENCES, MAP_TOKENS = 3, 14


@dataclass
class Inputs:
    """One dataset's study sentences, tokenised: ids and padding mask (N, n), length-sorted batches."""

    dataset: str
    texts: list[str]
    ids: torch.Tensor
    mask: torch.Tensor
    batches: list[list[int]]
    map_rows: list[int]                 # the fixed sentences of the attention maps
    map_tokens: list[list[str]]


def load_inputs(dataset: str, settings: RhoStudySettings, embeddings) -> Inputs:
    """`settings.samples` seeded random texts of the dataset's labelled held-out split, truncated."""
    from ..data import EVAL_SPLITS
    examples = load_dataset(dataset, EVAL_SPLITS[dataset], settings.data_dir)
    idx = seeded_subset(len(examples), settings.samples, settings.seed)
    texts = [examples[i].text for i in (range(len(examples)) if idx is None else idx)]
    enc = embeddings.encode(texts, settings.max_length(dataset))
    lengths = (~enc.padding_mask).sum(1).numpy()
    # B·n² ≤ 2^20 per batch keeps the dense per-head weights of the kernel statistics small
    batches = [b for b in eval_batches(lengths, settings.batch_size, max_tokens_sq=1 << 20)]
    fitting = [i for i in np.argsort(lengths, kind="stable") if 8 <= lengths[i] <= MAP_TOKENS]
    rows = (fitting or np.argsort(-lengths, kind="stable").tolist())[:MAP_SENTENCES]
    return Inputs(dataset, texts, enc.ids, enc.padding_mask, batches, [int(r) for r in rows],
                  [token_strings(enc.ids[r][~enc.padding_mask[r]][:MAP_TOKENS].tolist()) for r in rows])


def token_strings(ids: list[int]) -> list[str]:
    """Word pieces of MiniLM token ids."""
    from tokenizers import Tokenizer

    from ..data.embeddings import _minilm_folder
    tok = Tokenizer.from_file(str(_minilm_folder() / "tokenizer.json"))
    return [tok.id_to_token(i) for i in ids]


def _sequences(encoder, kind: str, X, mask, head_scale: float = 1.0):
    """(step(Y, t), energy(Y, t)) of one of the `DYNAMICS` on the encoder's layers."""
    def attention(t):
        return encoder.layer(t).attention

    if kind == "model":
        return (lambda Y, t: encoder.layer(t)(Y, X, mask),
                lambda Y, t: encoder.layer(t).energy(Y, X, mask))
    if kind in ("anchored", "anchored_unit"):
        def lam(a):   # rescaled heads keep the model's anchor balance ν = λ s_h²; "unit" also divides by ρ'(0)
            return a.lam / head_scale**2 / (kernel_at_zero(a.rho) if kind == "anchored_unit" else 1.0)

        def anchored(Y, t):
            a = attention(t)
            return S.anchored_attention_step(Y, X, head_scale * a.log_scale.exp(), lam(a), a.rho, a.alpha, mask,
                                             a.subspaces())

        def anchored_energy(Y, t):
            a = attention(t)
            return E.attention_energy(Y, head_scale * a.factors(), a.rho, mask) + E.anchor_energy(Y, X, mask) / lam(a)
        return anchored, anchored_energy
    return (lambda Y, t: S.attention_step(Y, head_scale * attention(t).factors(), attention(t).rho,
                                          attention(t).alpha, mask, attention(t).subspaces()),
            lambda Y, t: E.attention_energy(Y, head_scale * attention(t).factors(), attention(t).rho, mask))


def kernel_at_zero(rho) -> float:
    """ρ'(0), the weight of a token on itself."""
    return float(get_rho(rho).derivative(torch.zeros((), dtype=torch.float64)))


def _per_sentence(dyn: Dynamics) -> dict:
    """The per-sentence values the verdicts pair across ρ: at t in TIMES."""
    a = dyn.arrays()
    retained = a["spread"] / np.where(a["spread"][:, :1] > 0, a["spread"][:, :1], np.nan)
    return {int(t): {"spread_retained": retained[:, t], "cosine": a["cosine"][:, t],
                     "effective_rank": a["effective_rank"][:, t]} for t in TIMES if t < a["spread"].shape[1]}


def study_model(source: Source, inputs: Inputs, settings: RhoStudySettings, sweep: bool = False) -> dict:
    """All measures of one model on one dataset's sentences (see the module docstring); with `sweep` (random-init
    models) also the distance-scale sweep."""
    clf = source.model
    encoder = clf.encoder
    steps = STEPS if encoder.config.tied else encoder.config.depth
    stats, dyns = AttentionStats(), {k: Dynamics() for k in DYNAMICS}
    first = encoder.layer(0).attention
    with torch.no_grad(), parametrize.cached():
        nu = first.lam * first.log_scale.exp() ** 2                # (H,) ν = λ s_h²
        inputs_by_batch = []
        for batch in inputs.batches:
            ids, mask = inputs.ids[batch], inputs.mask[batch]
            width = int((~mask).sum(1).max())
            ids, mask = ids[:, :width], mask[:, :width]
            X = clf.project(clf.embedding(ids))                    # (B, n, d) the encoder's input
            inputs_by_batch.append((X, mask))
            attention_stats(stats, X, first.factors(), first.rho, mask, nu)
            for kind in DYNAMICS:
                run_dynamics(dyns[kind], X, mask, steps, *_sequences(encoder, kind, X, mask))
        maps = []
        for row in inputs.map_rows:
            ids = inputs.ids[row:row + 1, :MAP_TOKENS]
            mask = inputs.mask[row:row + 1, :MAP_TOKENS]
            X = clf.project(clf.embedding(ids))
            P, _ = row_weights(X, first.factors(), first.rho, mask)   # (1, H, n, n)
            keep = int((~mask).sum())
            maps.append(P[0, :, :keep, :keep].numpy())
        summary = stats.summary()
        out = {"origin": source.origin, "accuracy": source.accuracy, "budget": source.budget, "steps": steps,
               "kernel_at_zero": kernel_at_zero(first.rho),
               "attention": summary, "dynamics": {k: d.summary(TIMES) for k, d in dyns.items()},
               "per_sentence": {k: _per_sentence(d) for k, d in dyns.items()}, "maps": maps}
        if sweep:
            out["sweep"] = _sweep(encoder, inputs_by_batch, summary["z_median"], steps)
    return out


def _sweep(encoder, batches, z_median: float, steps: int) -> dict:
    """The two attention-only sequences with heads rescaled to put the median z at each of SWEEP_Z."""
    out = {}
    for target in SWEEP_Z:
        scale = math.sqrt(target / max(z_median, 1e-12))           # z scales with the square of the heads
        dyns = {k: Dynamics() for k in DYNAMICS if k != "model"}
        for X, mask in batches:
            for kind, dyn in dyns.items():
                step, _ = _sequences(encoder, kind, X, mask, scale)
                run_dynamics(dyn, X, mask, steps, step, None)      # diversity only: no energies in the sweep
        out[str(target)] = {"head_scale": scale, "dynamics": {k: d.summary(TIMES) for k, d in dyns.items()},
                            "per_sentence": {k: _per_sentence(d) for k, d in dyns.items()}}
    return out
