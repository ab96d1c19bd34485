"""Training and evaluation of sentiment classifiers built on unfolded or standard Transformers.

- `TrainConfig` (`config`): typed sections `model` (the encoder's `ModelConfig` plus `kind`),
  `data`, `optim`, `run`, loaded from JSON/YAML with dotted overrides (`--model.depth 12`) and
  `validate()`, which fails with a clear `ConfigError` *before any training*.
- `train(cfg, resume=False)` (`loop`): AdamW or plain SGD (mean or summed loss), linear warm-up +
  cosine decay, length-bucketed batches, evaluation each epoch, metrics JSONL/CSV, best weights as
  safetensors; atomic, resumable checkpoints (`checkpoint`; bitwise-identical final weights on
  CPU); DDP under `torchrun`.
- `evaluate_checkpoint(path, ...)` (`evaluate`): accuracy and energy-curve statistics of saved weights.
- `load_classifier(path)` (`checkpoint`): a trained classifier with its embeddings, for inference
  (`unfoldformer.load` wraps it in a `Predictor`).

Files written to `run.out_dir` (rank 0 only, under the folder's lock; each carries the run id):
`config.json` (resolved config, run id, data files read with size and sha256), `checkpoint.pt`
(full training state, with checksums), `best.safetensors` + `best.json`, `last.safetensors` +
`last.json` (with checksums), `metrics.jsonl`, `metrics.csv`, `summary.json`, and last, when the run
has finished, `complete.json` (every other file's size and sha256, `runs.write_manifest`; removed
when a run continues, checked on every load). A frozen embedding table is not stored in the
weights; its sha256 is, and the table is rebuilt from `data.embeddings` and checked on load.
"""
from __future__ import annotations

from ..recipe import KINDS, ConfigError, TrainConfig
from .checkpoint import CheckpointError, LoadedClassifier, load_classifier
from .evaluate import evaluate_checkpoint
from .loop import TrainingDivergedError, train

__all__ = ["CheckpointError", "ConfigError", "KINDS", "LoadedClassifier", "TrainConfig", "TrainingDivergedError",
           "evaluate_checkpoint", "load_classifier", "train"]
