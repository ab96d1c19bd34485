"""`distill(cfg, resume=False)`: train a `DistilledEncoder` on the teacher's last-layer token states.

The teacher's states are recomputed for each batch (no cache; docs/guides/pretrained.md gives the
measurement behind that choice). Run folder `cfg.out`:
- `config.json` (the `DistillConfig`), `corpus.npz` + `corpus.json` (the windows, built once, reused);
- `checkpoint.pt`: the full training state (student, optimiser, sampler position, step, metric rows, run
  id), written atomically every `checkpoint_every` steps with per-tensor sha256 (`save_train_state`);
- `metrics.csv`: one row per `log_every` steps (loss, its two terms, lr, gradient norm, speed) and the
  held-out measures every `eval_every` steps, rewritten whole at each checkpoint;
- at the end `model/` (`save_pretrained`: weights, config.json, model card) and `summary.json`.

Resuming (`resume=True`) reloads `checkpoint.pt` and continues: batch order is a pure function of
(seed, epoch), the student has no dropout and the teacher runs in eval mode, so a run killed at any point
(SIGKILL included) and resumed ends with the same weights, bit for bit on one CPU, as a run never stopped.
DDP under torchrun: each rank reads every world-th window of a global batch (`data.batching.shard`);
rank 0 writes every file.
"""
from __future__ import annotations

import csv
import io
import json
import sys
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from ..config import ModelConfig
from ..data.batching import BucketBatchSampler, shard
from ..data.datasets import dataset_files
from ..errors import ConfigError, OutputError
from ..persist import save_model
from ..runs import folder_lock, new_run_id
from ..threads import free_core_threads
from ..train.build import lr_factor
from ..train.checkpoint import load_train_state, save_train_state
from ..train.distributed import DistInfo, distributed_run
from ..utils import atomic_write_text, environment, write_json
from .config import DistillConfig
from .corpus import Corpus, build_corpus, corpus_texts
from .student import DistilledEncoder
from .teacher import Teacher, mean_pool

__all__ = ["METRIC_FIELDS", "build_student", "distill", "distill_loss", "held_out_measures"]

METRIC_FIELDS = ("step", "epoch", "loss", "token_loss", "sentence_loss", "lr", "grad_norm", "sequences_per_s",
                 "elapsed_s", "val_token_cosine", "val_sentence_cosine", "val_token_rel_mse")


def build_student(cfg: DistillConfig, teacher: Teacher) -> DistilledEncoder:
    """The student of `cfg`: the teacher's width, and its depth / heads / FFN width unless set."""
    # position_prior=0: the students distilled (and their checkpoints, which resume) before the preset took a
    # position prior have none; MiniLM's own positions reach the student through its input
    model_cfg = ModelConfig.preset(cfg.student, d_model=teacher.dim, n_heads=cfg.n_heads or teacher.n_heads,
                                   ffn_hidden=cfg.ffn_hidden or teacher.ffn_hidden, depth=cfg.depth or teacher.depth,
                                   tied=cfg.tied, rho=cfg.rho, position_prior=0)
    return DistilledEncoder(model_cfg, teacher=cfg.teacher, readout=cfg.readout,
                            trainable_embeddings=cfg.trainable_embeddings, max_length=cfg.max_length)


def distill_loss(pred: torch.Tensor, target: torch.Tensor, padding_mask: torch.Tensor, kind: str,
                 sentence_weight: float) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(total, token term, sentence term) for states (B, n, d) and padding_mask (B, n) (config module doc)."""
    real = ~padding_mask                                                           # (B, n)
    if kind == "mse":
        token = (pred - target)[real].pow(2).mean()
    else:
        token = (1 - F.cosine_similarity(pred[real], target[real], dim=-1)).mean()
    sentence = (1 - F.cosine_similarity(mean_pool(pred, padding_mask), mean_pool(target, padding_mask),
                                        dim=-1)).mean()
    return token + sentence_weight * sentence, token, sentence


@torch.no_grad()
def held_out_measures(student: DistilledEncoder, teacher: Teacher, corpus: Corpus, rows, device,
                      batch_size: int = 64) -> dict:
    """Means over held-out windows: token cosine, sentence cosine, relative squared error ‖p − t‖² / ‖t‖²."""
    was_training = student.training
    student.eval()
    tok, sen, rel, n_tok = 0.0, 0.0, 0.0, 0
    rows = list(rows)
    for start in range(0, len(rows), batch_size):
        ids, mask = corpus.batch(rows[start:start + batch_size], teacher.word_pieces)
        ids, mask = ids.to(device), mask.to(device)
        target, pred = teacher.states(ids, mask), student(ids, mask)               # (B, n, d)
        real = ~mask
        tok += F.cosine_similarity(pred[real], target[real], dim=-1).sum().item()
        rel += ((pred - target)[real].pow(2).sum(-1) / target[real].pow(2).sum(-1)).sum().item()
        n_tok += int(real.sum())
        sen += F.cosine_similarity(mean_pool(pred, mask), mean_pool(target, mask), dim=-1).sum().item()
    student.train(was_training)
    n = max(len(rows), 1)
    return {"val_token_cosine": tok / max(n_tok, 1), "val_sentence_cosine": sen / n,
            "val_token_rel_mse": rel / max(n_tok, 1)}


def _corpus(cfg: DistillConfig, teacher: Teacher, out: Path, dist: DistInfo) -> Corpus:
    """The run's windows: read from `corpus.npz` when it was built for these settings, else built (rank 0)."""
    files = {name: dataset_files(name, cfg.data_dir) for name in cfg.sources}
    key = {"sources": list(cfg.sources), "max_length": cfg.max_length, "seed": cfg.seed, "files": files}
    info_path, data_path = out / "corpus.json", out / "corpus.npz"
    if dist.main and not (info_path.is_file() and data_path.is_file()
                          and json.loads(info_path.read_text()).get("key") == key):
        _log(f"building the corpus ({', '.join(cfg.sources)}; one-off, reused on resume)")
        corpus = build_corpus(corpus_texts(cfg.sources, cfg.data_dir), teacher.word_pieces, cfg.max_length,
                              cfg.seed)
        corpus.save(data_path)
        write_json(info_path, {"key": key, **corpus.info})
        _log(f"corpus: {corpus.info['windows']} windows from {corpus.info['texts']} texts")
    _barrier(dist)
    info = json.loads(info_path.read_text())
    return Corpus.load(data_path, info)


def _barrier(dist: DistInfo) -> None:
    if dist.world > 1:
        import torch.distributed as tdist
        tdist.barrier()


def _log(message: str) -> None:
    print(f"[distill] {message}", file=sys.stderr, flush=True)


def _optimizer(student: torch.nn.Module, cfg: DistillConfig) -> torch.optim.Optimizer:
    decay, plain = [], []
    for name, p in student.named_parameters():
        if p.requires_grad:
            (decay if p.ndim >= 2 and "parametrizations" not in name and "inputs." not in name else plain).append(p)
    return torch.optim.AdamW([{"params": decay, "weight_decay": cfg.weight_decay},
                              {"params": plain, "weight_decay": 0.0}], lr=cfg.lr)


def _write_metrics(path: Path, rows: list[dict]) -> None:
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, fieldnames=METRIC_FIELDS, extrasaction="ignore")
    writer.writeheader()
    writer.writerows(rows)
    atomic_write_text(path, buffer.getvalue())


def _start(cfg: DistillConfig, out: Path, resume: bool) -> dict | None:
    """The checkpoint to resume from (None: a fresh run); refuses a fresh run over an earlier one."""
    checkpoint = out / "checkpoint.pt"
    if not resume:
        if checkpoint.exists() or (out / "summary.json").exists():
            raise OutputError(f"{out} holds an earlier distillation; pass --resume to continue it or choose "
                              "another --out")
        return None
    if not checkpoint.exists():
        raise OutputError(f"{out}: no checkpoint.pt to resume from")
    state = load_train_state(checkpoint)
    changed = cfg.changed_from(state["config"])
    if changed:
        raise ConfigError(f"{checkpoint}: written with other settings ({', '.join(changed)}); resume with the "
                          "run's own settings (omit them to reuse its config.json)")
    return state


def distill(cfg: DistillConfig, resume: bool = False) -> dict:
    """Run (or resume) the distillation of `cfg`; returns the summary (module doc)."""
    with distributed_run(cfg.device) as dist:
        out = Path(cfg.out)
        if dist.main:
            with folder_lock(out, "distill"):
                return _Run(cfg, out, dist, _start(cfg, out, resume)).run()
        return _Run(cfg, out, dist, _start(cfg, out, resume)).run()


class _Run:
    def __init__(self, cfg: DistillConfig, out: Path, dist: DistInfo, state: dict | None):
        self.cfg, self.out, self.dist = cfg, out, dist
        self.teacher = Teacher(cfg.teacher, dist.device)
        if dist.main:
            write_json(out / "config.json", {"distill": cfg.to_dict(), "environment": environment()})
        corpus = _corpus(cfg, self.teacher, out, dist)
        n = min(len(corpus), cfg.limit or len(corpus))
        if n <= cfg.holdout + cfg.batch_size:
            raise ConfigError(f"limit={cfg.limit}: {n} windows leave fewer than batch_size={cfg.batch_size} for "
                              f"training beside holdout={cfg.holdout}")
        self.corpus, self.train_rows = corpus, np.arange(n - cfg.holdout)
        self.held_out = np.arange(n - cfg.holdout, n)
        torch.manual_seed(cfg.seed)
        self.student = build_student(cfg, self.teacher).to(dist.device).train()
        self.model = self.student
        if dist.world > 1:
            from torch.nn.parallel import DistributedDataParallel
            self.model = DistributedDataParallel(self.student)
        self.optimizer = _optimizer(self.student, cfg)
        self.sampler = BucketBatchSampler(corpus.lengths[self.train_rows], cfg.batch_size, cfg.seed,
                                          drop_smaller_than=dist.world)
        self.step, self.rows, self.run_id, self.elapsed = 0, [], new_run_id(), 0.0
        if state is not None:
            self.student.load_state_dict(state["model"])
            self.optimizer.load_state_dict(state["optimizer"])
            self.sampler.load_state_dict(state["sampler"])
            self.step, self.rows, self.run_id = state["step"], list(state["rows"]), state["run_id"]
            self.elapsed = state["elapsed_s"]
            _log(f"resumed at step {self.step} of {cfg.steps}")
        self.warmup = int(round(cfg.warmup * cfg.steps)) if cfg.warmup < 1 else int(cfg.warmup)

    def run(self) -> dict:
        cfg, started = self.cfg, time.time()
        self._started, self._base_elapsed, self._seen = started, self.elapsed, 0
        while self.step < cfg.steps:
            for batch in self.sampler:
                self._train_step(batch)
                if self.step >= cfg.steps:
                    break
            else:
                self.sampler.next_epoch()
        return self._finish()

    def _train_step(self, batch: list[int]) -> None:
        cfg = self.cfg
        lr = cfg.lr * lr_factor(self.step, self.warmup, cfg.steps, cfg.min_lr_ratio)
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        rows = self.train_rows[shard(batch, self.dist.rank, self.dist.world)]
        ids, mask = self.corpus.batch(rows, self.teacher.word_pieces)
        ids, mask = ids.to(self.dist.device), mask.to(self.dist.device)
        with free_core_threads():                      # the whole step at the free cores' thread count (threads.py)
            target = self.teacher.states(ids, mask)                               # (B, n, d)
            pred = self.model(ids, mask)                                          # (B, n, d)
            loss, token, sentence = distill_loss(pred, target, mask, cfg.loss, cfg.sentence_weight)
            if not torch.isfinite(loss):
                raise FloatingPointError(f"non-finite distillation loss at step {self.step}")
            self.optimizer.zero_grad(set_to_none=True)
            loss.backward()
            grad_norm = torch.nn.utils.clip_grad_norm_(self.student.parameters(), cfg.grad_clip)
            self.optimizer.step()
        self.step += 1
        self._seen += len(batch)
        if self.step % cfg.log_every == 0 or self.step == cfg.steps:
            self._log_row({"step": self.step, "epoch": self.sampler.epoch, "loss": loss.item(),
                           "token_loss": token.item(), "sentence_loss": sentence.item(), "lr": lr,
                           "grad_norm": float(grad_norm)})
        if self.step % cfg.eval_every == 0 or self.step == cfg.steps:
            measures = held_out_measures(self.student, self.teacher, self.corpus, self.held_out, self.dist.device)
            self.rows.append({"step": self.step, "epoch": self.sampler.epoch, **measures})
            if self.dist.main:
                _log(f"step {self.step}: held-out " + ", ".join(f"{k[4:]} {v:.4f}" for k, v in measures.items()))
        if self.step % cfg.checkpoint_every == 0 or self.step == cfg.steps:
            self._checkpoint()

    def _now(self) -> float:
        return self._base_elapsed + time.time() - self._started

    def _log_row(self, row: dict) -> None:
        elapsed = self._now()
        speed = self._seen / max(time.time() - self._started, 1e-9)
        self.rows.append({**row, "sequences_per_s": speed, "elapsed_s": elapsed})
        if self.dist.main:
            left = (self.cfg.steps - self.step) * self.cfg.batch_size / max(speed, 1e-9)
            _log(f"step {self.step}/{self.cfg.steps} ({100 * self.step / self.cfg.steps:.1f} %) loss "
                 f"{row['loss']:.4f} | {speed:.1f} windows/s | eta {left / 3600:.1f} h")

    def _checkpoint(self) -> None:
        if not self.dist.main:
            return
        save_train_state(self.out / "checkpoint.pt", {
            "config": self.cfg.to_dict(), "model": self.student.state_dict(),
            "optimizer": self.optimizer.state_dict(), "sampler": self.sampler.state_dict(), "step": self.step,
            "rows": self.rows, "run_id": self.run_id, "elapsed_s": self._now()})
        _write_metrics(self.out / "metrics.csv", self.rows)

    def _finish(self) -> dict:
        last = next((r for r in reversed(self.rows) if "val_token_cosine" in r), {})
        summary = {"run_id": self.run_id, "steps": self.step, "epochs": self.step * self.cfg.batch_size
                   / max(len(self.train_rows), 1), "windows": len(self.train_rows), "held_out": len(self.held_out),
                   "elapsed_s": self._now(), **{k: v for k, v in last.items() if k.startswith("val_")}}
        if self.dist.main:
            self.student.card = {"metrics": {k: round(v, 4) for k, v in summary.items() if k.startswith("val_")},
                                 "training": f"{self.step} steps of {self.cfg.batch_size} windows, loss "
                                             f"{self.cfg.loss} + {self.cfg.sentence_weight} x sentence cosine; "
                                             f"run {self.run_id}"}
            save_model(self.student, self.out / "model")        # inside its own run folder
            write_json(self.out / "summary.json", summary)
        return summary
