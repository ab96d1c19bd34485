"""`SequenceClassifier`: token embeddings → (linear map) → (+ positions) → encoder → masked mean pooling →
(LayerNorm) → head. With a `BertInput` (a classifier started from a distilled encoder, `model.init`) the input
is BERT's own: [CLS] pieces [SEP] → LayerNorm(word + position) → encoder.

An encoder with a `pool(hidden, padding_mask) -> (B, d)` method (CRATE, whose published readout pools
before its final LayerNorm) pools its own way."""
from __future__ import annotations

import torch
from torch import Tensor, nn

from .config import FINAL_NORMS, ModelConfig
from .model import masked_mean
from .positions import AbsolutePositions
from .pretrained import PretrainedError, PretrainedMixin, model_class

__all__ = ["FINAL_NORMS", "BertInput", "SequenceClassifier", "build_encoder", "masked_mean"]


def build_encoder(config: ModelConfig) -> nn.Module:
    """`UnfoldedTransformer` for the unfolded presets, `StandardTransformer` for `standard`, the peer
    encoders `EnergyTransformer` / `Crate` for `energy-transformer` / `crate`."""
    from .baselines import StandardTransformer
    from .model import UnfoldedTransformer
    from .peers import Crate, EnergyTransformer

    config = config.resolved()
    encoders = {"standard": StandardTransformer, "energy-transformer": EnergyTransformer, "crate": Crate}
    return encoders.get(config.attention, UnfoldedTransformer)(config)


class BertInput(nn.Module):
    """BERT's input layer over a classifier's word-piece table: [CLS] + pieces + [SEP] → LayerNorm(word +
    position) with padded rows zero. `position` holds the position rows with token type 0 folded in, so the
    output equals `distill.teacher.InputEmbeddings` (the anchor X a distilled encoder was trained on).
    The data pipeline is unchanged: `forward` inserts [CLS] before and [SEP] after each row's real pieces."""

    def __init__(self, d_model: int, max_positions: int, cls_id: int, sep_id: int, eps: float = 1e-12):
        super().__init__()
        self.position = nn.Parameter(torch.zeros(max_positions, d_model))      # (P, d)
        self.norm = nn.LayerNorm(d_model, eps=eps)
        self.cls_id, self.sep_id, self.eps = int(cls_id), int(sep_id), float(eps)

    def describe(self) -> dict:
        return {"max_positions": self.position.shape[0], "cls_id": self.cls_id, "sep_id": self.sep_id,
                "eps": self.eps}

    def forward(self, embedding: nn.Embedding, ids: Tensor, padding_mask: Tensor | None) -> tuple[Tensor, Tensor]:
        """(X (B, n + 2, d), its padding mask (B, n + 2)) for `ids` (B, n) with `padding_mask` (B, n)."""
        b, n = ids.shape
        if n + 2 > self.position.shape[0]:
            raise ValueError(f"{n} pieces + [CLS] + [SEP] exceed the {self.position.shape[0]} positions")
        real = torch.full((b,), n, device=ids.device) if padding_mask is None else (~padding_mask).sum(1)   # (B,)
        cols = torch.arange(n + 2, device=ids.device)                                          # (n + 2,)
        wrapped = torch.full((b, n + 2), embedding.padding_idx or 0, dtype=ids.dtype, device=ids.device)
        wrapped[:, 1:n + 1] = ids
        wrapped[:, 0] = self.cls_id
        wrapped[cols[None, :] == real[:, None] + 1] = self.sep_id                             # after the last piece
        mask = cols[None, :] >= real[:, None] + 2                                              # (B, n + 2)
        x = embedding(wrapped) + self.position[:n + 2]                                         # (B, n + 2, d)
        return self.norm(x).masked_fill(mask.unsqueeze(-1), 0.0), mask


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
    the encoder's attention. `bert_input` (`BertInput.describe()`) replaces map and positions by BERT's input
    layer (a classifier started from a distilled encoder); the encoder then sees n + 2 tokens.
    """

    def __init__(self, encoder: nn.Module, embedding_table: Tensor, d_model: int, n_classes: int = 2,
                 trainable_embeddings: bool = False, project: bool | None = None, pad_id: int = 0,
                 final_norm: str = "none", bert_input: dict | None = None):
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
        self.bert_input = BertInput(d_model, **bert_input) if bert_input is not None else None
        if self.bert_input is not None and (self.positions is not None or isinstance(self.project, nn.Linear)):
            raise ValueError("bert_input replaces the input map and absolute positions; the encoder needs "
                             "positions none and the table the encoder's width")

    def forward(self, ids: Tensor, padding_mask: Tensor | None = None, *, return_energies: bool | str = False,
                safeguard: bool = False):
        """ids (B, n) long; `padding_mask` (B, n) bool, True marks padding. Returns (logits (B, C), EncoderOutput).

        `return_energies` (True / "curve" / "steps") and `safeguard` go to an unfolded encoder (see
        `UnfoldedTransformer.forward`)."""
        if self.bert_input is not None:
            x, padding_mask = self.bert_input(self.embedding, ids, padding_mask)   # (B, n + 2, d_model)
        else:
            x = self.project(self.embedding(ids))                  # (B, n, d_model)
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
                "final_norm": self.final_norm,
                **({"bert_input": self.bert_input.describe()} if self.bert_input is not None else {})}

    @classmethod
    def _from_pretrained_init(cls, init: dict) -> SequenceClassifier:
        encoder_cls = model_class(init["encoder"]["class"])
        if encoder_cls is None:
            raise PretrainedError(f"unknown encoder class {init['encoder']['class']!r}")
        table = torch.zeros(init["vocab_size"], init["embedding_dim"])      # (V, e): values from the weights
        return cls(encoder_cls._from_pretrained_init(init["encoder"]["init"]), table, init["d_model"],
                   init["n_classes"], init["trainable_embeddings"], init["project"], init["pad_id"],
                   init.get("final_norm", "none"), init.get("bert_input"))  # folders saved before: none, None
