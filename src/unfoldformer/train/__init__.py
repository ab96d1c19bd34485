"""Training and evaluation of sentiment classifiers built on unfolded or standard Transformers.

- `TrainConfig` (`config`): nested dataclass (`model`, `data`, `optim`, `run`), loaded from JSON/YAML,
  with dotted overrides (`--model.depth 12`, `--optim.lr=3e-4`) and `validate()`, which fails
  with a clear `ConfigError` *before any training* (unknown kind, bad numbers, missing data).
- `build_classifier(cfg, embeddings)` (`build`): model kinds `certified-tied`, `certified-untied`,
  `paper`, `standard` behind the same embedding table, one linear map to d_model, masked
  mean pooling and a linear head (`SequenceClassifier`); also the optimiser and LR schedule.
- `train(cfg, resume=False)` (`loop`): AdamW, linear warm-up + cosine decay, length-bucketed batches,
  evaluation each epoch, metrics JSONL/CSV, best weights as safetensors; atomic, resumable
  checkpoints (`checkpoint`; bitwise-identical final weights on CPU); DDP under `torchrun`.
- `evaluate_checkpoint(path, ...)` (`evaluate`): accuracy and energy-curve statistics of saved weights.

Files written to `run.out_dir` (rank 0 only): `config.json` (resolved config), `checkpoint.pt`
(full training state), `best.safetensors` + `best.json`, `last.safetensors` + `last.json`,
`metrics.jsonl`, `metrics.csv`, `summary.json`. A frozen embedding table is not stored in the
weights; its sha256 is, and the table is rebuilt from `data.embeddings` and checked on load.

Energy statistics count a rise only beyond the model's round-off allowance tol·(1 + |E|)
(`model.descent_tolerance`: 1e-6 for float32 states), the tolerance the safeguard itself uses
(THEORY §3.5); `monotone_share_strict` reports the same share without any allowance.

Modules: `config` (configuration), `files` (atomic writes), `checkpoint` (states and weights),
`build` (model, data, optimiser), `evaluate` (evaluation, energy statistics), `loop` (training, DDP).
"""
from __future__ import annotations

from .build import build_classifier, load_embeddings_for, load_split, lr_factor, make_optimizer, subset_indices, warmup_steps
from .checkpoint import (CHECKPOINT_FORMAT, CHECKPOINT_VERSION, WEIGHTS_FORMAT, CheckpointError, load_train_state,
                         load_weights, model_state, restore_model_state, save_train_state, save_weights, table_sha256,
                         weights_sha256)
from .config import (EVAL_SPLITS, KINDS, RESUMABLE_CHANGES, SECTIONS, STANDARD_KEYS, ConfigError, DataSection,
                     ModelSection, OptimSection, RunSection, TrainConfig)
from .evaluate import eval_sums, evaluate_checkpoint, finalize_eval
from .files import atomic_write_bytes
from .loop import DistInfo, Trainer, environment, setup_distributed, train

__all__ = ["CHECKPOINT_FORMAT", "CHECKPOINT_VERSION", "CheckpointError", "ConfigError", "DataSection", "DistInfo",
           "EVAL_SPLITS", "KINDS", "ModelSection", "OptimSection", "RESUMABLE_CHANGES", "RunSection", "SECTIONS",
           "STANDARD_KEYS", "TrainConfig", "Trainer", "WEIGHTS_FORMAT", "atomic_write_bytes", "build_classifier",
           "environment", "eval_sums", "evaluate_checkpoint", "finalize_eval", "load_embeddings_for", "load_split",
           "load_train_state", "load_weights", "lr_factor", "make_optimizer", "model_state", "restore_model_state",
           "save_train_state", "save_weights", "setup_distributed", "subset_indices", "table_sha256", "train",
           "warmup_steps", "weights_sha256"]
