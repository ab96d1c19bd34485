"""Settings of the ρ study (`RhoStudySettings`): which ρ, which data, how many sentences, which models."""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

from ..contracts import check_path_given, check_seed
from ..data import EVAL_SPLITS
from ..errors import ConfigError
from ..rho import BUILT_IN, RHO_FAMILY, Rho, register_rho

__all__ = ["ARCHITECTURES", "MODES", "RhoStudySettings", "parse_list"]

#: The encoder every study model shares: the accuracy benchmark's certified model (full), a small one (quick).
ARCHITECTURES = {
    "full": {"d_model": 128, "n_heads": 4, "depth": 6, "ffn_hidden": 512},
    "quick": {"d_model": 64, "n_heads": 4, "depth": 6, "ffn_hidden": 256},
}
#: Defaults of the full and the quick study; explicit settings override them.
MODES = {
    # IMDB reviews are cut at 128 word pieces (the models were trained at 256): the 12-step dynamics with
    # float64 energies of every state cost O(n²) per sentence, and 128 keeps the full study within minutes
    "full": dict(datasets=("sst2", "imdb"), samples=128, max_lengths={"sst2": 64, "imdb": 128}),
    "quick": dict(datasets=("sst2",), samples=48, max_lengths={"sst2": 32, "imdb": 64}),
}
#: Quick mode trains its own tiny models (tied and untied) on this budget.
QUICK_TRAINING = dict(train_examples=1000, eval_examples=200, epochs=1, batch_size=32, lr=3e-3)
STEPS = 12                           # tied models are unrolled this many steps (diversity after 6 and 12)
DEFAULT_RHOS = ("exp", "log", "lp", "truncated", "linear")


def parse_list(spec: str | list | tuple, name: str) -> list[str]:
    """'a,b' or ['a', 'b'] -> ['a', 'b'] (no empties, no duplicates)."""
    items = spec.split(",") if isinstance(spec, str) else list(spec)
    out = [s.strip() if isinstance(s, str) else s for s in items if not (isinstance(s, str) and not s.strip())]
    if not out:
        raise ConfigError(f"--{name} is empty")
    return list(dict.fromkeys(out))


@dataclass
class RhoStudySettings:
    """Everything that shapes one study (saved in `results.json`). `rhos` may hold `Rho` objects
    (e.g. `custom_rho(fn, name="mine")`): they are registered under their names for the study."""

    rhos: list = field(default_factory=lambda: list(DEFAULT_RHOS))
    datasets: list[str] | None = None         # None: the mode's
    samples: int | None = None                # sentences per dataset (None: the mode's)
    quick: bool = False
    seed: int = 0
    data_dir: str | None = None
    results_dir: str | None = None            # accuracy-benchmark result files (trained models, accuracy)
    runs_dir: str | None = None               # where their run folders are, if not at the recorded run_dir
    threads: int = 1
    batch_size: int = 32
    out: str = "rho_study"

    def __post_init__(self) -> None:
        mode = MODES["quick" if self.quick else "full"]
        self.rhos = [self._rho_name(r) for r in parse_list(self.rhos, "rhos")]
        if "exp" not in self.rhos:
            raise ConfigError("--rhos must include exp: every comparison is against softmax attention")
        self.datasets = parse_list(list(mode["datasets"]) if self.datasets is None else self.datasets, "datasets")
        bad = [d for d in self.datasets if d not in EVAL_SPLITS]
        if bad:
            raise ConfigError(f"unknown dataset(s) {', '.join(bad)}; valid: {', '.join(EVAL_SPLITS)}")
        self.samples = mode["samples"] if self.samples is None else self.samples
        for name in ("samples", "threads", "batch_size"):
            if getattr(self, name) < 1:
                raise ConfigError(f"{name} must be >= 1, got {getattr(self, name)}")
        check_seed("seed", self.seed)
        for name in ("out", "data_dir", "results_dir", "runs_dir"):
            check_path_given(name, getattr(self, name))
        if self.samples < 4:
            raise ConfigError(f"samples must be >= 4 (bootstrap intervals need a few sentences), got {self.samples}")

    @staticmethod
    def _rho_name(rho) -> str:
        if isinstance(rho, Rho):
            if rho.name in BUILT_IN:
                raise ConfigError(f"a custom rho needs a name other than the built-in {rho.name!r}")
            try:
                return register_rho(rho)
            except ValueError as exc:
                raise ConfigError(str(exc)) from None
        if rho not in RHO_FAMILY:
            raise ConfigError(f"unknown rho {rho!r}; valid: {', '.join(RHO_FAMILY)} (or a Rho from custom_rho)")
        return rho

    @property
    def mode(self) -> str:
        return "quick" if self.quick else "full"

    @property
    def architecture(self) -> dict:
        return dict(ARCHITECTURES[self.mode])

    def max_length(self, dataset: str) -> int:
        return MODES[self.mode]["max_lengths"][dataset]

    def to_dict(self) -> dict:
        return {**dataclasses.asdict(self), "mode": self.mode, "architecture": self.architecture,
                "max_lengths": {d: self.max_length(d) for d in self.datasets}, "steps": STEPS,
                "quick_training": QUICK_TRAINING if self.quick else None}
