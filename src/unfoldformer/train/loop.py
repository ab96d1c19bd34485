"""The training loop (`Trainer`, `train`) and its distributed (DDP under torchrun) set-up.

`train(cfg, resume=False)`: AdamW or plain SGD, linear warm-up + cosine decay, length-bucketed batches,
evaluation each epoch (or every `run.eval_every` steps), metrics JSONL/CSV, best weights as
safetensors; atomic, resumable checkpoints (bitwise-identical final weights on CPU); DDP under
`torchrun` (rank 0 writes all files).

Run folders: every setting (output folder writable, device present) is checked before the data
is read; the folder is locked for the life of the run (`runs.folder_lock`), so a second run into
it fails at once; every file of a run carries its run id, and a resume or an evaluation refuses
files of another run. A run that produces a non-finite loss or non-finite weights stops with
`TrainingDivergedError` (step, last finite loss, last checkpoint), whichever layer sees it first.
"""
from __future__ import annotations

import json
import math
import os
import sys
import time
from contextlib import contextmanager, nullcontext
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from ..contracts import NonFiniteResultError
from ..data import dataset_record, file_record
from ..data.batching import BucketBatchSampler, shard
from ..errors import UnfoldformerError
from ..persist.rebuild import load_init_weights, resolve_init
from ..recipe import ConfigError, TrainConfig
from ..runs import MANIFEST_NAME, claim_run_folder, folder_lock, new_run_id, verify_manifest, write_manifest
from ..threads import free_core_threads
from ..utils import atomic_write_text, environment, write_json
from .build import (
    _seed_all,
    build_classifier,
    load_embeddings_for,
    load_split,
    lr_factor,
    make_optimizer,
    run_inputs,
    warmup_steps,
    with_classes,
)
from .checkpoint import (
    CheckpointError,
    _check_same_config,
    _rng_state,
    _set_rng_state,
    load_train_state,
    model_state,
    restore_model_state,
    save_train_state,
    save_weights,
    saved_run_id,
    table_sha256,
    weights_sha256,
)
from .distributed import DistInfo, distributed_run, setup_distributed
from .evaluate import EvalSums, encoder_depth, evaluate, in_training_eval_batches
from .figures import FIGURES, plot_run
from .watch import MetricsLog, curve_statistics, grad_norm

__all__ = ["RUN_FILES", "DistInfo", "Trainer", "TrainingDivergedError", "setup_distributed", "train"]

#: The files a run writes into `run.out_dir`.
RUN_FILES = ("config.json", "checkpoint.pt", "best.safetensors", "best.json", "last.safetensors", "last.json",
             "metrics.jsonl", "metrics.csv", "summary.json", *FIGURES, MANIFEST_NAME)


class TrainingDivergedError(UnfoldformerError, FloatingPointError):
    """Training produced a non-finite loss or non-finite weights (the message names the step and the
    last checkpoint)."""


def _log(message: str) -> None:
    from tqdm import tqdm
    tqdm.write(message, file=sys.stderr)


class Trainer:
    """One training run (one process of it under DDP). Use `train()`."""

    def __init__(self, cfg: TrainConfig, dist_info: DistInfo, resume: bool = False):
        self._session_start = time.perf_counter()                # wall time includes data preparation
        self.cfg, self.dist, self.resume = cfg, dist_info, resume
        self.out = Path(cfg.run.out_dir)
        self.ckpt_path = self.out / "checkpoint.pt"
        self.run_id, self._last_loss, self._checkpointed = new_run_id(), None, None
        self._prepare()
        if resume and self.ckpt_path.exists():
            self._load()
        elif resume and self.dist.main:
            _log(f"no checkpoint in {self.out}: starting a new run")
        self.ddp = self.model
        if self.dist.world > 1:
            from torch.nn.parallel import DistributedDataParallel
            ids = [self.dist.device.index] if self.dist.device.type == "cuda" else None
            self.ddp = DistributedDataParallel(self.model, device_ids=ids)

    def _prepare(self) -> None:
        self.cfg, self.label_names = with_classes(self.cfg)       # model.n_classes from the data
        if self.cfg.model.final_norm is None:                     # the kind's default, saved explicitly
            self.cfg = self.cfg.replace(model__final_norm=self.cfg.model.resolved_final_norm())
        self.cfg = resolve_init(self.cfg)                         # model.init's architecture, saved explicitly
        cfg, d = self.cfg, self.cfg.data
        _seed_all(cfg.optim.seed)
        self.embeddings = load_embeddings_for(cfg)
        self.train_ds = load_split(cfg, self.embeddings, d.train_split, d.max_train_examples)
        self.eval_ds = load_split(cfg, self.embeddings, cfg.eval_split, d.max_eval_examples)
        self.train_lengths = self.train_ds.lengths(d.max_length)
        _seed_all(cfg.optim.seed)                                 # model init independent of data loading
        self.model = build_classifier(cfg, self.embeddings)
        if cfg.model.init is not None:                            # a resumed run then loads its own weights
            load_init_weights(self.model, cfg)
        self.model = self.model.to(self.dist.device)
        self.table_sha = table_sha256(self.model.embedding.weight)
        self.optimizer = make_optimizer(self.model, cfg)
        self.sampler = BucketBatchSampler(self.train_lengths, cfg.optim.batch_size, cfg.optim.seed,
                                          cfg.optim.chunk_batches, drop_smaller_than=self.dist.world)
        self.total_steps = cfg.optim.epochs * len(self.sampler)
        self.warm = warmup_steps(cfg, self.total_steps)
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(
            self.optimizer, lambda s: lr_factor(s, self.warm, self.total_steps, cfg.optim.min_lr_ratio))
        self.my_eval_batches = in_training_eval_batches(self.eval_ds, cfg)[self.dist.rank::self.dist.world]
        self.state: dict[str, Any] = {"step": 0, "loss_sum": 0.0, "loss_count": 0, "train_tokens": 0,
                                      "padded_tokens": 0, "train_time": 0.0, "wall_time": 0.0, "metrics": [],
                                      "best": None, "finished": False, "steps": [], "log_sum": 0.0,
                                      "log_count": 0, "warmup_steps": self.warm}

    # --- checkpoints
    def _load(self) -> None:
        st = load_train_state(self.ckpt_path)
        folder_run = saved_run_id(self.out)
        if st.get("run_id") and folder_run and st["run_id"] != folder_run:
            raise CheckpointError(f"{self.ckpt_path}: written by run {st['run_id']}, but {self.out / 'config.json'} "
                                  f"by run {folder_run}: the folder mixes two runs; resume refused")
        saved_epochs = int(st["config"]["optim"]["epochs"])
        extend = self.cfg.optim.epochs != saved_epochs
        if extend and self.cfg.optim.epochs < st["sampler"]["epoch"] + (st["sampler"]["batch_index"] > 0):
            raise ConfigError(f"{self.ckpt_path}: optim.epochs={self.cfg.optim.epochs}, but the run has already "
                              f"trained {st['sampler']['epoch']} epochs; a resumed run can only be extended")
        _check_same_config(st["config"], self.cfg, self.ckpt_path, allow={"optim.epochs"})
        if st["embedding_sha256"] != self.table_sha:
            raise CheckpointError(f"{self.ckpt_path}: the embedding table differs from the one of the checkpoint")
        restore_model_state(self.model, st["model"], self.cfg, str(self.ckpt_path))
        self.optimizer.load_state_dict(st["optimizer"])
        self.scheduler.load_state_dict(st["scheduler"])
        self.sampler.load_state_dict(st["sampler"])
        self.state = {"steps": [], "log_sum": 0.0, "log_count": 0, **st["progress"]}   # 0.1.0 states lack the log
        self.warm = self.state.setdefault("warmup_steps", warmup_steps(TrainConfig.from_dict(st["config"]),
                                                                       saved_epochs * len(self.sampler)))
        if extend:                       # the cosine decays to the new last step, from where the run stands
            self.state["finished"] = False
            for group, base in zip(self.optimizer.param_groups, self.scheduler.base_lrs):
                group["lr"] = base * lr_factor(self.scheduler.last_epoch, self.warm, self.total_steps,
                                               self.cfg.optim.min_lr_ratio)
            self.scheduler._last_lr = [g["lr"] for g in self.optimizer.param_groups]
        self.run_id = st.get("run_id") or self.run_id                # version 0.1.0 checkpoints had none
        self._checkpointed = self.state["step"]
        if not self.dist.main:                                    # rank 0 holds the global partial sums
            self.state.update(loss_sum=0.0, loss_count=0)
        _set_rng_state(st["rng"])
        if self.dist.main:
            _log(f"resumed {self.ckpt_path} at step {self.state['step']} "
                 f"(epoch {self.sampler.epoch + 1}, batch {self.sampler.batch_index})")

    def _reduce_partial_loss(self) -> None:
        """Make rank 0's (loss_sum, loss_count) global and zero the others' (so a checkpoint holds it all)."""
        if self.dist.world == 1:
            return
        import torch.distributed as dist
        acc = torch.tensor([self.state["loss_sum"], self.state["loss_count"]], dtype=torch.float64,
                           device=self.dist.device)
        dist.all_reduce(acc)
        keep = self.dist.main
        self.state.update(loss_sum=float(acc[0]) if keep else 0.0, loss_count=int(acc[1]) if keep else 0)

    def _checkpoint(self) -> None:
        self._reduce_partial_loss()
        self.state["wall_time"] = self._wall_base + time.perf_counter() - self._session_start
        if not self.dist.main:
            return
        save_train_state(self.ckpt_path, {
            "config": self.cfg.to_dict(), "run_id": self.run_id, "model": model_state(self.model, self.cfg),
            "embedding_sha256": self.table_sha,
            "optimizer": self.optimizer.state_dict(), "scheduler": self.scheduler.state_dict(),
            "sampler": self.sampler.state_dict(), "rng": _rng_state(), "progress": self.state})
        self._checkpointed = self.state["step"]

    # --- loop
    def run(self) -> dict:
        if self.state["finished"]:                             # done only when complete.json vouches for it all
            if self.dist.main and verify_manifest(self.out) is None:
                self.log = None
                self._final_files()                            # stopped while writing them: write them now
            return self._summary()
        self._wall_base = self.state["wall_time"]
        self.log = None
        if self.dist.main:
            (self.out / MANIFEST_NAME).unlink(missing_ok=True)     # the folder changes: no longer a finished run
            for stale in self.out.glob(".*.tmp"):                 # left by a process killed mid-write
                stale.unlink(missing_ok=True)
            self._write_config()
            self.log = MetricsLog(self.out, self.cfg.run.tensorboard, self.state["step"], _log)
            self.log.rewrite(self.state["steps"], self.state["metrics"])
        while self.sampler.epoch < self.cfg.optim.epochs:
            self._train_epoch()
            self.sampler.next_epoch()
            self._record()
            self._checkpoint()
        return self._finish()

    def _train_epoch(self) -> None:
        from tqdm import tqdm
        cfg = self.cfg
        bar = tqdm(total=len(self.sampler), initial=self.sampler.batch_index, mininterval=1.0,
                   desc=f"epoch {self.sampler.epoch + 1}/{cfg.optim.epochs}",
                   disable=not (self.dist.main and cfg.run.progress))
        for batch in self.sampler:
            self._step(batch)
            bar.update()                      # the mean since the last evaluation: the train_loss it logs
            bar.set_postfix(loss=f"{self.state['loss_sum'] / max(self.state['loss_count'], 1):.4f}", refresh=False)
            step = self.state["step"]
            if (isinstance(cfg.run.eval_every, int) and step % cfg.run.eval_every == 0
                    and self.sampler.batch_index < len(self.sampler)):
                self._record()
            if cfg.run.checkpoint_every and step % cfg.run.checkpoint_every == 0:
                self._checkpoint()
        bar.close()

    def _step(self, batch: list[int]) -> float:
        """One optimiser step on a global batch; this rank reads its shard. Returns the shard's mean loss."""
        d, cfg = self.dist, self.cfg
        part = shard(batch, d.rank, d.world)
        ids, mask, labels = self.train_ds.collate(part, cfg.data.max_length, self.embeddings.pad_id)
        ids, mask, labels = ids.to(d.device), mask.to(d.device), labels.to(d.device)
        start = time.perf_counter()
        log = (self.state["step"] + 1) % cfg.run.log_every == 0
        # the whole step (loss, backward, optimiser) at the free cores' thread count, not only the model's calls:
        # beside a busy process a parallel region at the full count stalls on the shared core (threads.py)
        with free_core_threads():
            with self._divergence_check():
                logits, _ = self.ddp(ids, mask)
            loss_sum = F.cross_entropy(logits.float(), labels, reduction="sum")
            # DDP averages gradients over ranks: scaling by world / global batch gives the global mean,
            # by world the global sum (`optim.loss_reduction`).
            loss = loss_sum * (d.world / len(batch) if cfg.optim.loss_reduction == "mean" else d.world)
            self.optimizer.zero_grad(set_to_none=True)
            loss.backward()
            if log:
                row = {"step": self.state["step"] + 1, "lr": self.scheduler.get_last_lr()[0],
                       "grad_norm": grad_norm(self.model.parameters()), **curve_statistics(self.model, ids, mask)}
            if cfg.optim.grad_clip is not None:
                torch.nn.utils.clip_grad_norm_([p for p in self.model.parameters() if p.requires_grad],
                                               cfg.optim.grad_clip)
            self.optimizer.step()
        self.scheduler.step()
        value = loss_sum.item()
        if not math.isfinite(value):
            raise self._diverged(f"the training loss is {value} (rank {d.rank})")
        bad = next((name for name, p in self.model.named_parameters() if not bool(torch.isfinite(p).all())), None)
        if bad is not None:                                      # the loss was finite, a parameter is not
            raise self._diverged(f"parameter {bad!r} is no longer finite after the optimiser step")
        self._last_loss = value / max(len(part), 1)
        self.state["train_time"] += time.perf_counter() - start
        lengths = self.train_lengths[batch]
        self.state.update(step=self.state["step"] + 1, loss_sum=self.state["loss_sum"] + value,
                          loss_count=self.state["loss_count"] + len(part), log_sum=self.state["log_sum"] + value,
                          log_count=self.state["log_count"] + len(part),
                          train_tokens=self.state["train_tokens"] + int(lengths.sum()),
                          padded_tokens=self.state["padded_tokens"] + int(lengths.max()) * len(batch))
        if log:
            self._log_step(row)
        return value / max(len(part), 1)

    def _log_step(self, row: dict) -> None:
        """One per-step row: mean loss since the last row, with the values measured at this step."""
        epoch = round(self.sampler.epoch + self.sampler.batch_index / len(self.sampler), 4)
        row = {"step": row["step"], "epoch": epoch, "loss": self.state["log_sum"] / max(self.state["log_count"], 1),
               **{k: v for k, v in row.items() if k != "step"}}
        self.state.update(log_sum=0.0, log_count=0)
        self.state["steps"].append(row)
        if self.log is not None:
            self.log.add(row, "step")

    # --- divergence
    @contextmanager
    def _divergence_check(self, step: int | None = None):
        """Report a forward that fails on a value check (the layers' state checks see a non-finite state
        first) as a divergence once the optimiser has changed the weights: the inputs are rows of a
        finite table, so a non-finite state comes from the weights. Before the first step, or for
        other errors, the error passes unchanged."""
        try:
            yield
        except (ValueError, NonFiniteResultError) as exc:           # a failed forward or a NaN evaluation
            finite = all(bool(torch.isfinite(p).all()) for p in self.model.parameters())
            if finite and self.state["step"] == 0:
                raise
            weights = "the weights are finite but too large" if finite else "the weights are no longer finite"
            raise self._diverged(f"{weights} (the forward pass failed: {exc})", step) from None

    def _diverged(self, what: str, step: int | None = None) -> TrainingDivergedError:
        """The error of a run that diverged at `step` (default: the step being taken)."""
        step, lr = self.state["step"] + 1 if step is None else step, self.cfg.optim.lr
        last = "none yet" if self._last_loss is None else f"{self._last_loss:.4g}"
        saved = (f"the last checkpoint is {self.ckpt_path} (step {self._checkpointed})"
                 if self._checkpointed is not None else "no checkpoint was written yet")
        clip = self.cfg.optim.grad_clip
        advice = (f"lower optim.lr (now {lr:g}) or set optim.grad_clip" if clip is None else
                  f"lower optim.lr (now {lr:g}) or optim.grad_clip (now {clip:g})")
        return TrainingDivergedError(f"training diverged at step {step}: {what}; last finite training loss "
                                     f"{last}; {saved}; {advice}")

    # --- evaluation and records
    def _record(self) -> None:
        import torch.distributed as dist
        d, st = self.dist, self.state
        with self._divergence_check(step=st["step"]):          # evaluating the weights of this step
            sums = evaluate(self.model, self.eval_ds, self.my_eval_batches, self.cfg.data.max_length,
                            self.embeddings.pad_id, d.device, energies=False,
                            progress=d.main and self.cfg.run.progress)
        acc = torch.tensor([st["loss_sum"], st["loss_count"]], dtype=torch.float64)
        if d.world > 1:                                           # one all_reduce for the eval sums and the loss
            both = torch.cat([sums.to_tensor(encoder_depth(self.model)), acc]).to(d.device)
            dist.all_reduce(both)
            sums, acc = EvalSums.from_tensor(both[:-2].cpu()), both[-2:].cpu()
        res = sums.result()
        epoch = round(self.sampler.epoch + self.sampler.batch_index / len(self.sampler), 4)
        rec = {"run_id": self.run_id, "step": st["step"], "epoch": epoch,
               "train_loss": float(acc[0]) / max(float(acc[1]), 1), "eval_loss": res["loss"],
               "eval_accuracy": res["accuracy"], "eval_n": res["n"], "lr": self.scheduler.get_last_lr()[0],
               "train_tokens": st["train_tokens"], "train_time_s": st["train_time"],
               "tokens_per_s": st["train_tokens"] / max(st["train_time"], 1e-9)}
        if res["energy"] is not None:
            rec["energy_monotone_share"] = res["energy"]["monotone_share"]
            rec["layer_descent_share"] = res["energy"]["layer_descent_share"]
        st.update(loss_sum=0.0, loss_count=0)
        st["metrics"].append(rec)
        improved = st["best"] is None or rec["eval_accuracy"] > st["best"]["eval_accuracy"]
        if improved:
            st["best"] = {k: rec[k] for k in ("step", "epoch", "eval_accuracy", "eval_loss")}
        if d.main:
            if improved:
                save_weights(self.out / "best.safetensors", self.model, self.cfg,
                             {"run_id": self.run_id, "metrics": rec, "label_names": list(self.label_names)},
                             self.table_sha)
            self._write_metrics()
            self.log.add(rec, "eval")
            _log(f"step {rec['step']} epoch {rec['epoch']:.2f}: train loss {rec['train_loss']:.4f}, "
                 f"{self.cfg.eval_split} acc {rec['eval_accuracy']:.4f} (loss {rec['eval_loss']:.4f}), "
                 f"{rec['tokens_per_s']:.0f} tok/s")

    def _write_metrics(self) -> None:
        rows = self.state["metrics"]
        atomic_write_text(self.out / "metrics.jsonl", "".join(json.dumps(r) + "\n" for r in rows))

    def data_files(self) -> list[dict]:
        """Provenance: path, size and sha256 of the data file and of the embedding files read."""
        d = self.cfg.data
        data = ([file_record(f) for f in (d.train_file, d.eval_file) if f is not None] if d.dataset == "files"
                else [dataset_record(d.dataset, d.data_dir)])
        return data + [file_record(f) for f in self.embeddings.describe()["files"]]

    def _write_config(self) -> None:
        extra = {"run_id": self.run_id, "data_files": self.data_files(), "label_names": list(self.label_names),
                 "model": self.cfg.model_config().to_dict(),
                 "parameters": sum(p.numel() for p in self.model.parameters() if p.requires_grad),
                 "embeddings": self.embeddings.describe(), "train_examples": len(self.train_ds),
                 "eval_examples": len(self.eval_ds), "eval_split": self.cfg.eval_split,
                 "steps_per_epoch": len(self.sampler), "total_steps": self.total_steps,
                 "world_size": self.dist.world, "threads": torch.get_num_threads(), **environment()}
        self.cfg.save(self.out / "config.json", extra)

    def _finish(self) -> dict:
        import torch.distributed as dist
        self.state["finished"] = True
        digest = weights_sha256(self.model, self.cfg)
        digests = [digest]
        if self.dist.world > 1:
            digests = [None] * self.dist.world
            dist.all_gather_object(digests, digest)
        self.state["rank_weights_sha256"] = digests
        self._checkpoint()
        if self.dist.main:
            self._final_files()
        return self._summary()

    def _final_files(self) -> None:
        """last.safetensors, summary.json, the figures, then complete.json (last: it pins every file)."""
        save_weights(self.out / "last.safetensors", self.model, self.cfg,
                     {"run_id": self.run_id, "metrics": self.state["metrics"][-1],
                      "label_names": list(self.label_names)}, self.table_sha)
        write_json(self.out / "summary.json", self._summary())
        if self.log is not None:
            self.log.close()
        if self.cfg.run.plots:
            plot_run(self.out)
        write_manifest(self.out, "train", self.run_id, self.cfg.to_dict())   # last: pins every file

    def _summary(self) -> dict:
        st = self.state
        return {"run_id": self.run_id, "kind": self.cfg.model.kind, "dataset": self.cfg.data.dataset,
                "data_files": self.data_files(), "steps": st["step"],
                "best": st["best"], "final": st["metrics"][-1] if st["metrics"] else None,
                "train_tokens": st["train_tokens"], "padded_tokens": st["padded_tokens"],
                "train_time_s": st["train_time"], "tokens_per_s": st["train_tokens"] / max(st["train_time"], 1e-9),
                "wall_time_s": st["wall_time"], "world_size": self.dist.world,
                "rank_weights_sha256": st.get("rank_weights_sha256"),
                "ranks_identical": len(set(st.get("rank_weights_sha256") or [None])) == 1,
                "out_dir": str(self.out)}


def train(cfg: TrainConfig, resume: bool = False, *, config_file: str | os.PathLike | None = None) -> dict:
    """Validate `cfg` (before anything else), lock the run folder, train, and return the run summary.

    The Python form of `unfoldformer train`. Under torchrun (WORLD_SIZE > 1) each process runs this; only
    rank 0 writes files and holds the lock.

    Args:
        cfg: a `TrainConfig` (`TrainConfig()` is the `certified` joint model on SST-2).
        resume: continue the run in `cfg.run.out_dir` from its last checkpoint (a new run if none).
        config_file: the file `cfg` was read from, if any: an input, like the data files, that
            `run.overwrite` never deletes (a refusal, before anything is deleted).

    Returns:
        The run summary (also `summary.json`): steps, the best and final evaluation, run id. The folder
        holds `best.safetensors`, `last.safetensors`, `checkpoint.pt`, `metrics.csv`, `config.json` and
        the manifest `complete.json`; `uf.load(cfg.run.out_dir)` opens it for prediction.

    Example:
        >>> from unfoldformer.train import TrainConfig, train
        >>> cfg = TrainConfig().replace(data__dataset="sst2", optim__epochs=1, run__out_dir="runs/sst2")
        >>> summary = train(cfg)                                   # doctest: +SKIP
        >>> best = summary.get("best")                              # doctest: +SKIP
    """
    cfg.validate(world_size=int(os.environ.get("WORLD_SIZE", "1")), check_output=True)
    main = int(os.environ.get("RANK", "0")) == 0
    with folder_lock(cfg.run.out_dir, "train") if main else nullcontext():
        if main:
            claim_run_folder(cfg.run.out_dir, RUN_FILES, resume=resume, overwrite=cfg.run.overwrite,
                             **run_inputs(cfg, config_file))
        with distributed_run(cfg.run.device) as info:
            torch.set_num_threads(cfg.run.threads or max(1, (os.cpu_count() or 1) // info.local_world))
            if cfg.run.deterministic:
                torch.use_deterministic_algorithms(True)
            return Trainer(cfg, info, resume).run()
