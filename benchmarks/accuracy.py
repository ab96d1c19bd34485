"""Accuracy benchmark: certified (tied / untied), paper, standard Transformers and the peers on SST-2 and IMDB.

One (dataset, model, seed) cell per invocation, or every cell with `--all`::

    python benchmarks/accuracy.py --dataset sst2 --model certified-tied --seed 0
    python benchmarks/accuracy.py --dataset sst2 --model standard --max-train-examples 2000 --epochs 1
    python benchmarks/accuracy.py --all --seeds 0 1 2
    python benchmarks/accuracy.py --dataset sst2 --model certified-tied --rho log

`--rho` (default exp) sets the attention penalty ρ of the certified models (THEORY §4); every other
setting stays that of the exp rows. A ρ ≠ exp cell is named `<dataset>-<model>-rho_<ρ>-seed<k>.json`, so
it never replaces an exp result, and with `--all` the models default to the two certified ones.

The setting (identical for all models): width 128, depth 6, 4 heads, FFN width 512 (the
paper model's symmetric F1 FFN is d x d and has no hidden width, nor has CRATE's ISTA step; the
Energy Transformer's depth is its number of steps T and its FFN width its Hopfield width); the frozen MiniLM 384-d
word-piece table with one trainable linear map 384 -> 128; masked mean pooling, a linear head;
AdamW (lr 1e-3, weight decay 0.01 on matrices), 10 % linear warm-up then cosine decay, batch 32,
gradient clipping 1.0; the same token budget: SST-2 3 epochs at max length 64 (evaluated on dev),
IMDB 2 epochs at max length 256 (evaluated on test at 256 and at full length).

Reported accuracy is that of the *final* weights (no model selection on the evaluation split). Every
model is trained with the backtracking safeguard off (a run-time option of the forward), so
`accuracy` is the trained function: the final weights evaluated with the safeguard **off**.
Switching the safeguard on (whole-layer descent by construction, THEORY §3.5) changes the function,
so it is recorded separately: `accuracy_safeguard` is the same weights with the safeguard **on**
(`safeguard=True`, at most 8 halvings per layer step; for every unfolded model; `safeguard_preset`
records the in-training setting). The energy statistics (curve-monotone share, layer-descent share,
share of backtracked layer steps, mean curve) are recorded for both: `energy` (off) and
`energy_safeguard` (on); the standard Transformer has neither. The peers (THEORY §8) have no
safeguard; their own descent quantities are recorded in `peer_energy` (on the `energy` subset, at
the training length): for the Energy Transformer the share of samples whose energy never rises over
its T steps at its step size α, and the share of rising steps; for CRATE the share of layers whose
attention step lowers its coding rate R^c, the share of samples where every layer does, and the
mean sparsity of the ISTA codes per layer. IMDB adds
`accuracy_full_length[_safeguard]` and `energy_full_length[_safeguard]`. `eval_pass_time_s` times
each evaluation pass (`plain`: no energies, safeguard off = ordinary inference) and
`safeguard_slowdown` = safeguard-on pass / plain pass on the same examples. The in-training
evaluation (`best_accuracy`, `in_training_accuracy`, and the choice of `best.safetensors`) runs
without the safeguard (`in_training_eval_safeguard`; result files written before version 0.2.0 ran
it with the certified presets' safeguard on); it is kept for reference and checked against the
matching pass (`in_training_check`).

IMDB's test split has 25,000 reviews (mean 295 tokens, some over 2,500), and on 2 cores the
safeguard and full-length passes over all of it would take hours per model. So (`DATASETS[...]
["subsets"]`, fixed seed-0 random subsets, recorded in `eval_subsets` and `eval_examples_per_pass`):
`accuracy` (plain, at 256) is on all 25,000; the per-epoch evaluation during training and every
energy / safeguard pass (`accuracy_energy_subset`, `accuracy_safeguard`, `energy*`) on 1,000;
`accuracy_full_length` on 5,000. SST-2 dev (872) is always evaluated whole.

A full-budget cell writes `benchmarks/results/<dataset>-<model>-seed<k>.json`; a reduced one
(`--max-train-examples`, `--epochs` or `--max-eval-examples`) writes `...-seed<k>-reduced.json`, so
it never replaces a full result. Each JSON records exactly what was run (config, example counts,
steps, tokens), accuracy, wall time, training tokens/s and machine information.
Training runs live in `--work-dir` (default: the unfoldformer cache); `--resume` continues one.
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

import torch

from unfoldformer.config import PEER_ATTENTIONS
from unfoldformer.data.batching import eval_batches
from unfoldformer.data.files import cache_dir
from unfoldformer.descent import descent_tolerance, lowered
from unfoldformer.names import KINDS_BEFORE_0_3
from unfoldformer.rho import RHO_FAMILY
from unfoldformer.train import KINDS, TrainConfig, evaluate_checkpoint, train
from unfoldformer.train.build import load_split
from unfoldformer.train.checkpoint import load_classifier
from unfoldformer.utils import atomic_write_bytes, environment

RESULTS = Path(__file__).resolve().parent / "results"
SHARED_DATA = Path(__file__).resolve().parent.parent.parent / "shared" / "data"   # the project's data folder
# eval subsets (fixed seed-0 random subsets of the eval split; None: all of it): `train_eval` for the
# per-epoch evaluation during training, `energy` for the energy / safeguard passes, `full_length` for
# the plain full-length accuracy. The main accuracy (plain pass at the training length) is always on all.
DATASETS = {
    "sst2": {"epochs": 3, "max_length": 64, "full_length_eval": False,
             "subsets": {"train_eval": None, "energy": None, "full_length": None}},
    "imdb": {"epochs": 2, "max_length": 256, "full_length_eval": True,
             "subsets": {"train_eval": 1000, "energy": 1000, "full_length": 5000}},
}
MODEL = {"d_model": 128, "depth": 6, "n_heads": 4, "ffn_hidden": 512}
OPTIM = {"lr": 1e-3, "weight_decay": 0.01, "warmup": 0.1, "batch_size": 32, "grad_clip": 1.0}


#: A cell is named by the model kinds of version 0.2.0, in which its results were first recorded (`certified-tied`
#: = today's `certified-alternating`, `certified-untied` = `certified-alternating-untied`, `certified-joint` =
#: `certified`, `certified-joint-untied` = `certified-untied`), so every result file keeps its name and meaning;
#: `model_section` builds the kind a label stands for. The tables print today's names (`make_table.NAMES`).
LABELS = tuple({new: old for old, new in KINDS_BEFORE_0_3.items()}.get(k, k) for k in KINDS)
RHO_MODELS = ("certified-tied", "certified-untied")   # the models that take a ρ other than exp (alternating)
PEERS = PEER_ATTENTIONS                                # the peer encoders' kinds (THEORY §8)
NO_FFN_WIDTH = ("paper", "crate")                      # models without a hidden FFN width


def model_section(kind: str, rho: str = "exp") -> dict:
    """The benchmark's `model` config section for `kind` (the paper's F1 FFN has no hidden width)
    with attention penalty `rho` (left to the preset, exp, unless another is named)."""
    sizes = {k: v for k, v in MODEL.items() if not (kind in NO_FFN_WIDTH and k == "ffn_hidden")}
    section = {"kind": KINDS_BEFORE_0_3.get(kind, kind), **sizes}
    return section if rho == "exp" else {**section, "rho": rho}


def cell_name(dataset: str, model: str, seed: int, rho: str = "exp", reduced: bool = False,
              variant: str | None = None) -> str:
    """Result and run-folder name of a cell; exp cells keep their original names; a `variant` (a
    named set of config changes, `--variant NAME --set KEY=VALUE ...`) adds `-v_<NAME>`."""
    return (f"{dataset}-{model}" + ("" if rho == "exp" else f"-rho_{rho}") + (f"-v_{variant}" if variant else "")
            + f"-seed{seed}" + ("-reduced" if reduced else ""))


def cell_config(dataset: str, model: str, seed: int, args: argparse.Namespace, out_dir: Path) -> TrainConfig:
    """The benchmark's TrainConfig for one cell (with the reduced-budget overrides, if any)."""
    setting = DATASETS[dataset]
    cfg = TrainConfig.from_dict({
        "model": model_section(model, args.rho),
        "data": {"dataset": dataset, "data_dir": args.data_dir, "max_length": setting["max_length"],
                 "embeddings": "minilm", "max_train_examples": args.max_train_examples,
                 "max_eval_examples": args.max_eval_examples},
        "optim": {**OPTIM, "epochs": args.epochs or setting["epochs"], "seed": seed},
        "run": {"out_dir": str(out_dir), "threads": args.threads, "progress": not args.no_progress,
                "checkpoint_every": 500, "eval_examples": setting["subsets"]["train_eval"]},
    })
    return cfg.with_overrides(setting_pairs(args.set)) if args.set else cfg


def setting_pairs(settings: list[str]) -> list[str]:
    """`KEY=VALUE` strings -> `--KEY VALUE` overrides of the TrainConfig (typed and checked there)."""
    pairs = []
    for item in settings:
        key, sep, value = item.partition("=")
        if not sep or "." not in key:
            raise SystemExit(f"--set {item!r}: use SECTION.KEY=VALUE, e.g. --set model.anchor_weight=0.3")
        pairs += [f"--{key}", value]
    return pairs


def is_reduced(args: argparse.Namespace) -> bool:
    return any(v is not None for v in (args.max_train_examples, args.epochs, args.max_eval_examples))


def git_commit() -> str | None:
    try:
        out = subprocess.run(["git", "rev-parse", "HEAD"], cwd=Path(__file__).parent, capture_output=True,
                             text=True, timeout=10)
        return out.stdout.strip() or None
    except OSError:
        return None


def run_cell(dataset: str, model: str, seed: int, args: argparse.Namespace) -> Path:
    """Train and evaluate one cell; returns the path of its result JSON."""
    reduced = is_reduced(args)
    name = cell_name(dataset, model, seed, args.rho, reduced, args.variant)
    work = Path(args.work_dir) / name
    cfg = cell_config(dataset, model, seed, args, work)
    if not args.resume and (work / "checkpoint.pt").exists():
        cfg.run.overwrite = True
    summary = train(cfg, resume=args.resume)
    preset = preset_safeguard(cfg)
    evals = evaluate_cell(work, dataset, cfg.data.max_eval_examples, preset)
    resolved = json.loads((work / "config.json").read_text())["resolved"]
    in_training = summary["final"]["eval_accuracy"]
    # the in-training evaluation ran in eval mode, i.e. with the preset's safeguard setting
    matching = evals.pop("matching_accuracy")
    check = None if matching is None else abs(matching - in_training) < 1e-12
    if check is False:
        print(f"warning: {name}: in-training final accuracy {in_training:.6f} differs from the re-evaluation "
              f"with the preset's safeguard setting ({matching:.6f})", file=sys.stderr)
    record = {
        "dataset": dataset, "model": model, "rho": args.rho, "seed": seed, "variant": args.variant,
        "settings": list(args.set),
        "budget": "reduced" if reduced else "full",
        "accuracy": evals.pop("accuracy"), "accuracy_safeguard": evals.pop("accuracy_safeguard"),
        "safeguard_preset": preset, "best_accuracy": summary["best"]["eval_accuracy"],
        "in_training_accuracy": in_training, "in_training_eval_safeguard": preset, "in_training_check": check,
        "eval_subsets": DATASETS[dataset]["subsets"],
        "eval_split": cfg.eval_split, "eval_max_length": cfg.data.max_length, **evals,
        "requested": {"epochs": args.epochs, "max_train_examples": args.max_train_examples,
                      "max_eval_examples": args.max_eval_examples},
        "train_examples": resolved["train_examples"], "eval_examples": resolved["eval_examples"],
        "epochs": cfg.optim.epochs, "steps": summary["steps"], "parameters": resolved["parameters"],
        "train_tokens": summary["train_tokens"], "padded_tokens": summary["padded_tokens"],
        "train_time_s": summary["train_time_s"], "tokens_per_s": summary["tokens_per_s"],
        # wall time: the training run (data preparation, steps, in-training evaluation, checkpoints;
        # summed over resumed sessions) plus the final evaluation
        "wall_time_s": summary["wall_time_s"] + evals["eval_time_s"], "train_wall_time_s": summary["wall_time_s"],
        "metrics": summary_metrics(work), "config": cfg.to_dict(), "resolved_model": resolved["model"],
        "machine": {**environment(), "threads": torch.get_num_threads()}, "git_commit": git_commit(),
        "run_dir": str(work),
    }
    path = Path(args.results) / f"{name}.json"
    atomic_write_bytes(path, (json.dumps(record, indent=2) + "\n").encode())
    return path


def preset_safeguard(cfg: TrainConfig) -> bool | None:
    """The safeguard of the in-training evaluation: off for unfolded models (it is a run-time option,
    off unless asked for); None for the standard Transformer and the peers, which have none."""
    return None if cfg.model.kind in ("standard", *PEERS) else False


def _limit(a: int | None, b: int | None) -> int | None:
    """The smaller of two example limits (None: no limit); seed-0 subsets of one split are nested."""
    return b if a is None else a if b is None else min(a, b)


def evaluate_cell(work: Path, dataset: str, max_examples: int | None, preset: bool | None) -> dict:
    """Accuracy of the final weights (plain inference, all eval examples); accuracy and energy
    statistics with the safeguard off and on (on the `energy` subset); for IMDB also full-length
    accuracy (on the `full_length` subset) and full-length energy statistics (`energy` subset).
    Each pass is timed; `eval_examples_per_pass` records its size."""
    weights = work / "last.safetensors"
    subsets = {k: _limit(max_examples, v) for k, v in DATASETS[dataset]["subsets"].items()}
    times: dict[str, float] = {}
    sizes: dict[str, int] = {}

    def run(label: str, limit: int | None, **kw) -> dict:
        start = time.perf_counter()
        res = evaluate_checkpoint(weights, max_examples=limit, **kw)
        times[label], sizes[label] = time.perf_counter() - start, res["n"]
        return res

    evaluate_checkpoint(weights, max_examples=1, energies=False)   # untimed warm-up: data and table caches
    plain = run("plain", max_examples, safeguard=False, energies=False)   # ordinary inference: the main accuracy
    e = subsets["energy"]
    # ordinary inference on the energy subset: the cost baseline of the safeguard (same examples)
    base = plain if e == max_examples else run("plain_energy_subset", e, safeguard=False, energies=False)
    out: dict = {"accuracy": plain["accuracy"]}
    if preset is None:                                        # standard Transformer, peers: no safeguard
        out.update(accuracy_energy_subset=base["accuracy"], accuracy_safeguard=None, energy=None,
                   energy_safeguard=None)
        start = time.perf_counter()
        out["peer_energy"] = peer_energy(weights, e)
        if out["peer_energy"] is not None:
            times["peer_energy"], sizes["peer_energy"] = time.perf_counter() - start, out["peer_energy"]["n"]
        matching = base
    else:
        off, on = run("safeguard_off", e, safeguard=False), run("safeguard_on", e, safeguard=True)
        out.update(accuracy_energy_subset=off["accuracy"], accuracy_safeguard=on["accuracy"],
                   energy=off["energy"], energy_safeguard=on["energy"])
        matching = on if preset else off
    if DATASETS[dataset]["full_length_eval"]:
        full = run("full_length", subsets["full_length"], full_length=True, safeguard=False, energies=False)
        out.update(accuracy_full_length=full["accuracy"], accuracy_full_length_safeguard=None,
                   energy_full_length=None, energy_full_length_safeguard=None)
        if preset is not None:
            off = run("full_length_safeguard_off", e, full_length=True, safeguard=False)
            on = run("full_length_safeguard_on", e, full_length=True, safeguard=True)
            out.update(accuracy_full_length_safeguard=on["accuracy"], energy_full_length=off["energy"],
                       energy_full_length_safeguard=on["energy"])
    out["eval_pass_time_s"], out["eval_examples_per_pass"] = times, sizes
    base_time = times["plain_energy_subset" if "plain_energy_subset" in times else "plain"]
    out["safeguard_slowdown"] = times["safeguard_on"] / base_time if "safeguard_on" in times else None
    out["eval_time_s"] = sum(times.values())
    # the in-training evaluation ran in eval mode (the preset's safeguard) on the train_eval subset
    same_set = subsets["train_eval"] == e
    out["matching_accuracy"] = matching["accuracy"] if same_set else None
    return out


@torch.no_grad()
def peer_energy(weights: Path, limit: int | None, batch_size: int = 64) -> dict | None:
    """The peers' own descent statistics on `limit` eval examples (None for other models): the Energy
    Transformer's curve E(g⁰) … E(gᵀ) (never rising = up to float32 round-off, `descent_tolerance`),
    CRATE's per-layer coding rate before / after the attention step and the ISTA sparsity."""
    loaded = load_classifier(weights)
    cfg, model = loaded.config, loaded.model.eval()
    if cfg.model.kind not in PEERS:
        return None
    ds = load_split(cfg, loaded.embeddings, cfg.eval_split, limit)
    tol = descent_tolerance(torch.float32)
    sums: dict[str, torch.Tensor] = {}
    n = 0
    for batch in eval_batches(ds.lengths(cfg.data.max_length), batch_size):
        ids, mask, _ = ds.collate(batch, cfg.data.max_length, loaded.embeddings.pad_id)
        _, out = model(ids, mask, return_energies=True)
        if cfg.model.kind == "energy-transformer":
            curve = out.energies                                    # (B, T + 1)
            step_ok = lowered(curve[:, :-1], curve[:, 1:], tol)     # (B, T)
            parts = {"monotone": step_ok.all(1), "monotone_strict": (curve[:, 1:] <= curve[:, :-1]).all(1),
                     "rising_steps": (~step_ok).double().mean(1), "curve": curve}
        else:
            ok = lowered(out.coding_rate_before, out.coding_rate_after, tol)   # (B, L)
            parts = {"layer_lowers": ok.double().mean(1), "every_layer_lowers": ok.all(1),
                     "rate_before": out.coding_rate_before, "rate_after": out.coding_rate_after,
                     "sparsity": out.sparsity}
        for k, v in parts.items():
            sums[k] = sums.get(k, 0) + v.double().sum(0)
        n += len(batch)
    mean = {k: (v / n).tolist() for k, v in sums.items()}
    if cfg.model.kind == "energy-transformer":
        return {"n": n, "step_size": model.encoder.config.energy_step, "monotone_share": mean["monotone"],
                "monotone_strict_share": mean["monotone_strict"], "rising_step_share": mean["rising_steps"],
                "mean_curve": mean["curve"]}
    return {"n": n, "layer_lowers_share": mean["layer_lowers"], "every_layer_lowers_share": mean["every_layer_lowers"],
            "mean_rate_before": mean["rate_before"], "mean_rate_after": mean["rate_after"],
            "mean_sparsity": mean["sparsity"]}


def summary_metrics(work: Path) -> list[dict]:
    return [json.loads(line) for line in (work / "metrics.jsonl").read_text().splitlines()]


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__.split("\n", 2)[2])
    p.add_argument("--dataset", choices=sorted(DATASETS))
    p.add_argument("--model", choices=LABELS)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--all", action="store_true", help="every (dataset, model, seed) cell without a result yet")
    p.add_argument("--datasets", nargs="+", choices=sorted(DATASETS), default=sorted(DATASETS, reverse=True))
    p.add_argument("--models", nargs="+", choices=LABELS, help="default: all models (exp) or the certified ones")
    p.add_argument("--seeds", nargs="+", type=int, default=[0])
    p.add_argument("--rho", choices=sorted(RHO_FAMILY), default="exp",
                   help=f"attention penalty of the certified models ({', '.join(RHO_MODELS)}); default exp")
    p.add_argument("--results", default=str(RESULTS), help="folder of the result JSON files")
    p.add_argument("--variant", help="name of a set of config changes (--set); adds -v_NAME to the cell's name")
    p.add_argument("--set", action="append", default=[], metavar="SECTION.KEY=VALUE",
                   help="a config change of this variant (repeatable), e.g. model.anchor_weight=0.3")
    p.add_argument("--force", action="store_true", help="with --all: rerun cells that already have a result")
    p.add_argument("--max-train-examples", type=int, help="reduced budget: a fixed random subset of train")
    p.add_argument("--max-eval-examples", type=int, help="reduced budget: a fixed random subset of eval")
    p.add_argument("--epochs", type=int, help="reduced budget: epochs instead of the dataset's")
    p.add_argument("--threads", type=int, default=0, help="torch threads (0: all cores)")
    p.add_argument("--data-dir", default=str(SHARED_DATA) if SHARED_DATA.is_dir() else None,
                   help="folder with SST-2.zip / aclImdb_v1.tar.gz (default: ../shared/data if present, "
                        "else $UNFOLDFORMER_DATA or the cache)")
    p.add_argument("--work-dir", default=str(cache_dir() / "benchmark-runs"), help="training run folders")
    p.add_argument("--resume", action="store_true", help="continue an interrupted cell from its checkpoint")
    p.add_argument("--no-progress", action="store_true")
    args = p.parse_args(argv)
    if not args.all and not (args.dataset and args.model):
        p.error("give --dataset and --model (one cell) or --all")
    if args.set and not args.variant:
        p.error("--set needs --variant: name the variant whose config changes --set gives")
    if args.models is None:
        args.models = list(LABELS) if args.rho == "exp" else list(RHO_MODELS)
    asked = set(args.models) | ({args.model} if args.model else set())
    wrong = sorted(asked - set(RHO_MODELS)) if args.rho != "exp" else []
    if wrong:
        p.error(f"--rho {args.rho} applies to {', '.join(RHO_MODELS)} only, not {', '.join(wrong)}")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    cells = ([(d, m, s) for d in args.datasets for m in args.models for s in args.seeds] if args.all
             else [(args.dataset, args.model, args.seed)])
    for dataset, model, seed in cells:
        name = cell_name(dataset, model, seed, args.rho, is_reduced(args), args.variant)
        existing = Path(args.results) / f"{name}.json"
        if args.all and existing.exists() and not args.force:
            print(f"skip {existing.name} (exists)", file=sys.stderr)
            continue
        path = run_cell(dataset, model, seed, args)
        rec = json.loads(path.read_text())
        guarded = "" if rec["accuracy_safeguard"] is None else f" (safeguard on: {rec['accuracy_safeguard']:.4f})"
        print(f"{path.name}: accuracy {rec['accuracy']:.4f}{guarded}, {rec['tokens_per_s']:.0f} tokens/s, "
              f"wall {rec['wall_time_s']:.0f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
