"""`SequenceClassifier`: token embeddings → (linear map) → (+ positions) → encoder → masked mean pooling →
(LayerNorm) → head.

An encoder with a `pool(hidden, padding_mask) -> (B, d)` method (CRATE, whose published readout pools
before its final LayerNorm) pools its own way."""
from __future__ import annotations

import torch
from torch import Tensor, nn

from .config import FINAL_NORMS, ModelConfig
from .model import masked_mean
from .positions import AbsolutePositions
from .pretrained import PretrainedError, PretrainedMixin, model_class

__all__ = ["FINAL_NORMS", "SequenceClassifier", "build_encoder", "masked_mean"]


def build_encoder(config: ModelConfig) -> nn.Module:
    """`UnfoldedTransformer` for the unfolded presets, `StandardTransformer` for `standard`, the peer
    encoders `EnergyTransformer` / `Crate` for `energy-transformer` / `crate`."""
    from .baselines import StandardTransformer
    from .model import UnfoldedTransformer
    from .peers import Crate, EnergyTransformer

    config = config.resolved()
    encoders = {"standard": StandardTransformer, "energy-transformer": EnergyTransformer, "crate": Crate}
    return encoders.get(config.attention, UnfoldedTransformer)(config)


class SequenceClassifier(PretrainedMixin, nn.Module):
    """Token embeddings → (linear map to d_model) → encoder → masked mean pooling → (LayerNorm) → linear head.

    `final_norm`: a LayerNorm in the readout — `"pooled"` on the mean-pooled vector, `"tokens"` on every token
    before pooling, `"none"`. It is outside the encoder's energy, so every certificate of the encoder holds
    unchanged. The certified kinds take `"pooled"` by default in training (`model.final_norm`): their layers do
    not normalise the states, and without a norm the head's logits move by ~lr·|state| per optimiser step
    (docs/results/fresh.md). `embedding_table` (V, e) initialises the token embeddings, frozen unless
    `trainable_embeddings`; a linear map to the encoder width is added when e ≠ d_model
    (or when `project` is set). With absolute positions in the encoder's config (`positions` learned or
    sinusoidal, THEORY §3.9) the position table is added after the map: the encoder's input X is
    embedding + position (every guarantee of the encoder holds for any X). Rotary positions live inside
    the encoder's attention.
    """

    def __init__(self, encoder: nn.Module, embedding_table: Tensor, d_model: int, n_classes: int = 2,
                 trainable_embeddings: bool = False, project: bool | None = None, pad_id: int = 0,
                 final_norm: str = "none"):
        super().__init__()
        self.embedding = nn.Embedding.from_pretrained(embedding_table.float(), freeze=not trainable_embeddings,
                                                      padding_idx=pad_id)
        e = embedding_table.shape[1]
        self.project = nn.Linear(e, d_model) if (project or e != d_model) else nn.Identity()
        self.encoder, self.head = encoder, nn.Linear(d_model, n_classes)
        if final_norm not in FINAL_NORMS:
            raise ValueError(f"final_norm must be one of {', '.join(FINAL_NORMS)}, got {final_norm!r}")
        self.final_norm = final_norm                               # outside the encoder's energy
        self.norm = nn.LayerNorm(d_model) if final_norm != "none" else None
        cfg = getattr(encoder, "config", None)
        kind = getattr(cfg, "positions", None) or "none"
        self.positions = AbsolutePositions(kind, d_model, cfg.max_positions) \
            if kind in ("learned", "sinusoidal") else None

    def forward(self, ids: Tensor, padding_mask: Tensor | None = None, *, return_energies: bool | str = False,
                safeguard: bool = False):
        """ids (B, n) long; `padding_mask` (B, n) bool, True marks padding. Returns (logits (B, C), EncoderOutput).

        `return_energies` (True / "curve" / "steps") and `safeguard` go to an unfolded encoder (see
        `UnfoldedTransformer.forward`)."""
        x = self.project(self.embedding(ids))                      # (B, n, d_model)
        if self.positions is not None:
            x = self.positions(x)                                  # (B, n, d_model) X = embedding + P[:n]
        options = {"return_energies": return_energies} if return_energies else {}
        if safeguard:
            options["safeguard"] = True
        out = self.encoder(x, padding_mask, **options)
        return self.head(self.readout(out.hidden, padding_mask)), out

    def readout(self, hidden: Tensor, padding_mask: Tensor | None = None) -> Tensor:
        """The vector the head reads, (B, d_model), from the encoder's output states (B, n, d_model): masked
        mean pooling (or the encoder's own `pool`, CRATE) with the `final_norm` LayerNorm before or after it."""
        pool = getattr(self.encoder, "pool", None)               # an encoder with its own readout (CRATE)
        if self.final_norm == "tokens":
            hidden = self.norm(hidden)                                             # (B, n, d_model)
        pooled = pool(hidden, padding_mask) if pool is not None else masked_mean(hidden, padding_mask)   # (B, d)
        return self.norm(pooled) if self.final_norm == "pooled" else pooled

    def _pretrained_init(self) -> dict:
        """The constructor's arguments, the embedding table by shape (its values are in the weights)."""
        vocab, dim = self.embedding.weight.shape
        return {"encoder": {"class": type(self.encoder).__name__, "init": self.encoder._pretrained_init()},
                "vocab_size": vocab, "embedding_dim": dim, "d_model": self.head.in_features,
                "n_classes": self.head.out_features, "trainable_embeddings": self.embedding.weight.requires_grad,
                "project": isinstance(self.project, nn.Linear), "pad_id": self.embedding.padding_idx,
                "final_norm": self.final_norm}

    @classmethod
    def _from_pretrained_init(cls, init: dict) -> SequenceClassifier:
        encoder_cls = model_class(init["encoder"]["class"])
        if encoder_cls is None:
            raise PretrainedError(f"unknown encoder class {init['encoder']['class']!r}")
        table = torch.zeros(init["vocab_size"], init["embedding_dim"])      # (V, e): values from the weights
        return cls(encoder_cls._from_pretrained_init(init["encoder"]["init"]), table, init["d_model"],
                   init["n_classes"], init["trainable_embeddings"], init["project"], init["pad_id"],
                   init.get("final_norm", "none"))                         # folders saved before the field: none
