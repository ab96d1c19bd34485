"""The language-model benchmark: nanoGPT's CPU character Shakespeare configuration, standard vs certified decoders.

    python benchmarks/lm.py time                        # step time of each model (1 thread, alternated), 2,000 iters
    python benchmarks/lm.py run --model certified --seed 0 [--iters 2000]
    python benchmarks/lm.py table                       # docs/results/lm.md from benchmarks/results/lm/*.json

Configuration (nanoGPT's README, CPU): 4 layers, 4 heads, width 128, context 64, batch 12, 2,000 iterations,
AdamW lr 1e-3 with 100 warm-up steps then cosine decay to 1e-4, dropout 0 (its README reports validation loss
1.88). Models: `standard` (pre-LN GPT, `gpt.py`), `certified` (the causal joint layer tied: one layer applied
4 times), `certified-untied` (4 layers). Each `run` trains into a scratch folder (not committed), evaluates the
whole validation split (consecutive windows of 64 characters; nanoGPT estimates on 20 random batches) and, for the
certified models, every validation token's conditional energy at every layer (float64 evaluations), then writes
benchmarks/results/lm/<model>-seed<seed>[-iters<N>].json atomically. Run with OMP_NUM_THREADS=1 under the lock.
"""
from __future__ import annotations

import argparse
import io
import json
import os
import subprocess
import sys
import time
from dataclasses import asdict
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "src"))

from unfoldformer.lm.data import batches, load_text, split  # noqa: E402
from unfoldformer.lm.tokenizer import CharTokenizer  # noqa: E402
from unfoldformer.lm.train import LMTrainConfig, build_model, evaluate_model, load_run, train  # noqa: E402
from unfoldformer.utils import write_json  # noqa: E402

RESULTS = ROOT / "benchmarks" / "results" / "lm"
SCRATCH = Path(os.environ.get("UNFOLDFORMER_SCRATCH", "/tmp/unfoldformer-lm-runs"))
MODELS = ("standard", "certified", "certified-untied")
#: Timed by `time`: (row name, model, LMTrainConfig overrides); the free-key rows are the `-normnone-keysfree` runs.
_FREE = dict(keys="free", attention_norm="none", relative_bias=0, basis="learned")
_TIED = dict(keys="tied", attention_norm="length", relative_bias=0, basis="learned")
TIMED = (("standard", "standard", {}), ("certified", "certified", _TIED),
         ("certified-untied", "certified-untied", _TIED),
         ("certified-normnone-keysfree", "certified", _FREE),
         ("certified-untied-normnone-keysfree", "certified-untied", _FREE),
         ("certified-normnone-keysfree-relbias64", "certified", _FREE | dict(relative_bias=64)),
         ("certified-untied-normnone-keysfree-relbias64", "certified-untied", _FREE | dict(relative_bias=64)),
         ("certified-normnone-keysfree-relbias64-basisnone", "certified", _FREE | dict(relative_bias=64, basis="none")),
         ("certified-untied-normnone-keysfree-relbias64-basisnone", "certified-untied",
          _FREE | dict(relative_bias=64, basis="none")))
#: The issue's targets: (model row, margin over the standard decoder's mean).
TARGETS = (("certified-untied", 0.03), ("certified", 0.05), ("certified-untied-normnone-keysfree", 0.03),
           ("certified-normnone-keysfree", 0.05), ("certified-untied-normnone-keysfree-relbias64-lr0.003", 0.03),
           ("certified-normnone-keysfree-relbias64-lr0.003", 0.05),
           ("certified-untied-normnone-keysfree-relbias64-basisnone-lr0.003", 0.03),
           ("certified-normnone-keysfree-relbias64-basisnone-lr0.003", 0.05))
NANOGPT_VAL_LOSS = 1.88


def _commit() -> str:
    try:
        return subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True,
                              check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def step_times(rounds: int = 7, steps: int = 4) -> dict:
    """Seconds per training step of each `TIMED` model at the configuration, 1 thread, in one process: after 3
    warm-up steps each, `rounds` rounds that time `steps` steps of every model in turn (variants alternated);
    the median over rounds."""
    torch.set_num_threads(1)
    text = load_text("tinyshakespeare")
    tok = CharTokenizer.from_text(text)
    train_ids, _ = split(torch.tensor(tok.encode(text)), 64)
    runs = {}
    for row, model_name, overrides in TIMED:
        cfg = LMTrainConfig(model=model_name, **overrides)
        torch.manual_seed(0)
        model = build_model(cfg, tok)
        runs[row] = (cfg, model, torch.optim.AdamW(model.parameters(), lr=1e-3), torch.Generator().manual_seed(0))

    def train_steps(row: str, k: int) -> float:
        cfg, model, opt, g = runs[row]
        start = time.perf_counter()
        for _ in range(k):
            x, y = batches(train_ids, cfg.context, cfg.batch, g)
            _, loss = model(x, y)
            opt.zero_grad()
            loss.backward()
            opt.step()
        return (time.perf_counter() - start) / k

    for row in runs:
        train_steps(row, 3)
    samples = {row: [] for row in runs}
    for _ in range(rounds):
        for row in runs:
            samples[row].append(train_steps(row, steps))
    out = {}
    for row, (_, model, _, _) in runs.items():
        per_step = sorted(samples[row])[len(samples[row]) // 2]
        out[row] = {"step_s": per_step, "iters_2000_min": per_step * 2000 / 60,
                    "params": sum(p.numel() for p in model.parameters()), "rounds": rounds, "steps_per_round": steps}
        print(f"{row}: {per_step * 1e3:.1f} ms/step, 2,000 iterations ≈ {per_step * 2000 / 60:.1f} min, "
              f"{out[row]['params']:,} parameters", flush=True)
    return out


def _variant(lam: float, norm: str, bound: str, gamma: float = 1.0) -> str:
    """'' for the preset's λ = γ = 1, length normalisation, free W1; else '-lam<λ>' / '-gam<γ>' / '-norm<kind>' /
    '-spectral'."""
    return (("" if lam == 1 else f"-lam{lam:g}") + ("" if gamma == 1 else f"-gam{gamma:g}")
            + ("" if norm == "length" else f"-norm{norm}") + ("" if bound == "none" else f"-{bound}"))


def run(model_name: str, seed: int, iters: int, lam: float = 1.0, norm: str = "length", bound: str = "none",
        val_windows: int | None = None, width: int = 128, gamma: float = 1.0, lr: float = 1e-3,
        keys: str = "tied", relative_bias: int = 0, basis: str = "learned") -> Path:
    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    cfg = LMTrainConfig(model=model_name, seed=seed, iters=iters, eval_interval=max(1, iters // 4), eval_windows=100,
                        anchor_weight=lam, ffn_weight=gamma, attention_norm=norm, ffn_bound=bound, width=width,
                        lr=lr, min_lr=lr / 10, keys=keys, relative_bias=relative_bias,
                        basis=basis)
    variant = ((_variant(lam, norm, bound, gamma) + ("" if keys == "tied" else f"-keys{keys}")
                + ("" if not relative_bias else f"-relbias{relative_bias}")
                + ("" if basis == "learned" else f"-basis{basis}") if model_name != "standard" else "")
               + ("" if width == 128 else f"-w{width}") + ("" if lr == 1e-3 else f"-lr{lr:g}"))
    folder = SCRATCH / f"{model_name}{variant}-seed{seed}-iters{iters}"
    resume = (folder / "state.pt").is_file()
    train(cfg, folder, resume=resume, device="cpu", progress=False)
    model, tok, cfg = load_run(folder)
    rows = [json.loads(json.dumps(r)) for r in torch.load(folder / "state.pt", weights_only=True)["rows"]]
    _, val = split(torch.tensor(tok.encode(load_text(cfg.data))), cfg.context)
    certified = model_name != "standard"
    start = time.perf_counter()
    result = evaluate_model(model, val, windows=val_windows, energies=certified)
    eval_s = time.perf_counter() - start
    g = torch.Generator().manual_seed(0)
    sample = tok.decode(model.generate(torch.tensor([tok.encode("ROMEO:")]), 300, temperature=0.8, top_k=None,
                                       generator=g)[0].tolist())
    train_s = rows[-1]["elapsed_s"] if rows else None
    record = {
        "task": "lm", "dataset": "tinyshakespeare", "model": model_name + variant, "seed": seed, "config": asdict(cfg),
        "commit": _commit(), "val_loss": result["val_loss"], "val_tokens": result["val_tokens"],
        "val_windows": val_windows or "all",
        "val_loss_nanogpt_reported": NANOGPT_VAL_LOSS,
        "tokens_per_s": iters * cfg.batch * cfg.context / train_s if train_s else None,
        "threads": torch.get_num_threads(), "train_s": train_s, "eval_s": eval_s,
        "params": sum(p.numel() for p in model.parameters()),
        "energy": {"token_descent_share": result.get("token_descent_share"),
                   "note": "share of validation tokens whose conditional energy no layer raised (certified); "
                           "float64 evaluations of the float32 states, tolerance descent_tolerance(float32)"}
        if certified else {"token_descent_share": None, "note": "the standard decoder has no energy"},
        "curve": rows, "sample": sample,
    }
    RESULTS.mkdir(parents=True, exist_ok=True)
    suffix = "" if iters == 2000 else f"-iters{iters}"
    path = RESULTS / f"{model_name}{variant}-seed{seed}{suffix}.json"
    write_json(path, record)
    print(f"{path}: val loss {record['val_loss']:.4f}, {record['tokens_per_s']:.0f} tokens/s, "
          f"descent share {record['energy']['token_descent_share']}", flush=True)
    return path


def _targets(rows: list[dict]) -> list[str]:
    """The issue's targets, each with its measured number (2,000-iteration runs only)."""
    full = {}
    for r in rows:
        if r["config"]["iters"] == 2000:
            full.setdefault(r["model"], []).append(r["val_loss"])
    mean = {m: sum(v) / len(v) for m, v in full.items()}
    out = []
    if "standard" in mean:
        gap = mean["standard"] - NANOGPT_VAL_LOSS
        out.append(f"- standard decoder: validation loss {mean['standard']:.3f} against nanoGPT's reported "
                   f"{NANOGPT_VAL_LOSS}, {gap:+.3f} (target: within 0.05; {'met' if abs(gap) <= 0.05 else 'missed'}; "
                   f"{len(full['standard'])} seed(s))")
        out += _baseline_reason()
    for m, margin in TARGETS:
        if m in mean and "standard" in mean:
            gap = mean[m] - mean["standard"]
            out.append(f"- {m}: {mean[m]:.3f}, {gap:+.3f} from the standard decoder (target: within {margin}; "
                       f"{'met' if gap <= margin else 'missed'}; {len(full[m])} seed(s))")
    params = {r["model"]: r["params"] for r in rows}
    for m in sorted((m for m in mean if m.startswith("standard-w")), key=lambda m: params[m]):
        nearest = min((c for c in ("certified", "certified-untied") if c in mean),
                      key=lambda c: abs(params[c] - params[m]), default=None)
        if nearest is not None:
            out.append(f"- diagnosis, parameters: {m} ({params[m]:,} parameters) reaches {mean[m]:.3f}, "
                       f"{mean[nearest] - mean[m]:+.3f} from it to {nearest} ({params[nearest]:,} parameters)")
    return out


def _baseline_reason() -> list[str]:
    """Why the standard decoder is below nanoGPT's reported 1.88 (`lm_diagnosis.py estimator` and the `nanogpt`
    screen), where those results exist."""
    folder, out = RESULTS / "diagnosis", []
    for path in sorted(folder.glob("estimator-*.json")):
        e = json.loads(path.read_text())
        out.append(f"  - not nanoGPT's estimate (`lm_diagnosis.py estimator`, run `{e['run']}`): its whole-split loss "
                   f"{e['whole_split']:.3f}; nanoGPT's estimator ({e['batches']} batches of {e['batch']} random "
                   f"windows) drawn {e['draws']} times gives {e['mean']:.3f} ± {e['std']:.3f} (5–95 %: "
                   f"{e['p05']:.3f}–{e['p95']:.3f}, largest {e['max']:.3f}); "
                   f"{100 * e['share_within_0.05_of_1.88']:.1f} % of the draws fall within 0.05 of 1.88")
    runs = [json.loads(p.read_text()) for p in sorted(folder.glob("screen-nanogpt-seed*-iters2000.json"))]
    if runs:
        losses = [r["val_loss"] for r in runs]
        mean = sum(losses) / len(losses)
        out.append(f"  - nanoGPT's model (`lm_diagnosis.py screen --variant nanogpt`: no biases, weights N(0, 0.02), "
                   f"residual projections N(0, 0.02/√8); 2,000 iterations, whole split): "
                   f"{' / '.join(f'{v:.3f}' for v in losses)} (seeds {', '.join(str(r['seed']) for r in runs)}), "
                   f"mean {mean:.3f}, {mean - NANOGPT_VAL_LOSS:+.3f} from nanoGPT's 1.88 "
                   + ("(within 0.05): the gap is our decoder's biases and initialisation"
                      if abs(mean - NANOGPT_VAL_LOSS) <= 0.05 else "(beyond 0.05)"))
    return out


def table() -> str:
    rows = [json.loads(p.read_text()) for p in sorted(RESULTS.glob("*.json")) if p.name != "step_times.json"]
    rows.sort(key=lambda r: (-r["config"]["iters"], r["model"] != "standard", r["model"], r["seed"]))
    times = RESULTS / "step_times.json"
    lines = ["# Language model: tiny Shakespeare, nanoGPT's CPU configuration", "",
             "<!-- generated by `python benchmarks/lm.py table` from benchmarks/results/lm/*.json; do not edit -->",
             "", "Character-level, 4 layers, 4 heads, width 128, context 64, batch 12, AdamW lr 1e-3 (100 warm-up "
             "steps, cosine to 1e-4), dropout 0, one CPU thread (`OMP_NUM_THREADS=1`, the machine shared with other "
             "jobs). Validation loss over the whole validation split (the last 10 % of the text) in consecutive "
             "windows of 64 characters; nanoGPT reports 1.88 for its standard model, estimated on 20 random "
             "batches. The last column: validation tokens whose conditional energy no layer raised, evaluated in "
             "float64 from the float32 states (certified, THEORY §3.11); the sequence energy G is not certified "
             "and not counted here. `standard-wN`: the standard decoder at width N, a parameter-matched diagnosis "
             "of the gap. `certified-lamΛ[-gamΓ]`: the tied certified decoder with λ = Λ (and γ = Γ), "
             "500-iteration screens of the cause fresh_tasks.md found on digits (attention's small share of the "
             "joint step at initialisation, ν d_i : 1 : γ): a larger λ does not help here (500 iterations: λ = 1 "
             "2.649, λ = 4 2.667, λ = 16 with γ = 3 2.708, λ = 16 2.890, λ = 64 with γ = 7 2.845), so that is not "
             "the decoder's gap. `-lrX`: peak learning rate X (floor X/10): lr 3e-3 helps the certified decoder a "
             "little (500 iterations 2.553, 2,000 iterations 2.492 against 2.518 at 1e-3; 1e-2 is worse, 2.698 at "
             "500), far from closing the gap. `-keysfree`: the decoder with per-head maps and free context keys "
             "(`--keys free`, THEORY §3.11 extended in docs/theory.md §4d: queries c_i A_hᵀ, keys ȳ_j K_h, every "
             "token's step still certified), with `-normnone` (λ instead of λ/m_i). `-relbiasK`: learned pair "
             "biases b_h(i − j) for the offsets below K (`--relative-bias K`: each pair of a token's conditional "
             "energy weighted by e^{b}, every token's step still certified; docs/theory.md §4d), so that a head can "
             "prefer an offset, such as the previous character. `-basisnone`: no learned orthogonal head basis "
             "(`--basis none`, the heads contiguous blocks of the state; each layer's learned basis is a matrix "
             "exponential and its gradient every step). "
             "Guide: [A certified language model](../guides/language-model.md).", "",
             "| model | seed | iterations | parameters | val loss | tokens/s (train, 1 thread) "
             "| tokens never rising |", "|---|---|---|---|---|---|---|"]
    for r in rows:
        share = r["energy"]["token_descent_share"]
        windows = "" if r.get("val_windows", "all") == "all" else f" ({r['val_windows']} windows)"
        lines.append(f"| {r['model']} | {r['seed']} | {r['config']['iters']:,} | {r['params']:,} | "
                     f"{r['val_loss']:.3f}{windows} "
                     f"| {r['tokens_per_s']:,.0f} | {'—' if share is None else f'{100 * share:.2f} %'} |")
    targets = _targets(rows)
    if targets:
        lines += ["", "Against the issue's targets:", "", *targets]
    if times.is_file():
        t = json.loads(times.read_text())
        lines += ["", "Step time (one thread, one process, the models alternated: the median of 7 rounds of 4 "
                  "steps each, after 3 warm-up steps; `python benchmarks/lm.py time`):", "",
                  "| model | ms / step | speed against standard | 2,000 iterations | parameters |",
                  "|---|---|---|---|---|"]
        for name, _, _ in TIMED:
            if name in t:
                speed = t["standard"]["step_s"] / t[name]["step_s"] if "standard" in t else float("nan")
                lines.append(f"| {name} | {1e3 * t[name]['step_s']:.1f} | {speed:.2f}× "
                             f"| {t[name]['iters_2000_min']:.1f} min | {t[name]['params']:,} |")
    lines += _diagnosis() + _ablation()
    if (ROOT / "docs" / "img" / "lm-token-energies.png").is_file():
        lines += ["", f"Each generated character's conditional energy at every layer of `{FIGURE_RUN}` (seed 0; the "
                  "last 64 characters of its sample below; `python benchmarks/lm.py figure`). Each curve is "
                  "E_i(ȳ_i | Ȳ) at a layer's input Ȳ, the context moving from layer to layer (their sum is G, "
                  "measured, not certified); what is certified is each layer's own step, E_i(y⁺_i | Ȳ) ≤ "
                  "E_i(ȳ_i | Ȳ) for every token (the title's check).", "",
                  "![token energies](../img/lm-token-energies.png)"]
    for r in rows:
        lines += ["", f"Sample of `{r['model']}` (seed {r['seed']}, {r['config']['iters']:,} iterations; prompt "
                  "\"ROMEO:\", temperature 0.8, 300 characters):", "", "```text", r["sample"], "```"]
    return "\n".join(lines) + "\n"


def _diagnosis() -> list[str]:
    """The measured reason for the gap, from `benchmarks/lm_diagnosis.py` (results/lm/diagnosis/)."""
    folder = RESULTS / "diagnosis"
    if not (folder / "attention.json").is_file():
        return []
    d = json.loads((folder / "attention.json").read_text())
    ngram = d["ngram_val_loss"]
    lines = ["", "## Why the certified decoder trailed without relative biases", "",
             f"Count n-gram models of the validation split (fitted on the training split, add-0.1 smoothing; "
             f"`python benchmarks/lm_diagnosis.py attention`): unigram {ngram['unigram']:.3f}, **bigram "
             f"{ngram['bigram']:.3f}**, trigram {ngram['trigram']:.3f}. The certified decoders with tied keys "
             "reach 2.48–2.52, the bigram model's loss: they use almost nothing of the context. Their attention, per "
             f"layer on 32 validation windows (positions ≥ {d['from_position']}; the 2,000-iteration runs; for the "
             "free-key rows the last column is ‖A_h‖₂):", "",
             "| model | layer | effective keys / visible keys | weight on itself | weight on the previous token "
             "| uniform 1/m_i | attention's share of the step (gate) | scales s_h |",
             "|---|---|---|---|---|---|---|---|"]
    for name, layers in d["models"].items():
        for ell, r in enumerate(layers):
            lines.append(f"| {name} | {ell + 1} | {r['effective_keys_share']:.3f} | {r['self_weight']:.3f} | "
                         f"{r['previous_weight']:.3f} | {r['uniform_weight']:.3f} | {r['gate']:.3f} | "
                         f"{', '.join(f'{s:.2f}' for s in r['scales'])} |")
    lines += ["", "With tied keys the rows are nearly uniform averages of the whole prefix (effective keys 71–100 % "
              "of the visible ones), where they peak they peak on the token itself, the previous token gets less "
              "than the uniform weight, and the attention supplies 5–9 % of each step's target (ν'd_i : 1 + γ). With "
              "free keys and λ instead of λ/m_i the attention supplies 70–84 % of the target, but its rows are still "
              "near-uniform (effective keys 90–100 %, the previous token at the uniform weight): at 2,000 iterations "
              "free keys lower the loss through a heavier average of the prefix, not through a previous-token head; "
              "their maps stay small (‖A_h‖₂ 0.2–1.4), so the kernel stays flat. Two properties of "
              "the certified step make this so. (1) q = k = v: the weight β_ij = ρ'(½s²‖y_i − y_j‖²) is a kernel "
              "of the distance between token states, largest at the token itself (β_ii = ρ'(0)), so no head can "
              "select \"the previous character\" and carry its identity: selecting by position carries position, "
              "selecting by content finds the token itself. A standard head's W_Q ≠ W_K, W_V does both. (2) The "
              "states are small (norm ≈ 0.5, s_h ≈ 0.3–0.7 from dh^(-1/4) = 0.42): distances are tiny, so the "
              "kernel is flat, and where it sharpens the length-normalised gate ν'd_i/(ν'd_i + 1 + γ) falls, "
              "because d_i/m_i is the mean kernel weight."]
    screens = sorted(folder.glob("screen-*.json"))
    if screens:
        lines += ["", "Screens of variants that are *not* library options (`python benchmarks/lm_diagnosis.py screen "
                  "--variant …`, the tied decoder, seed 0, whole validation split; `strict`: the self pair out of "
                  "each conditional energy, which THEORY §3.11 allows; `innorm`: X = LayerNorm(E[ids] + P[i]), "
                  "states of norm √d; `rotary`: rotary positions as well; `normnone`: λ instead of λ/m_i; "
                  "`keysfree`: free context keys; `lrX`: peak learning rate X; `sphere`: every head block of the "
                  "state kept on the sphere of radius √dh, each step's result projected back — the projected step "
                  "minimises each token's isotropic majoriser over the sphere, so it stays certified, and it plays "
                  "the part of the standard block's inner norm; `relbiasK`: learned pair biases b_h(i − j) = Kθ, "
                  "the first version of `--relative-bias`, whose statistics columns ignore the bias; `bias64`: the "
                  "library's `--relative-bias 64`; `stepbias`: a bias table per application of the tied layer "
                  "besides it — 1.885 against 1.884 without, seed 0, so the tied decoder's remaining gap is not "
                  "the one shared table; `ffn16`: the tied layer's FFN 16·width wide instead of 4·width (334 k "
                  "stored values against 136 k; the standard decoder has 810 k) — 1.897, so the gap is not the FFN's "
                  "width; `wd0`: no weight decay — 1.883; `sharedffn` / `sharedattn`: the untied decoder (1.828, "
                  "seed 0) with one FFN, or one attention, shared by its 4 layers — 1.856 and 1.850, so the tied "
                  "decoder's 0.056 over the untied one splits about evenly between its shared FFN (+0.028) and its "
                  "shared attention (+0.022): it is the sharing across depth, not one part; `learnsteps`: the "
                  "library's `learn_steps=True` (α and γ learned, one pair for the tied layer's steps) — 1.880; "
                  "`standardtied`: the *standard* pre-LN GPT decoder with one block shared by its 4 layers, what "
                  "tying costs a decoder that is not certified — 1.906 / 1.916 / 1.909 (seeds 0 / 1 / 2, mean 1.910) "
                  "at lr 1e-3 and 1.862 / 1.881 / 1.878 (mean 1.874) at lr 3e-3, the certified decoders' rate. At "
                  "each one's best rate the tied standard decoder is 0.058 above the untied one (1.874 against "
                  "1.816), beyond the 0.05 the tied certified decoder is asked for, and 0.014 below the tied "
                  "certified decoder's 1.888 (same seeds, same rate); at equal rates tying costs it 0.094 (1e-3) "
                  "and 0.036 (3e-3, where the untied one averages 1.838: 1.792 / 1.894 / 1.827). Tying the "
                  "layers, not certifying them, is most of the tied decoder's gap; `nanogpt`: the *standard* "
                  "decoder as nanoGPT's model — no biases, weights N(0, 0.02), residual projections N(0, 0.02/√8), "
                  "lr 1e-3 — what separates our baseline from nanoGPT's reported 1.88 (the targets list above):", "",
                  "| variants | iterations | val loss | effective keys / visible (last layer) "
                  "| weight on the previous token (last layer) | gate (last layer) |", "|---|---|---|---|---|---|"]
        for path in screens:
            r = json.loads(path.read_text())
            last = r["stats"][-1] if r["stats"] else None             # none for the standard decoder
            stats = ("| — | — | —" if last is None else f"| {last['effective_keys_share']:.3f} "
                     f"| {last['previous_weight']:.3f} | {last['gate']:.3f}")
            seed = "" if r["seed"] == 0 else f" (seed {r['seed']})"
            lines.append(f"| {', '.join(r['variants']) or 'none (the preset)'}{seed} | {r['iters']:,} "
                         f"| {r['val_loss']:.3f} {stats} |")
        lines += ["", "None of them beats the preset at 500 iterations (the learning rate 3e-3 does, 2.553, and "
                  "reaches 2.492 at 2,000: still the bigram loss): without the self pair the kernel still weights "
                  "tokens by the distance of their states, and once the states are large enough for peaked weights "
                  "the gate closes (d_i is the kernel mass, small when no state is near): with the self pair out, "
                  "states of norm √d and rotary positions the last layer weights the previous token 6× the uniform "
                  "weight, but its gate is 0.000; λ = 100 without length normalisation opens the gate and the loss "
                  "rises. What it needs is a step whose selection and value differ. In an encoder q ≠ k breaks the "
                  "one energy of all tokens (THEORY §3.2); in a decoder each token's energy holds its context "
                  "fixed, so the context's keys may have their own map and every token's step stays certified: "
                  "the `-keysfree` rows above (docs/theory.md §4d), whose attention is in the first table: they gain "
                  "0.10–0.14, not yet through selection; selection by offset came with learned relative biases "
                  "(`-relbias64`; the `relbiasK` screens below are its first version, K the step scale of b = Kθ). "
                  "States on the sphere (`sphere`, with free keys at lr 3e-3) "
                  "make the attention peaked (effective keys 20–34 % of the visible, against 78 % without) and lead "
                  "at 500 iterations (2.501 against 2.536), but fall behind by 2,000: 2.391 against 2.336 for the "
                  "same model without it (the `certified-normnone-keysfree-lr0.003` row, seed 0), so the missing "
                  "inner norm is not made up this way and it is not a library option."]
    return lines


def _ablation() -> list[str]:
    """The standard GPT with the certified step's constraints one at a time (`benchmarks/lm_ablation.py`)."""
    rows = [json.loads(p.read_text()) for p in sorted((RESULTS / "ablation").glob("*.json"))]
    if not rows:
        return []
    rows.sort(key=lambda r: (len(r["variants"]), r["val_loss"]))
    base = next((r["val_loss"] for r in rows if not r["variants"]), None)
    lines = ["", "## Which constraint costs the most: the standard GPT with them one at a time", "",
             "`python benchmarks/lm_ablation.py --variant …` (seed 0, 2,000 iterations, the configuration above; the "
             "block written again so that each constraint is one switch, so its unconstrained loss differs a little "
             "from `gpt.py`'s): `tiedmlp` W₂ = W₁ᵀ with ReLU (the tied FFN energy), `nonorm` no LayerNorm inside "
             "the blocks (the certified step has none), `qk` W_Q = W_K, `vk` W_V = W_K with W_O = W_Kᵀ.", "",
             "| constraints | parameters | val loss | cost |", "|---|---|---|---|"]
    for r in rows:
        cost = "—" if base is None or not r["variants"] else f"{r['val_loss'] - base:+.3f}"
        lines.append(f"| {', '.join(r['variants']) or 'none'} | {r['params']:,} | {r['val_loss']:.3f} | {cost} |")
    lines += ["", "The certified step has all four with tied keys, and all but `qk` with free keys (its values are "
              "the keys mapped back). In the standard block they cost about what separates the certified decoders "
              "from it without biases: q = k = v is the largest single cost, then the missing inner norm, then the "
              "tied MLP. The standard block selects by position through the learned absolute positions in its "
              "queries and keys; a certified head with tied keys cannot (a kernel of the distance, largest at the "
              "token itself), and with free keys alone it did not learn to. A learned bias per offset in each "
              "token's energy (`-relbias64`) gives it that selection directly, and with it the untied certified "
              "decoder reaches the standard one (1.821 against 1.816, 3 seeds) while every constraint of this "
              "table except `qk` stays on."]
    return lines


#: The run whose sample `figure` draws: the best certified decoder of the table.
FIGURE_RUN = "certified-untied-normnone-keysfree-relbias64-basisnone-lr0.003"


def figure(model_name: str = FIGURE_RUN, seed: int = 0, iters: int = 2000) -> Path:
    """docs/img/lm-token-energies.png: each generated token's conditional energy at every layer's input and after
    the last layer, for the last 64 characters of the run's sample (the certified model of `run`)."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    record = json.loads((RESULTS / f"{model_name}-seed{seed}{'' if iters == 2000 else f'-iters{iters}'}.json")
                        .read_text())
    model, tok, cfg = load_run(SCRATCH / f"{model_name}-seed{seed}-iters{iters}")
    text = record["sample"][-cfg.context:]
    with torch.no_grad():
        out = model.hidden(torch.tensor([tok.encode(text)]), return_energies=True)
    before, after = out.token_before[0], out.token_after[0]          # (T, n)
    fig, ax = plt.subplots(figsize=(10, 3.2))
    for ell in range(before.shape[0]):
        ax.plot(before[ell].numpy(), lw=1, label=f"E_i at layer {ell + 1}'s input")
    ax.plot(after[-1].numpy(), "k--", lw=1, label="after the last layer")
    ax.set_xticks(range(len(text)), [c if c != "\n" else "⏎" for c in text], fontsize=6)
    ax.set_yscale("symlog", linthresh=1.0)
    ax.set_ylabel("conditional energy E_i (symlog)")
    ax.set_title(f"{model_name}: every generated token's energy, layer by layer (never rises: "
                 f"{bool(out.token_lowered().all())})", fontsize=9)
    ax.legend(fontsize=7, ncol=3)
    fig.tight_layout()
    path = ROOT / "docs" / "img" / "lm-token-energies.png"
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=130)
    from unfoldformer.utils import atomic_write_bytes
    atomic_write_bytes(path, buf.getvalue())
    return path


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    sub.add_parser("time")
    r = sub.add_parser("run")
    r.add_argument("--model", choices=MODELS, required=True)
    r.add_argument("--seed", type=int, default=0)
    r.add_argument("--iters", type=int, default=2000)
    r.add_argument("--width", type=int, default=128, help="the model's width (default 128, nanoGPT's); another "
                   "width is a variant, e.g. a standard decoder with the certified one's parameter count")
    r.add_argument("--anchor-weight", type=float, default=1.0, help="certified: λ (default 1, the preset's)")
    r.add_argument("--ffn-weight", type=float, default=1.0, help="certified: γ (default 1, the preset's)")
    r.add_argument("--lr", type=float, default=1e-3, help="peak learning rate (default 1e-3, nanoGPT's; the floor is "
                   "a tenth of it)")
    r.add_argument("--attention-norm", choices=("length", "none"), default="length")
    r.add_argument("--ffn-bound", choices=("none", "spectral"), default="none")
    r.add_argument("--keys", choices=("tied", "free"), default="tied", help="certified: free context keys "
                   "(per-head maps A_h, K_h; causal.py) or the preset's tied ones")
    r.add_argument("--relative-bias", type=int, default=0, help="certified: learned pair biases b_h(i − j) for the "
                   "offsets below this (causal.py; default 0: none)")
    r.add_argument("--basis", choices=("learned", "none"), default="learned", help="certified: a learned orthogonal "
                   "head basis per distinct layer, or none (contiguous head blocks)")
    r.add_argument("--val-windows", type=int, default=None, help="only the first N validation windows (default all)")
    sub.add_parser("table")
    fig = sub.add_parser("figure")
    fig.add_argument("--model", default=FIGURE_RUN, help=f"the run's row name (default {FIGURE_RUN})")
    fig.add_argument("--seed", type=int, default=0)
    args = p.parse_args()
    if args.cmd == "time":
        write_json(RESULTS / "step_times.json", step_times())
    elif args.cmd == "run":
        run(args.model, args.seed, args.iters, args.anchor_weight, args.attention_norm, args.ffn_bound,
            args.val_windows, args.width, args.ffn_weight, args.lr, args.keys, args.relative_bias, args.basis)
    elif args.cmd == "figure":
        print(figure(args.model, args.seed))
    else:
        from unfoldformer.utils import atomic_write_text
        atomic_write_text(ROOT / "docs" / "results" / "lm.md", table())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
