"""Training and evaluating a language model: `unfoldformer lm train | evaluate | generate`.

A run folder holds
- `config.json` + `model.safetensors`: the model (`LanguageModel.save_pretrained`, tokenizer inside its config);
- `train.json`: the training settings (`LMTrainConfig`);
- `state.pt`: what `--resume` needs (model and optimizer state, step, sampler generator, metrics rows), one file;
- `metrics.csv`: step, lr, train_loss, val_loss, tokens_per_s, elapsed_s at every evaluation.
Every file is written atomically (`utils`), the state and the model at every evaluation, so a killed run resumes
from its last evaluation. The schedule is nanoGPT's: AdamW (β = 0.9, 0.99; weight decay on matrices only),
linear warm-up, cosine decay to `min_lr` at `iters` (`train.build.lr_factor`), gradient clipping at 1.
"""
from __future__ import annotations

import csv
import io
import math
import os
import time
from dataclasses import asdict, dataclass, fields
from pathlib import Path

import torch

from ..config import CAUSAL_KEYS, ModelConfig
from ..errors import ConfigError
from ..persist import save_model
from ..persist.manifest import run_folder_kind
from ..runs import check_at_least, check_output_apart, check_output_location, resolve_device
from ..threads import free_core_threads
from ..train.build import lr_factor
from ..train.distributed import DistInfo, distributed_run
from ..utils import atomic_write_bytes, atomic_write_text, write_json
from .data import batches, corpus_path, load_text, split, validation_windows
from .model import LanguageModel, LMConfig
from .tokenizer import CharTokenizer

__all__ = ["LMTrainConfig", "MODELS", "build_model", "evaluate_model", "load_run", "train"]

#: --model: the decoder kinds.
MODELS = ("certified", "certified-untied", "standard")
#: The files `lm train` writes into its run folder.
RUN_FILES = ("config.json", "model.safetensors", "README.md", "complete.json", "train.json", "state.pt", "metrics.csv")
METRIC_FIELDS = ("step", "lr", "train_loss", "val_loss", "tokens_per_s", "elapsed_s")


#: The peak learning rate of each model when `lr` is not given: the certified decoders train best at 3e-3 (free
#: keys and relative biases, 2,000 iterations, seed 0: untied 1.828, against 1.946 at 1e-3), the standard GPT at
#: nanoGPT's 1e-3 (1.795, and 1.792 at 3e-3); docs/results/lm.md.
DEFAULT_LR = {"certified": 3e-3, "certified-untied": 3e-3, "standard": 1e-3}


@dataclass
class LMTrainConfig:
    """The settings of one language-model run (defaults: nanoGPT's CPU configuration of its character model)."""

    data: str = "tinyshakespeare"
    model: str = "certified"
    layers: int = 4
    heads: int = 4
    width: int = 128
    context: int = 64
    batch: int = 12
    iters: int = 2000
    lr: float | None = None              # peak; None: DEFAULT_LR of the model (3e-3 certified, 1e-3 standard)
    min_lr: float | None = None          # the cosine's floor; None: lr / 10
    warmup: int = 100
    weight_decay: float = 0.1
    grad_clip: float = 1.0
    eval_interval: int = 250
    eval_windows: int | None = None      # validation windows per in-training evaluation (None: the whole split)
    seed: int = 0
    anchor_weight: float = 1.0           # certified only: λ, the attention term's weight against the anchor
    ffn_weight: float = 1.0              # certified only: γ, the FFN term's weight
    attention_norm: str = "none"         # certified only: none (λ) | length (λ/m_i)
    ffn_bound: str = "none"              # certified only: none | spectral (‖W1‖₂ ≤ 1: the energy bounded below)
    keys: str = "free"                   # certified only: free (per-head maps A_h, K_h) | tied (q = k = v, §3.11)
    relative_bias: int = 64              # certified only: learned pair biases b_h(i − j) for offsets < this (0: none)
    basis: str = "none"                  # certified only: none (contiguous heads) | learned (an orthogonal head basis)

    def check(self) -> LMTrainConfig:
        if self.model not in MODELS:
            raise ConfigError(f"--model must be one of {', '.join(MODELS)}, got {self.model!r}")
        for name in ("layers", "heads", "width", "context", "batch", "iters", "eval_interval"):
            check_at_least(f"--{name.replace('_', '-')}", getattr(self, name))
        check_at_least("--warmup", self.warmup, 0)
        check_at_least("--eval-windows", self.eval_windows, 1, optional=True)
        check_at_least("--seed", self.seed, 0)
        if self.width % self.heads:
            raise ConfigError(f"--width {self.width} must be a multiple of --heads {self.heads}")
        if self.lr is None:
            self.lr = DEFAULT_LR[self.model]
        if self.min_lr is None:
            self.min_lr = self.lr / 10
        for name in ("lr", "min_lr", "weight_decay", "grad_clip"):
            value = getattr(self, name)
            if not (isinstance(value, (int, float)) and math.isfinite(value) and value >= 0):
                raise ConfigError(f"--{name.replace('_', '-')} must be a finite number >= 0, got {value!r}")
        if self.ffn_bound not in ("none", "spectral"):
            raise ConfigError(f"--ffn-bound must be none or spectral, got {self.ffn_bound!r}")
        if self.keys not in CAUSAL_KEYS:
            raise ConfigError(f"--keys must be one of {', '.join(CAUSAL_KEYS)}, got {self.keys!r}")
        check_at_least("--relative-bias", self.relative_bias, 0)
        if self.basis not in ("learned", "none"):
            raise ConfigError(f"--basis must be learned or none, got {self.basis!r}")
        if self.attention_norm not in ("length", "none"):
            raise ConfigError(f"--attention-norm must be length or none, got {self.attention_norm!r}")
        if not (isinstance(self.anchor_weight, (int, float)) and math.isfinite(self.anchor_weight)
                and self.anchor_weight > 0):
            raise ConfigError(f"--anchor-weight must be a finite number > 0, got {self.anchor_weight!r}")
        if not (isinstance(self.ffn_weight, (int, float)) and math.isfinite(self.ffn_weight) and self.ffn_weight >= 0):
            raise ConfigError(f"--ffn-weight must be a finite number >= 0, got {self.ffn_weight!r}")
        if not self.lr > 0 or self.min_lr > self.lr:
            raise ConfigError(f"--lr must be > 0 and --min-lr at most --lr, got {self.lr}, {self.min_lr}")
        return self

    @classmethod
    def from_dict(cls, data: dict) -> LMTrainConfig:
        unknown = set(data) - {f.name for f in fields(cls)}
        if unknown:
            raise ConfigError(f"unknown training setting(s): {', '.join(sorted(unknown))}")
        # settings saved before a field existed keep the meaning they had (no biases, a learned basis)
        return cls(**({"relative_bias": 0, "basis": "learned"} | data)).check()


def decoder_config(cfg: LMTrainConfig) -> ModelConfig:
    """The decoder's ModelConfig: the causal certified layer (tied or untied) or the standard GPT, MLP width 4d."""
    shape = dict(d_model=cfg.width, n_heads=cfg.heads, depth=cfg.layers, ffn_hidden=4 * cfg.width)
    if cfg.model == "standard":
        return ModelConfig.preset("standard", dropout=0.0, **shape)
    free = dict(metric="free", keys="free") if cfg.keys == "free" else {}
    if cfg.basis == "none":
        free["learn_basis"] = False
    return ModelConfig.preset("certified-causal", tied=cfg.model == "certified", anchor_weight=cfg.anchor_weight,
                              ffn_weight=cfg.ffn_weight, attention_norm=cfg.attention_norm, ffn_bound=cfg.ffn_bound,
                              relative_bias=cfg.relative_bias, **free, **shape)


def build_model(cfg: LMTrainConfig, tokenizer: CharTokenizer) -> LanguageModel:
    lm = LMConfig(tokenizer.vocab_size, cfg.context, decoder_config(cfg).to_dict(), tokenizer.to_dict())
    return LanguageModel(lm)


def _optimizer(model: LanguageModel, cfg: LMTrainConfig) -> torch.optim.Optimizer:
    decay = [p for p in model.parameters() if p.dim() >= 2]
    rest = [p for p in model.parameters() if p.dim() < 2]
    return torch.optim.AdamW([{"params": decay, "weight_decay": cfg.weight_decay},
                              {"params": rest, "weight_decay": 0.0}], lr=cfg.lr, betas=(0.9, 0.99))


@torch.no_grad()
def evaluate_model(model: LanguageModel, val: torch.Tensor, *, windows: int | None = None, batch: int = 64,
                   energies: bool = False, device: str = "cpu") -> dict:
    """Mean validation cross-entropy over consecutive windows of the split (the first `windows`; None: all), and
    with `energies` (certified) the share of real tokens whose conditional energy no layer raised."""
    model.eval()
    x, y = validation_windows(val, model.config.context)
    if windows is not None:
        x, y = x[:windows], y[:windows]
    total, count, lowered, tokens = 0.0, 0, 0, 0
    for s in range(0, len(x), batch):
        xb, yb = x[s: s + batch].to(device), y[s: s + batch].to(device)
        if energies:
            out = model.hidden(xb, return_energies=True)
            logits = model._logits(out.hidden)
            every = out.token_lowered().all(1)                       # (b, n)
            lowered, tokens = lowered + int(every.sum()), tokens + every.numel()
        else:
            logits, _ = model(xb)
        total += float(torch.nn.functional.cross_entropy(logits.flatten(0, 1).float(), yb.flatten(),
                                                         reduction="sum"))
        count += yb.numel()
    result = {"val_loss": total / max(count, 1), "val_tokens": count}
    if energies:
        result["token_descent_share"] = lowered / max(tokens, 1)
    return result


def _csv(rows: list[dict]) -> str:
    out = io.StringIO()
    writer = csv.DictWriter(out, fieldnames=METRIC_FIELDS)
    writer.writeheader()
    writer.writerows(rows)
    return out.getvalue()


def _save(folder: Path, model: LanguageModel, optimizer, step: int, generator: torch.Generator, rows: list[dict],
          elapsed: float) -> None:
    buf = io.BytesIO()
    torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict(), "step": step,
                "generator": generator.get_state(), "rows": rows, "elapsed": elapsed}, buf)
    atomic_write_bytes(folder / "state.pt", buf.getvalue())
    save_model(model, folder)                     # into its own run folder: not save_pretrained, which refuses runs
    atomic_write_text(folder / "metrics.csv", _csv(rows))


def load_run(folder: str | Path, device: str = "cpu") -> tuple[LanguageModel, CharTokenizer, LMTrainConfig]:
    """The trained model of a run folder (checked), its tokenizer and its training settings."""
    folder = Path(folder)
    if not (folder / "train.json").is_file():
        raise ConfigError(f"{folder}: not a language-model run folder (no train.json)")
    import json
    try:
        cfg = LMTrainConfig.from_dict(json.loads((folder / "train.json").read_text()))
    except ValueError as exc:
        raise ConfigError(f"{folder / 'train.json'}: not readable ({exc})") from None
    model = LanguageModel.from_pretrained(folder, map_location=device)
    return model, CharTokenizer.from_dict(model.config.tokenizer), cfg


def train(cfg: LMTrainConfig, out: str | Path, *, resume: bool = False, device: str = "auto",
          progress: bool = True) -> dict:
    """Train (or resume) a run in `out`; returns the final metrics row (with the final whole-split val_loss).

    Under torchrun (WORLD_SIZE > 1, DDP like `unfoldformer train`): every rank draws the same global batch of
    `batch` windows and trains on its rows (every world-th), the gradients averaged; the logged train loss is the
    mean over ranks, the global batch's; rank 0 evaluates and writes every file (the other ranks return {}).

    Refused before any work: `out` holding another command's run, or a file the run writes (`RUN_FILES`) that is
    the `--data` file (`check_output_apart`: `OutputError`); `batch` not a multiple of the processes."""
    out = check_output_location("--out", out)
    device = resolve_device(device)
    if resume:
        if not (out / "state.pt").is_file():
            raise ConfigError(f"--resume: {out} holds no state.pt to resume from")
        _, _, cfg = load_run(out)
    elif (out / "train.json").exists():
        raise ConfigError(f"{out} already holds a run; pass --resume to continue it or choose another --out")
    elif (kind := run_folder_kind(out)) is not None:
        raise ConfigError(f"--out {out}: is {kind}, not a language-model run; its files would be "
                          "overwritten: choose another --out")
    cfg.check()
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if cfg.batch % world:
        raise ConfigError(f"--batch {cfg.batch} must be a multiple of the {world} processes (torchrun)")
    check_output_apart("--out", [out / name for name in RUN_FILES], {"--data file": corpus_path(cfg.data)[0]})
    # every rank has checked the folder before the group forms, so before rank 0 writes into it
    with distributed_run(device) as info:
        return _train(cfg, out, resume, info, progress)


def _train(cfg: LMTrainConfig, out: Path, resume: bool, info: DistInfo, progress: bool) -> dict:
    device, rank, world = info.device, info.rank, info.world
    text = load_text(cfg.data)
    tokenizer = CharTokenizer.from_text(text)
    ids = torch.tensor(tokenizer.encode(text), dtype=torch.long)
    train_ids, val_ids = split(ids, cfg.context)
    torch.manual_seed(cfg.seed)
    model = build_model(cfg, tokenizer).to(device)
    optimizer = _optimizer(model, cfg)
    generator = torch.Generator().manual_seed(cfg.seed)
    step, rows, elapsed = 0, [], 0.0
    if resume:
        state = torch.load(out / "state.pt", map_location=device, weights_only=True)
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        generator.set_state(state["generator"])
        step, rows, elapsed = state["step"], state["rows"], state["elapsed"]
    elif info.main:
        out.mkdir(parents=True, exist_ok=True)
        write_json(out / "train.json", asdict(cfg))
    forward = model
    if world > 1:
        import torch.distributed as dist
        from torch.nn.parallel import DistributedDataParallel
        forward = DistributedDataParallel(model, device_ids=[device.index] if device.type == "cuda" else None)
    from tqdm import tqdm
    bar = tqdm(total=cfg.iters, initial=step, disable=not (progress and info.main), mininterval=1.0,
               desc=f"lm {cfg.model}")
    loss_sum, loss_count, tokens, clock = 0.0, 0, 0, time.perf_counter()
    while step < cfg.iters:
        model.train()
        lr = cfg.lr * lr_factor(step, cfg.warmup, cfg.iters, cfg.min_lr / cfg.lr)
        for group in optimizer.param_groups:
            group["lr"] = lr
        x, y = batches(train_ids, cfg.context, cfg.batch, generator)           # (batch, context): every rank's
        with free_core_threads():                      # the whole step at the free cores' thread count (threads.py)
            _, loss = forward(x[rank::world].to(device), y[rank::world].to(device))   # this rank's rows
            if not torch.isfinite(loss):
                raise ConfigError(f"the training loss is not finite at step {step + 1} ({float(loss)}); lower --lr")
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.grad_clip)
            optimizer.step()
        step += 1
        reported = loss.detach()
        if world > 1:                                  # equal shares: the mean of the ranks' means, the batch's
            dist.all_reduce(reported)
            reported = reported / world
        loss_sum, loss_count, tokens = loss_sum + reported.item(), loss_count + 1, tokens + x.numel()
        bar.update()
        bar.set_postfix(loss=f"{loss_sum / loss_count:.4f}", refresh=False)
        if not (step % cfg.eval_interval == 0 or step == cfg.iters):
            continue
        if info.main:
            now = time.perf_counter()
            elapsed += now - clock
            val = evaluate_model(model, val_ids, windows=cfg.eval_windows, device=device)
            rows.append({"step": step, "lr": lr, "train_loss": loss_sum / loss_count, "val_loss": val["val_loss"],
                         "tokens_per_s": tokens / max(now - clock, 1e-9), "elapsed_s": elapsed})
            _save(out, model, optimizer, step, generator, rows, elapsed)
            bar.write(f"step {step}: train loss {rows[-1]['train_loss']:.4f}, val loss {val['val_loss']:.4f}")
        loss_sum, loss_count, tokens, clock = 0.0, 0, 0, time.perf_counter()
    bar.close()
    return rows[-1] if rows and info.main else {}
