"""`DistilledEncoder`: a certified encoder over the teacher's input layer, with a readout into teacher space.

    student = DistilledEncoder(ModelConfig.preset("certified", d_model=384, n_heads=12, ffn_hidden=1536,
                                                  depth=6, tied=True))
    states = student(ids, padding_mask)                 # (B, n, 384) in the teacher's last-layer space
    vectors = student.encode(["a sentence", "another"])   # (2, 384), L2-normalised mean pooling
    student.save_pretrained("minilm-l6-certified")        # weights, config.json and a model card (README.md)

X = LayerNorm(word + position + token type) is the teacher's own input layer (`teacher.InputEmbeddings`);
the certified stack descends its energy anchored at X, and a readout maps its last state to the teacher's
space: `identity`, `linear` (d x d + bias, initialised as the identity) or `layernorm` (affine, as a BERT
output). The readout sits after the stack, so every layer's certificate is untouched by it.
With `trainable_embeddings=False` (default) the input layer is frozen and not stored: `state_dict` leaves it
out and loading takes it from the teacher package (checked against pip's sha256), so a saved student holds
only the certified layers and the readout.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..config import ModelConfig
from ..encoder import CertifiedEncoder
from ..errors import ConfigError
from ..hub import PretrainedMixin
from .teacher import MINILM, InputEmbeddings, WordPieces, mean_pool, teacher_folder

__all__ = ["READOUTS", "DistilledEncoder"]

READOUTS = ("identity", "linear", "layernorm")


def _drop_frozen(module: nn.Module, state: dict, prefix: str, local_metadata) -> None:
    for key in [k for k in state if k.startswith(prefix)]:
        del state[key]


def _fill_frozen(module: nn.Module, state: dict, prefix: str, *args) -> None:
    own = [*module.named_parameters(), *module.named_buffers()]          # (state_dict() would drop them)
    for name, tensor in own:                                              # own values where the file has none
        state.setdefault(prefix + name, tensor.detach())


class DistilledEncoder(PretrainedMixin, nn.Module):
    """Teacher input layer -> certified stack (anchored at its output) -> readout (module doc).

    Loading widens float16 weights (the zoo stores its encoders so) to float32: the certified stack and its
    energies compute in float32 / float64 whatever the stored precision."""

    widen_on_load = True

    def __init__(self, config: ModelConfig, *, teacher: str = MINILM, readout: str = "linear",
                 trainable_embeddings: bool = False, max_length: int = 128):
        super().__init__()
        if readout not in READOUTS:
            raise ConfigError(f"readout={readout!r}: expected one of {', '.join(READOUTS)}")
        self.teacher, self.readout_kind, self.max_length = str(teacher), readout, int(max_length)
        self.trainable_embeddings = bool(trainable_embeddings)
        folder = teacher_folder(teacher)
        self.inputs = InputEmbeddings(folder, trainable=self.trainable_embeddings)
        config = config.resolved()
        if config.d_model != self.inputs.dim:
            raise ConfigError(f"d_model={config.d_model}: the student reads the teacher's {self.inputs.dim}-wide "
                              "input layer, so d_model must equal it")
        if not 3 <= self.max_length <= self.inputs.max_positions:
            raise ConfigError(f"max_length={max_length}: expected 3 to {self.inputs.max_positions} "
                              "(the teacher's positions)")
        if not self.trainable_embeddings:
            self.inputs.register_state_dict_post_hook(_drop_frozen)
            self.inputs.register_load_state_dict_pre_hook(_fill_frozen)
        self.encoder = CertifiedEncoder.from_config(config)
        d = config.d_model
        if readout == "linear":
            self.readout = nn.Linear(d, d)
            with torch.no_grad():
                self.readout.weight.copy_(torch.eye(d))
                self.readout.bias.zero_()
        elif readout == "layernorm":
            self.readout = nn.LayerNorm(d)
        else:
            self.readout = nn.Identity()
        self._word_pieces: WordPieces | None = None
        self.card: dict = {}

    @property
    def config(self) -> ModelConfig:
        return self.encoder.config

    @property
    def word_pieces(self) -> WordPieces:
        if self._word_pieces is None:
            self._word_pieces = WordPieces(teacher_folder(self.teacher))
        return self._word_pieces

    def forward(self, ids: Tensor, padding_mask: Tensor, *, return_energies: bool | str = False):
        """Token states (B, n, d) in teacher space for word-piece `ids` (B, n) ([CLS] ... [SEP], padded);
        with `return_energies`, (states, the stack's `EncoderOutput`)."""
        x = self.inputs(ids, padding_mask)                                       # (B, n, d)
        out = self.encoder(x, src_key_padding_mask=padding_mask, return_energies=return_energies)
        hidden = out.hidden if return_energies else out                          # (B, n, d)
        states = self.readout(hidden).masked_fill(padding_mask.unsqueeze(-1), 0.0)   # (B, n, d)
        return (states, out) if return_energies else states

    @torch.no_grad()
    def encode(self, texts: list[str], batch_size: int = 64, normalize: bool = True) -> Tensor:
        """(N, d) sentence embeddings: mean over real tokens of the output states ([CLS], [SEP] included),
        L2-normalised unless `normalize=False`, as sentence-transformers' all-MiniLM-L6-v2 gives them."""
        if isinstance(texts, str):
            raise TypeError("encode expects a list of texts, not a single string")
        device = next(self.encoder.parameters()).device
        out = []
        for start in range(0, len(texts), batch_size):
            ids, mask = self.word_pieces.encode(texts[start:start + batch_size], self.max_length)
            pooled = mean_pool(self(ids.to(device), mask.to(device)), mask.to(device)).cpu()   # (b, d)
            out.append(F.normalize(pooled, dim=-1) if normalize else pooled)
        return torch.cat(out) if out else torch.empty(0, self.config.d_model)

    def _pretrained_init(self) -> dict:
        return {"config": self.config.to_dict(), "teacher": self.teacher, "readout": self.readout_kind,
                "trainable_embeddings": self.trainable_embeddings, "max_length": self.max_length}

    @classmethod
    def _from_pretrained_init(cls, init: dict) -> DistilledEncoder:
        return cls(ModelConfig.from_dict(init["config"]), teacher=init["teacher"], readout=init["readout"],
                   trainable_embeddings=init["trainable_embeddings"], max_length=init["max_length"])

    def _model_card(self) -> str:
        """The folder's README.md (`save_pretrained` writes it with the weights, before the manifest)."""
        return model_card(self)


def model_card(student: DistilledEncoder) -> str:
    """A Hugging Face-style model card: YAML metadata, then what the model is, its data, metrics and certificate.
    `student.card` may add `data` (text), `metrics` ({name: value}) and `training` (text)."""
    cfg, card = student.config, student.card
    metrics = card.get("metrics") or {}
    rows = "\n".join(f"| {name} | {value} |" for name, value in metrics.items()) or "| (not measured yet) | |"
    kind = "tied: one layer applied" if cfg.tied else "untied:"
    stored = ("the input layer is trained and stored" if student.trainable_embeddings else
              "only the certified layers and the readout are stored; the input layer (word pieces, positions, "
              "LayerNorm) is read from the teacher package at load time")
    return f"""---
license: apache-2.0
library_name: unfoldformer
base_model: sentence-transformers/all-MiniLM-L6-v2
pipeline_tag: feature-extraction
tags:
- unfoldformer
- certified-descent
- distillation
- sentence-embeddings
---

# Certified encoder distilled from all-MiniLM-L6-v2

A certified joint encoder ({kind} {cfg.depth} layers, d = {cfg.d_model}, {cfg.n_heads} heads, FFN width
{cfg.ffn_hidden}, rho = {cfg.rho}) trained to reproduce the last-layer token states of
all-MiniLM-L6-v2 from its own input layer; readout `{student.readout_kind}`; {stored}.

## The certificate
Every layer is one majorisation-minimisation step on an explicit energy anchored at the input
(THEORY §3.7): each layer lowers its energy on every input, by construction, whatever the weights.
The readout is applied after the last layer and does not enter the energy.

## Use
```python
import unfoldformer as uf
from unfoldformer.distill import DistilledEncoder
model = DistilledEncoder.from_pretrained("FOLDER")
vectors = model.encode(["a sentence", "another one"])   # (2, {cfg.d_model}), L2-normalised
```

## Training data
{card.get("data", "SST-2 training sentences and IMDB training + unlabelled reviews (no evaluation split).")}

## Training
{card.get("training", "Distillation on the teacher's last-layer token states (unfoldformer distill).")}

## Metrics
| measure | value |
|---|---|
{rows}

## Intended use
Sentence embeddings and a starting point for fine-tuning certified classifiers on English text.
Limits: English, lower-cased word pieces, at most {student.max_length} pieces per text; the distilled model
inherits the teacher's biases and carries less of its function than the teacher.
"""
