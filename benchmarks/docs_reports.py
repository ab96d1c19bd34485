"""Generated blocks that come from the commands' own reports rather than from the benchmark cells: the probe of a
pretrained encoder (`unfoldformer probe`) and its distilled students beside it, the reproduction's verdicts
(`unfoldformer reproduce`), the ρ study's token diversity (`unfoldformer rho-study`) and the measured rates of
THEORY §3.6's counterexamples (the test that asserts them, `tests/test_steps.py`)."""
from __future__ import annotations

import ast
import statistics
from pathlib import Path

from docs_common import load, md, threads_said
from unfoldformer.paper.report import verdict_rows

__all__ = ["counterexamples", "pretrained_descent", "probe", "reproduction", "rho_spread"]

ROOT = Path(__file__).resolve().parent.parent


def _cell(text: str) -> str:
    """A table cell: a literal `|` escaped so it does not split the row."""
    return text.replace("|", "\\|")


def _whole(v: float) -> str:
    return f"{v:,.0f}".replace("-", "−")


def _signed(v: float) -> str:
    return f"{v:+.3f}".replace("-", "−")


def probe(results: Path) -> str:
    """Per layer of MiniLM: does the layer lower the energy built from its own heads, and how symmetric / PSD are
    its heads; then all heads against random weights of the same shapes."""
    raw = load(results, "probe/minilm-sst2.json")
    heads = raw["heads"]
    layer_mean = lambda key, layer: statistics.fmean(heads[key][layer])        # noqa: E731
    rows = [[str(r["layer"]), f"{r['share_decreased']:.3f}", _signed(r["median_relative_change"]),
             f"{layer_mean('skew_ratio', r['layer']):.3f}", f"{layer_mean('negative_mass', r['layer']):.3f}",
             f"{layer_mean('value_structure_distance', r['layer']):.3f}"] for r in raw["per_layer"]]
    every = lambda key: statistics.fmean(v for layer in heads[key] for v in layer)   # noqa: E731
    base = raw["random_baseline"]
    summary = [[name, f"{every(key):.3f}", f"{base[key]:.3f}"] for name, key in (
        ("skew ratio ‖K‖/‖G‖", "skew_ratio"), ("negative eigen-mass of S", "negative_mass"),
        ("distance of W_V W_O from a scaled projector", "value_structure_distance"))]
    n_heads = len(heads["skew_ratio"][0])
    cfg = raw["config"]
    return (f"*`{raw['command']}`*: {raw['samples']} {cfg['dataset'].upper().replace('SST2', 'SST-2')} "
            f"{cfg['split']} texts (seed {cfg['seed']}, at most {cfg['max_length']} tokens), "
            f"{raw['model_class']}, wall time {raw['wall_seconds']:.1f} s at "
            f"{threads_said(cfg, 'the probe config')} "
            f"({raw.get('machine_load', 'machine load not recorded')}).\n\n"
            + md(["layer", "share of samples whose own energy falls", "median relative change of the own energy",
                  f"mean skew ratio (its {n_heads} heads)", "mean negative eigen-mass", "mean value distance"], rows)
            + f"\nOver all {len(heads['skew_ratio']) * n_heads} heads, against i.i.d. Gaussian weights of the same "
              "shapes:\n\n"
            + md(["measure", raw["model_class"], "random weights"], summary))


def pretrained_descent(results: Path) -> str:
    """Per layer: MiniLM's probe columns, then each distilled zoo encoder's share of texts whose layer energy fell
    and median relative change, on the probe's texts (`benchmarks/pretrained_descent.py`)."""
    record = load(results, "pretrained/descent-sst2.json")
    head = ["layer", "MiniLM: share whose own energy falls", "MiniLM: median relative change"]
    for name in record["students"]:
        head += [f"`{name}`: share lowered", f"`{name}`: median relative change (median E before → after)"]
    rows = []
    for ell, row in enumerate(record["teacher"]["per_layer"]):
        cells = [str(ell), f"{row['share_decreased']:.3f}", _signed(row["median_relative_change"])]
        for s in record["students"].values():
            cells += [f"{s['share_lowered'][ell]:.3f}", f"{_signed(s['median_relative_change'][ell])} "
                      f"({_whole(s['median_energy_before'][ell])} → {_whole(s['median_energy_after'][ell])})"]
        rows.append(cells)
    every = ", ".join(f"`{k}` {s['every_layer_lowered']} / {s['texts']}" for k, s in record["students"].items())
    share = statistics.fmean(r["share_decreased"] for r in record["teacher"]["per_layer"])
    texts = record["texts"]
    return (f"*`python benchmarks/pretrained_descent.py`*: the probe's {texts['samples']} SST-2 {texts['split']} "
            f"texts (seed {texts['seed']}, at most {texts['max_length']} word pieces).\n\n" + md(head, rows)
            + f"\nTexts on which every layer lowered its energy: {every}. MiniLM's layers lower the energy of "
              f"their own heads on {share:.1%} of (text, layer) pairs.\n")


def _counterexample_table() -> tuple[int, list[tuple[str, float, float, float]]]:
    """TRIALS and (case, measured rate, band low, band high) read from the test's source, without importing it."""
    tree = ast.parse((ROOT / "tests" / "test_steps.py").read_text(encoding="utf-8"))
    trials, cases = None, []
    for node in tree.body:
        target = node.targets[0].id if isinstance(node, ast.Assign) and isinstance(node.targets[0], ast.Name) \
            else node.target.id if isinstance(node, ast.AnnAssign) else None
        if target == "TRIALS":
            trials = ast.literal_eval(node.value)
        elif target == "COUNTEREXAMPLES":
            for key, value in zip(node.value.keys, node.value.values):
                _, measured, band = value.elts
                low, high = ast.literal_eval(band)
                cases.append((ast.literal_eval(key), ast.literal_eval(measured), low, high))
    if trials is None or not cases:
        raise SystemExit("docs_reports: TRIALS / COUNTEREXAMPLES not found in tests/test_steps.py")
    return trials, cases


def counterexamples(results: Path) -> str:
    """THEORY §3.6: each case's share of fixed-seed float64 trials whose energy rises, and the band its test accepts
    (`results` is unused: the numbers live in the test that asserts them)."""
    trials, cases = _counterexample_table()
    rows = [[_cell(name), f"{100 * rate:.1f} %", f"{100 * low:.1f} – {100 * high:.1f} %"]
            for name, rate, low, high in cases]
    return (f"*`python -m pytest tests/test_steps.py -k counterexample -s`* ({trials} fixed seeds per case, "
            "float64; the test reruns every trial and fails outside the band)\n\n"
            + md(["case", f"share of the {trials} trials whose energy rises (measured)", "band the test accepts"],
                 rows))


def reproduction(results: Path) -> str:
    """The verdicts of `unfoldformer reproduce` (full run), by the report's own `verdict_rows`, and its wall time."""
    raw, timings = load(results, "reproduce/results.json"), load(results, "reproduce/timings.json")
    cfg = load(results, "reproduce/config.json")
    slowest = sorted(timings["jobs"].items(), key=lambda kv: -kv[1]["wall_s"])[:3]
    threads = threads_said(cfg, "reproduce/config.json")
    return (f"*`unfoldformer reproduce --threads {cfg['threads']}`* (mode {cfg['mode']}: figures "
            f"{', '.join(map(str, cfg['figures']))}, {cfg['samples']} samples per data set, IMDB curves at "
            f"{cfg['imdb_max_length']} tokens, {cfg['embeddings']} embeddings, seed {cfg['seed']}; {threads}): wall "
            f"time {timings['total']:.0f} s, {timings['cpu_time_all_processes']:.0f} s of CPU; longest jobs "
            + ", ".join(f"{name} {t['wall_s']:.0f} s" for name, t in slowest) + "\n\n"
            + md(["claim of the paper", "reproduced?", "evidence"],
                 [[_cell(c), _cell(v), _cell(e)] for c, v, e in verdict_rows(raw)]))


def rho_spread(results: Path) -> str:
    """Token diversity per ρ (`unfoldformer rho-study`): the spread retained after 6 / 12 steps of the random-init
    alternating and joint models on both data sets, and of attention alone with its heads at median z = 10."""
    raw = load(results, "rho_study/results.json")
    data, rhos = raw["datasets"], raw["settings"]["rhos"]
    first = raw["settings"]["datasets"][0]

    def model(ds: str, source: str, rho: str) -> str:
        curve = data[ds]["sources"][source][rho]["dynamics"]["model"]["spread_retained"]
        return f"{curve[6]:.3f} / {curve[12]:.3f}"

    def alone(rho: str) -> str:
        at = data[first]["sources"]["random"][rho]["sweep"]["10.0"]["dynamics"]["attention"]["at"]
        return f"{at['6']['spread_retained']:.3f} / {at['12']['spread_retained']:.3f}"
    names = {"sst2": "SST-2", "imdb": "IMDB"}
    head = ["ρ"] + [f"{kind}, {names[ds]}" for kind in ("alternating", "joint") for ds in data] \
        + [f"attention alone, heads at median z = 10, {names[first]}"]
    rows = [[rho] + [model(ds, src, rho) for src in ("random", "random-joint") for ds in data] + [alone(rho)]
            for rho in rhos]
    cfg = raw["settings"]
    return (f"*`{raw['command']}`* ({cfg['samples']} held-out sentences per data set, random-init models of width "
            f"{cfg['architecture']['d_model']}, depth {cfg['architecture']['depth']}, run for {cfg['steps']} "
            f"steps, identical weights for every ρ; {raw['wall_seconds']:.0f} s at "
            f"{threads_said(cfg, 'rho_study/results.json')}). *Spread retained after 6 / 12 steps*:\n\n"
            + md(head, rows))
