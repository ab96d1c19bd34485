"""Settings of the reproduction (`ReproduceSettings`), the figure files and the released-code defects."""
from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass, field

from ..contracts import check_path_given, check_seed
from ..errors import ConfigError

__all__ = ["DATASET_FIGURE", "FIGURE_DATASET", "FIGURE_FILES", "MODES", "RELEASED_DEFECTS", "ReproduceSettings",
           "parse_figures"]

FIGURE_FILES = {1: "fig1_apollonius.png", 2: "fig2_alternating_pca.png", 3: "fig3_alternating_gap.png",
                4: "fig4_kappa.png", 5: "fig5_energy_imdb.png", 6: "fig6_energy_sst2.png"}
FIGURE_DATASET = {5: "imdb", 6: "sst2"}
DATASET_FIGURE = {"imdb": 5, "sst2": 6}

#: Defaults of the full and the quick run; explicit settings override them. `imdb_max_length`: IMDB
#: truncation of the energy curves; `released_examples`: training examples of the paper's SGD recipe;
#: `<data set>_train_examples` / `_train_length`: the AdamW recipes (None: the whole train split);
#: `<data set>_accuracy_samples`: accuracy examples (None: the whole evaluation split).
MODES = {
    "full": dict(samples=200, imdb_max_length=512, released_examples=2000, sst2_train_examples=None,
                 imdb_train_examples=None, sst2_train_length=64, imdb_train_length=64, trained_width=64,
                 trained_batch_size=64, imdb_accuracy_samples=2000, sst2_accuracy_samples=None, grid=401,
                 half_steps=200),
    "quick": dict(samples=32, imdb_max_length=128, released_examples=200, sst2_train_examples=8000,
                  imdb_train_examples=8000, sst2_train_length=64, imdb_train_length=32, trained_width=32,
                  trained_batch_size=16, imdb_accuracy_samples=200, sst2_accuracy_samples=200, grid=201,
                  half_steps=200),
}

RELEASED_DEFECTS = [
    ("the energy uses the metric W Wᵀ while the attention step uses WᵀW",
     "one PSD metric AᵀA for both (`paper` preset, THEORY §3.1)"),
    ("the key-norm bias −½‖a_j‖² is computed but never applied",
     "the bias is applied (softmax with key-norm bias = the MM step of ρ = −exp(−z))"),
    ("the \"ReLU\" random-init figure is built without ReLU",
     "both random-init variants are built explicitly (`relu` flag), same weights"),
    ("the \"SST-2\" curves are computed on IMDB test data",
     "SST-2 curves use SST-2 dev sentences (test has no labels)"),
    ("the classifier has no pooling (a 2n-way softmax over per-token logits)",
     "masked mean pooling + linear head (`SequenceClassifier`)"),
    ("the FFN weight is re-squared after training, so the plotted model is not the trained one",
     "W_F is kept in [−0.95, 0.95] by an eigen-clip inside every forward; the released variant "
     "re-applies `released_normalize_()` after training and reports both accuracies"),
    ("E_rel regularises with ½‖Y W‖² instead of ½‖Y‖² (THEORY §7.1)",
     "the corrected energy is E_A + E_F with the F1 energy of §2"),
]


def parse_figures(spec: str) -> list[int]:
    """'1-6' or '1,2,5' (or a mix, '1-3,5') -> sorted figure numbers in 1..6."""
    figures: set[int] = set()
    for part in str(spec).replace(" ", "").split(","):
        if not part:
            continue
        lo, _, hi = part.partition("-")
        try:
            figures.update(range(int(lo), int(hi or lo) + 1))
        except ValueError:
            raise ConfigError(f"bad --figures {spec!r}; use e.g. '1-6' or '1,2,5'") from None
    if not figures or not figures <= set(FIGURE_FILES):
        raise ConfigError(f"--figures {spec!r} must select figures among 1-6")
    return sorted(figures)


@dataclass
class ReproduceSettings:
    """Everything that shapes one reproduction (saved as `config.json` next to its outputs)."""

    figures: list[int] = field(default_factory=lambda: list(range(1, 7)))
    datasets: list[str] = field(default_factory=lambda: ["imdb", "sst2"])
    mode: str = "full"
    samples: int = 200
    imdb_max_length: int | None = 512
    released_examples: int = 2000
    sst2_train_examples: int | None = None
    imdb_train_examples: int | None = None
    sst2_train_length: int = 64
    imdb_train_length: int = 64
    trained_width: int = 64
    trained_batch_size: int = 64
    train_epochs: int = 1
    imdb_accuracy_samples: int | None = 2000
    sst2_accuracy_samples: int | None = None
    grid: int = 401
    half_steps: int = 200
    embeddings: str = "minilm"
    seed: int = 0
    out: str = "runs/reproduce"
    data_dir: str | None = None
    threads: int = field(default_factory=lambda: os.cpu_count() or 1)
    progress: bool = True

    @classmethod
    def create(cls, figures: str = "1-6", datasets: str | None = None, quick: bool = False,
               **options) -> ReproduceSettings:
        """Mode defaults (`MODES`), overridden by the options that are not None; ConfigError on bad values.

        `accuracy_samples` sets both data sets' accuracy sample counts; `train_examples` the training
        examples of every trained variant (the SGD recipe and both data sets' AdamW recipes)."""
        numbers = parse_figures(figures)
        values = dict(MODES["quick" if quick else "full"])
        for key in ("samples", "train_examples", "train_epochs", "threads", "accuracy_samples"):
            if options.get(key) is not None and options[key] < 1:
                raise ConfigError(f"--{key.replace('_', '-')} must be >= 1, got {options[key]}")
        if options.get("seed") is not None:
            check_seed("--seed", options["seed"])
        for key in ("out", "data_dir", "embeddings"):
            check_path_given(f"--{key.replace('_', '-')}", options.get(key))
        accuracy, train = options.pop("accuracy_samples", None), options.pop("train_examples", None)
        if accuracy is not None:
            values["imdb_accuracy_samples"] = values["sst2_accuracy_samples"] = accuracy
        if train is not None:
            values.update(released_examples=train, sst2_train_examples=train, imdb_train_examples=train)
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = set(options) - known
        if unknown:
            raise ConfigError(f"unknown reproduction setting(s): {', '.join(sorted(unknown))}")
        values.update({k: v for k, v in options.items() if v is not None})
        return cls(figures=numbers, datasets=_datasets(datasets, numbers), mode="quick" if quick else "full",
                   **values)

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


def _datasets(spec: str | None, figures: list[int]) -> list[str]:
    """Data sets of figures 5-6: those of the figures, or the listed ones (none without figure 5 or 6)."""
    if spec is None:
        return [FIGURE_DATASET[f] for f in figures if f in FIGURE_DATASET]
    names = [d.strip().lower().replace("-", "") for d in spec.split(",") if d.strip()]
    if not names:
        raise ConfigError(f"--datasets {spec!r} names no data set; valid: imdb, sst2 (or leave it out)")
    bad = [d for d in names if d not in DATASET_FIGURE]
    if bad:
        raise ConfigError(f"unknown dataset(s) {bad}; valid: imdb, sst2")
    names = names if any(f in FIGURE_DATASET for f in figures) else []
    return sorted(set(names), key=names.index)
