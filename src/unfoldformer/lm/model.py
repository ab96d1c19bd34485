"""`LanguageModel`: token embedding + learned absolute positions, a decoder, a final norm, a tied output head.

The decoder is the certified one (`UnfoldedTransformer` of a causal config, THEORY §3.11) or the standard GPT
(`gpt.StandardDecoder`, which ends in its own LayerNorm). Logits are LN(h) Eᵀ with E the token embedding (tied
head, as GPT-2 and nanoGPT). The certified decoder's input X = E[ids] + P[positions] is the anchor of every
layer's energy.

`generate(prompt_ids, max_new_tokens, temperature=1.0, top_k=None)` runs the prompt once (`prefill`) and then one
token at a time through the decoder's cache of each layer's inputs (`extend`), whose output equals the full
forward; when the sequence outgrows the context, the last `context` tokens are run again from scratch (learned
positions move), as nanoGPT crops.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, field

import torch
import torch.nn.functional as F_nn
from torch import Tensor, nn

from ..config import ModelConfig
from ..decoder import extend, prefill
from ..errors import ConfigError
from ..gpt import StandardDecoder
from ..model import UnfoldedTransformer
from ..pretrained import PretrainedMixin

__all__ = ["LMConfig", "LanguageModel"]


@dataclass
class LMConfig:
    """vocab_size, context (longest sequence, rows of the position table), the decoder's ModelConfig (a causal
    certified preset or `standard`) and the tokenizer's description."""

    vocab_size: int
    context: int
    decoder: dict
    tokenizer: dict = field(default_factory=dict)

    def model_config(self) -> ModelConfig:
        return ModelConfig.from_dict(self.decoder)

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> LMConfig:
        try:
            return cls(**data)
        except TypeError as exc:
            raise ConfigError(f"not a language model config: {exc}") from None


class LanguageModel(PretrainedMixin, nn.Module):
    """A character (or any token) language model on a certified or a standard decoder (module doc)."""

    def __init__(self, config: LMConfig):
        super().__init__()
        cfg = config.model_config()
        if cfg.attention == "standard":
            self.decoder = StandardDecoder(cfg)
        elif cfg.causal:
            self.decoder = UnfoldedTransformer(cfg)
        else:
            raise ConfigError(f"a language model needs a causal decoder: preset 'certified-causal' or 'standard', "
                              f"got preset {cfg.preset_name!r} with causal={cfg.causal}")
        if config.vocab_size < 1 or config.context < 1:
            raise ConfigError(f"vocab_size and context must be >= 1, got {config.vocab_size}, {config.context}")
        self.config = config
        d = cfg.d_model
        self.embed = nn.Embedding(config.vocab_size, d)
        self.positions = nn.Embedding(config.context, d)
        nn.init.normal_(self.embed.weight, std=0.02)
        nn.init.normal_(self.positions.weight, std=0.02)
        self.norm = None if self.standard else nn.LayerNorm(d)     # the GPT decoder ends in its own LayerNorm

    @property
    def standard(self) -> bool:
        return isinstance(self.decoder, StandardDecoder)

    def inputs(self, ids: Tensor, start: int = 0) -> Tensor:
        """X = E[ids] + P[start : start + n]: (B, n) -> (B, n, d)."""
        n = ids.shape[1]
        if start + n > self.config.context:
            raise ConfigError(f"{start + n} tokens exceed the model's context of {self.config.context}")
        if ids.numel() and (int(ids.min()) < 0 or int(ids.max()) >= self.config.vocab_size):
            raise ConfigError(f"token ids must lie in [0, {self.config.vocab_size}), got {int(ids.min())}…"
                              f"{int(ids.max())}")
        pos = torch.arange(start, start + n, device=ids.device)
        return self.embed(ids) + self.positions(pos)[None]

    def _logits(self, h: Tensor) -> Tensor:
        return F_nn.linear(h if self.norm is None else self.norm(h), self.embed.weight)   # (B, n, V) tied head

    def hidden(self, ids: Tensor, *, return_energies: bool = False):
        """The decoder's output on ids (B, n); with `return_energies` (certified only) its `DecoderOutput`."""
        x = self.inputs(ids)
        if self.standard:
            if return_energies:
                raise ConfigError("the standard decoder has no energy")
            return self.decoder(x)
        out = self.decoder(x, return_energies=return_energies)
        return out if return_energies else out.hidden

    def forward(self, ids: Tensor, targets: Tensor | None = None) -> tuple[Tensor, Tensor | None]:
        """(logits (B, n, V), mean cross-entropy against `targets` (B, n) or None)."""
        logits = self._logits(self.hidden(ids))
        loss = None if targets is None else F_nn.cross_entropy(logits.flatten(0, 1).float(), targets.flatten())
        return logits, loss

    def _prefill(self, x: Tensor):
        return self.decoder.prefill(x) if self.standard else prefill(self.decoder, x)

    def _extend(self, cache, x: Tensor) -> Tensor:
        return self.decoder.extend(cache, x) if self.standard else extend(self.decoder, cache, x)

    @torch.no_grad()
    def generate(self, prompt_ids: Tensor, max_new_tokens: int, temperature: float = 1.0, top_k: int | None = None,
                 generator: torch.Generator | None = None) -> Tensor:
        """prompt_ids (B, t), t ≥ 1 -> (B, t + max_new_tokens): sampled continuations (module doc).
        temperature > 0; top_k: sample among the k likeliest tokens only (None: all)."""
        if prompt_ids.dim() != 2 or prompt_ids.shape[1] < 1:
            raise ConfigError(f"prompt_ids must be (B, t) with t >= 1, got shape {tuple(prompt_ids.shape)}")
        if not temperature > 0:
            raise ConfigError(f"temperature must be > 0, got {temperature}")
        if top_k is not None and not 1 <= top_k:
            raise ConfigError(f"top_k must be >= 1, got {top_k}")
        ids = prompt_ids[:, -self.config.context:]
        out = [prompt_ids]
        h, cache = self._prefill(self.inputs(ids))
        h = h[:, -1:]                                                # (B, 1, d)
        for _ in range(max_new_tokens):
            logits = self._logits(h)[:, -1].float() / temperature   # (B, V)
            if top_k is not None:
                kth = torch.topk(logits, min(top_k, logits.shape[-1])).values[:, -1:]
                logits = logits.masked_fill(logits < kth, float("-inf"))
            nxt = torch.multinomial(torch.softmax(logits, -1), 1, generator=generator)   # (B, 1)
            out.append(nxt)
            ids = torch.cat([ids, nxt], dim=1)
            if ids.shape[1] > self.config.context:                   # crop: positions move, run the window again
                ids = ids[:, -self.config.context:]
                h, cache = self._prefill(self.inputs(ids))
                h = h[:, -1:]
            else:
                h = self._extend(cache, self.inputs(nxt, start=ids.shape[1] - 1))
        return torch.cat(out, dim=1)

    def _pretrained_init(self) -> dict:
        return {"lm": self.config.to_dict()}

    @classmethod
    def _from_pretrained_init(cls, init: dict) -> LanguageModel:
        return cls(LMConfig.from_dict(init["lm"]))
