"""Using a trained classifier without the training code: `load(RUN_OR_CHECKPOINT) -> Predictor`.

    import unfoldformer as uf
    predictor = uf.load("runs/sst2")                       # a run folder, .safetensors or checkpoint.pt
    predictor = uf.load("sst2-certified")             # a zoo model (`unfoldformer zoo`), offline
    predictor.save_pretrained("my-classifier")             # a model folder (`persist`); uf.load reads it
    for p in predictor(["a gripping, beautiful film", "dull and far too long"]):
        print(p.label_name, p.probabilities, p.energies)   # energies: E(Y⁽⁰⁾), …, E(Y⁽ᵀ⁾)
        print(p.energies_per_token)                         # the same curve per real token, E/n

The embedding table and tokenizer are rebuilt from the saved config and checked against the
sha256 stored with the weights, so a prediction uses exactly the trained function. The weights'
checksums are verified on load (`Predictor.integrity`: "verified", "verified by the run folder's
manifest" for a file without checksums that its folder's `complete.json` vouches for, or
"unverified …" when the caller passed `trust_unverified=True`; such a file is otherwise refused).
A prediction whose probabilities or energies are not finite is refused (`NonFiniteResultError`,
naming the text and the quantity), never returned.
"""
from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from .contracts import NonFiniteResultError, check_at_least, check_device, first_non_finite_row, resolve_device
from .descent import descent_tolerance, lowered
from .model import UnfoldedTransformer
from .persist.classifier import classifier_source, load_classifier, save_predictor
from .persist.rebuild import LABEL_NAMES

__all__ = ["LABEL_NAMES", "Prediction", "Predictor", "load"]


@dataclass
class Prediction:
    """One text's prediction: label, class probabilities and (unfolded models) the energies.

    A tied model has one energy E: `energies` is its curve E(Y⁽⁰⁾), …, E(Y⁽ᵀ⁾) and `never_rises` says
    whether that curve never rises. An untied model has one energy per layer, E_ℓ: entry ℓ ≥ 1 of
    `energies` is E_ℓ(Y⁽ℓ⁾), values of different functions, so it is not one curve and `never_rises` is
    None; what the model certifies is `layers_descend`: E_ℓ(Y⁽ℓ⁾) ≤ E_ℓ(Y⁽ℓ⁻¹⁾) for every layer ℓ.
    Both allow the states' round-off (`descent.descent_tolerance`).
    """

    text: str
    label: int
    label_name: str
    probabilities: list[float]
    tokens: int                            # tokens the model read (after truncation)
    energies: list[float] | None = None    # tied: E(Y⁽⁰⁾), …, E(Y⁽ᵀ⁾); untied: E_1(Y⁽⁰⁾), E_ℓ(Y⁽ℓ⁾); float64
    energies_per_token: list[float] | None = None   # the same values divided by `tokens` (E/n)
    never_rises: bool | None = None        # tied: the curve never rises; untied: None (no single curve)
    layers_descend: bool | None = None     # every layer lowers its own energy E_ℓ (tied: E_ℓ = E)

    def to_dict(self) -> dict:
        return asdict(self)


class Predictor:
    """A trained `SequenceClassifier` with its embeddings: texts in, `Prediction`s out."""

    def __init__(self, model, embeddings, max_length: int | None, config=None, path: Path | None = None,
                 integrity: str | None = None, label_names: Sequence[str] | None = None):
        if not isinstance(model, torch.nn.Module) or not hasattr(model, "encoder"):
            raise TypeError(f"Predictor needs a trained SequenceClassifier (use unfoldformer.load(RUN)), got "
                            f"{type(model).__name__}")
        if not (hasattr(embeddings, "encode") and hasattr(embeddings, "pad_id")):
            raise TypeError(f"Predictor needs the classifier's embeddings (with encode and pad_id), got "
                            f"{type(embeddings).__name__}")
        self.model, self.embeddings, self.max_length = model.eval(), embeddings, max_length
        self.config, self.path, self.integrity = config, path, integrity
        n = model.head.out_features
        self.label_names = tuple(label_names) if label_names is not None else tuple(
            _label_name(i, n) for i in range(n))
        if len(self.label_names) != n:
            raise ValueError(f"{len(self.label_names)} label names for a model with {n} classes")

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    @property
    def unfolded(self) -> bool:
        return isinstance(self.model.encoder, UnfoldedTransformer)

    @torch.no_grad()
    def predict(self, texts: Sequence[str], *, energies: bool = True, safeguard: bool = False,
                batch_size: int = 32) -> list[Prediction]:
        """Predictions for `texts` (truncated to the training length `max_length`).

        `energies`: also the energy curve (unfolded models); `safeguard`: whole-layer descent by
        backtracking (THEORY §3.5), so the curve never rises."""
        texts = _checked_texts(texts)
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        out: list[Prediction] = []
        for start in range(0, len(texts), batch_size):
            out += self._batch(list(texts[start:start + batch_size]), energies and self.unfolded,
                               safeguard and self.unfolded, start)
        return out

    __call__ = predict

    def save_pretrained(self, folder) -> Path:
        """This classifier as a model folder (model.safetensors, config.json, README.md card and complete.json,
        `persist.folder`); returns it. A run's folder (the one it was loaded from included) is refused:
        `OutputError`, a model folder goes beside a run, never into it."""
        return save_predictor(self, folder)

    @classmethod
    def from_pretrained(cls, source, **kwargs) -> Predictor:
        """`load(source, **kwargs)`: a pretrained folder, zoo model name or Hub repo id (or a run)."""
        return load(source, **kwargs)

    def _batch(self, texts: list[str], energies: bool, safeguard: bool, start: int = 0) -> list[Prediction]:
        enc = self.embeddings.encode(texts, self.max_length)
        ids, mask = enc.ids.to(self.device), enc.padding_mask.to(self.device)
        if ids.shape[1] == 0:                                      # every text empty: one pad token each
            ids, mask = ids.new_full((len(texts), 1), self.embeddings.pad_id), mask.new_ones(len(texts), 1)
        mask[:, 0] &= (~mask).any(1)                               # an empty text reads one pad token, as in training
        logits, result = self.model(ids, mask, return_energies=energies, safeguard=safeguard)
        probs = torch.softmax(logits.double(), dim=-1).cpu()       # (B, C)
        _refuse_non_finite(texts, start, probs, result.energies)
        per_token = result.energies_per_token(mask) if result.energies is not None else None   # (B, T + 1)
        preds = []
        for i, text in enumerate(texts):
            label = int(probs[i].argmax())
            pred = Prediction(text, label, self.label_names[label], probs[i].tolist(), int((~mask[i]).sum()))
            if result.energies is not None:
                curve = result.energies[i].cpu()
                pred.energies = curve.tolist()
                pred.energies_per_token = per_token[i].cpu().tolist()
                tol = descent_tolerance(result.hidden.dtype)              # the states' own round-off
                if self.model.encoder.config.tied:                         # one energy: one curve
                    pred.never_rises = bool(lowered(curve[:-1], curve[1:], tol).all())
                pred.layers_descend = bool(lowered(result.layer_before[i], result.layer_after[i], tol).all())
            preds.append(pred)
        return preds


def _refuse_non_finite(texts: list[str], start: int, probs: torch.Tensor, energies: torch.Tensor | None) -> None:
    """NonFiniteResultError naming the first text whose probabilities or energies are NaN or infinite."""
    bad = first_non_finite_row({"class probabilities": probs, "energy curve": energies})
    if bad is not None:
        i, name, where, value = bad
        raise NonFiniteResultError(f"text {start + i} ({texts[i][:40]!r}): its {name} has {value} at {where}; a "
                                   "non-finite prediction is not reported (are the weights damaged?)")


def _label_name(label: int, n_classes: int) -> str:
    return LABEL_NAMES[label] if n_classes == len(LABEL_NAMES) else str(label)


def load(path: str | Path, *, data_dir: str | Path | None = None, max_length: int | None = -1,
         device: str = "cpu", trust_unverified: bool = False) -> Predictor:
    """A `Predictor` for a run folder (its best weights), a `.safetensors` file, a `checkpoint.pt`, a
    pretrained folder (`Predictor.save_pretrained`), a zoo model's name or a Hub repo id ("owner/name").

    `max_length`: truncation of the inputs (default -1: the training length; None: full length).
    `data_dir`: data folder for vocabularies built from the data (random / GloVe embeddings).
    `device`: auto, cpu, cuda (cuda:N) or mps, checked before anything is read.
    `trust_unverified`: read a weights file that carries no checksums although no run-folder manifest
    vouches for it (refused otherwise: it could have been changed without trace).
    Predictions name their class by the training data's labels (`Prediction.label_name`)."""
    check_device("device", device)
    if max_length != -1:
        check_at_least("max_length", max_length, optional=True)
    loaded = load_classifier(classifier_source(path), data_dir=None if data_dir is None else str(data_dir),
                             trust_unverified=trust_unverified)
    length = loaded.config.data.max_length if max_length == -1 else max_length
    predictor = Predictor(loaded.model.to(resolve_device(device)), loaded.embeddings, length, loaded.config,
                          loaded.path, loaded.info.get("integrity"), loaded.label_names)
    predictor.info = loaded.info                               # run id, metrics: kept by save_pretrained
    return predictor


def _checked_texts(texts) -> list[str]:
    """`texts` (a sequence or other iterable of str, a generator included) as a list; TypeError in one line
    for a single string, None, bytes, a mapping or any item that is not a str (naming its position)."""
    if isinstance(texts, str):
        raise TypeError("predict expects a list of texts, not a single string")
    if isinstance(texts, (bytes, bytearray, Mapping)) or not isinstance(texts, Iterable):
        raise TypeError(f"predict expects a list of texts (str), got {type(texts).__name__}")
    texts = list(texts)
    for i, text in enumerate(texts):
        if not isinstance(text, str):
            raise TypeError(f"predict expects texts (str); item {i} is {type(text).__name__}: {text!r:.40}")
    return texts
