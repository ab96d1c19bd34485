"""The speed blocks of the generated documentation (`make_docs.py`): energy, training and inference steps, the
general-ρ attention step at 1 and 2 threads, idle and beside a busy process, and scaling with n. Each reads
one result file of `benchmarks/results/speed/` written by the benchmark its caption names."""
from __future__ import annotations

import json
import statistics
from pathlib import Path

import make_table as mt  # the accuracy table's loading and cell formatting (same folder)
from docs_common import load, md, threads_said

__all__ = ["compile_speed", "energy_peak", "energy_speed", "inference_energies", "inference_speed", "profiles",
           "profiles_shared_machine", "rho_busy", "rho_cost", "rho_step", "rho_threads", "scaling", "train_speed"]


def energy_speed(results: Path) -> str:
    """The energy benchmark (`benchmarks/energy_speed.py --json`): the rows the script prints, from its file."""
    rel = "speed/energy_speed.json"
    raw = load(results, rel)
    a, b, c, d = raw["a"], raw["b"], raw["c"], raw["d"]
    yes = lambda ok: "yes" if ok else "no"
    rows = [[f"(a) energies of {a['samples']} sequences (mean {a['mean_len']:.0f}, max {a['max_len']} tokens, d = 300, "
             f"batched by the caller): library {a['library_s']:.2f} s vs pair-difference reference "
             f"{a['reference_s']:.1f} s", f"{a['speedup']:.0f}× faster, max rel. diff {a['max_rel_diff']:.1e}",
             "≥ 50×, ≤ 1e-9", yes(a["speedup"] >= 50 and a["max_rel_diff"] <= 1e-9)],
            [f"(b) one padded batch of {b['samples']} of them ({' × '.join(map(str, b['shape']))}, "
             f"{b['real_tokens']:,} real tokens), one call: library {b['library_s']:.2f} s (Gram path "
             f"{b['gram_s']:.1f} s, {b['gram_speedup']:.0f}×) vs reference {b['reference_s']:.1f} s",
             f"{b['speedup']:.0f}× faster, max rel. diff {b['max_rel_diff']:.1e}", "≥ 50×", yes(b["speedup"] >= 50)]]
    labels = {"curve": "`return_energies=True` (the curve)", "steps": "`return_energies=\"steps\"` (sub-steps too)",
              "safeguard": "`safeguard=True` (curve, backtracking)"}
    for mode, target in {"curve": 0.60, "steps": 1.10, "safeguard": None}.items():
        over = c["overhead"][mode]
        rows.append([f"(c) {labels[mode]}, 12-layer certified, B=32 n=128 d=384: {c['median_s']['plain']:.3f} s → "
                     f"{c['median_s'][mode]:.3f} s (median of {c['repeats']})", f"+{100 * over:.0f} %",
                     f"≤ +{round(100 * target)} %" if target else "–", yes(over <= target) if target else "–"])
    joint = [("(c') `return_energies=True`, 12-layer certified-joint, B=32 n=128 d=384", raw.get("c_joint"))]
    if (results / "speed" / "energy_speed_joint_2threads.json").is_file():
        j = load(results, "speed/energy_speed_joint_2threads.json")["c_joint"]
        joint.append((f"(c') the same at {j['threads']} threads (`--only-joint --threads {j['threads']} --json "
                      "benchmarks/results/speed/energy_speed_joint_2threads.json`, wall time)", j))
    for label, j in joint:
        if j:
            rows.append([f"{label}: {j['median_s']['plain']:.3f} s → {j['median_s']['curve']:.3f} s "
                         f"(median of {j['repeats']})", f"+{100 * j['overhead']:.0f} %", "≤ +15 %",
                         yes(j["overhead"] <= 0.15)])
    worst = max(c["max_rel_diff"].values())
    rows.append(["(c) precision of every reported energy vs the float64 Gram reference (curve, 4 sub-step terms)",
                 f"max {worst:.1e} relative", "≤ 1e-5", yes(worst <= 1e-5)])
    gib = d["peak_bytes_above_input"] / 2**30
    rows.append([f"(d) peak memory of the energy, n = {d['n']}, d = {d['d']}, 4 heads",
                 f"{gib:.3f} GiB above the input", "< 1 GiB", yes(gib < 1)])
    load_avg = raw.get("load_average")
    return (f"*`python benchmarks/energy_speed.py --repeats {c['repeats']} --json benchmarks/results/{rel}`* "
            f"(every time at {threads_said(raw, rel)}, CPU thread time; "
            + (f"load average {' – '.join(f'{x:.1f}' for x in load_avg)}" if load_avg
               else "load average not recorded in the file")
            + ")\n\n" + md(["benchmark", "measured", "target", "met"], rows))


def energy_peak(results: Path) -> str:
    """(e) of `energy_speed.py --peak`: the fused float64 energy against the machine's measured matmul peak."""
    raw = load(results, "speed/energy_speed_peak.json")["e"]
    rows = []
    for t, cell in sorted(raw["per_threads"].items(), key=lambda kv: int(kv[0])):
        fused = cell["fused (float64)"]
        rate = raw["flop"] / fused
        rows.append([f"{t}", f"{1e3 * fused:.0f} ms", f"{1e3 * cell['gram (float64)']:.0f} ms",
                     f"{cell['reference']:.1f} s", f"{cell['reference'] / fused:.0f}×",
                     f"{rate / 1e9:.1f} GFLOP/s", f"{100 * rate / cell['peak float64']:.0f} %"])
    shape = " × ".join(map(str, raw["shape"]))
    return (f"*(e) the energies of one padded batch ({shape}, {raw['real_tokens']:,} real tokens) in float64, "
            "against this machine's float64 matmul peak measured in the same process* "
            "(`benchmarks/results/speed/energy_speed_peak.json`; median wall time; the rate counts the fused "
            "pass's multiply-adds on the real tokens)\n\n"
            + md(["threads", "fused", "Gram path", "pair-difference reference", "fused vs reference",
                  "fused rate", "of float64 peak"], rows))


def _rho_speed_tables(raw: dict) -> list[tuple[str, str, dict]]:
    """[(threads, clock, {n: {step/pass: {ρ: cell}}})] of `rho_speed.json`: one thread count per entry. Files
    written before `rho_speed.py` alternated thread counts hold one (an int) and CPU thread time; later ones
    hold {n: {threads: ...}} and wall time."""
    setting, res = raw["setting"], raw["results"]
    if isinstance(setting["threads"], int):
        return [(threads_said(raw, "rho_speed.json"), "median CPU thread time", res)]
    return [(threads_said({"threads": t}, "rho_speed.json"), "median wall time", {n: v[str(t)] for n, v in res.items()})
            for t in sorted(setting["threads"])]


def rho_step(results: Path, file: str = "rho_speed.json", flag: str = "") -> str:
    """The general-ρ attention step (`benchmarks/rho_speed.py`): time of the anchored step per ρ and n."""
    raw = load(results, f"speed/{file}")
    rel = f"benchmarks/results/speed/{file}"
    parts = []
    for threads, clock, res in _rho_speed_tables(raw):
        lengths = sorted(res, key=int)
        ms = lambda cell: f"{1e3 * cell['time_s']:.1f} ms" if cell["time_s"] < 0.1 else f"{1e3 * cell['time_s']:.0f} ms"
        mib = lambda cell: "" if cell.get("peak_bytes") is None else f", {cell['peak_bytes'] / 2**20:,.0f} MiB"
        rows = []
        for step in ("forward", "forward+backward"):
            key = f"anchored/{step}"
            say = step.replace("+", " + ")
            for group in (("exp",), ("log",), ("lp", "truncated", "linear"), ("log (dense)",)):
                cells = []
                for n in lengths:
                    table = res[n][key]
                    if any(r not in table for r in group):
                        cells.append("–")
                        continue
                    big = int(n) >= 1024          # memory only where it is more than noise
                    if group == ("exp",):
                        cells.append(ms(table["exp"]) + (mib(table["exp"]) if big else ""))
                    else:
                        ratios = " / ".join(f"{table[r]['time_s'] / table['exp']['time_s']:.2f}×" for r in group)
                        cells.append(ratios + (mib(table[group[0]]) if big and len(group) == 1 else ""))
                if all(x == "–" for x in cells):
                    continue
                rows.append([f"{' / '.join(group)}, {say}"] + cells)
        rounds = raw["setting"].get("rounds")
        parts += [f"*`python benchmarks/rho_speed.py{flag} --json {rel}`* (anchored step, B = 1, "
                  f"d = {raw['setting']['d_model']}, {raw['setting']['heads']} heads, {raw['setting']['dtype']}, "
                  f"{threads}, {clock} over {rounds} rounds; exp: time, other rows: time / exp's; "
                  "peak memory above the input from n = 1,024)", "",
                  md(["step"] + [f"n = {int(n):,}" for n in lengths], rows)]
    return "\n".join(parts)


def rho_busy(results: Path) -> str:
    """The same step beside a busy process (`rho_speed.py --busy`: a single-thread matmul loop on one core)."""
    return rho_step(results, "rho_speed_busy.json", " --lengths 4096 --busy")


def rho_threads(results: Path) -> str:
    """Time at the most threads / time at the fewest of the anchored step per ρ, idle and beside a busy process."""
    cols, used = [], []
    for file, machine in (("rho_speed.json", "idle"), ("rho_speed_busy.json", "busy")):
        tables = _rho_speed_tables(load(results, f"speed/{file}"))    # [(threads, clock, {n: ...})], fewest first
        if len(tables) < 2:
            continue
        (few, _, a), (many, _, b) = tables[0], tables[-1]
        cols += [(f"n = {int(n):,}, {machine}", a[n], b[n]) for n in sorted(a, key=int)]
        used.append(file)
    if not cols:
        return "*no speed file holds two thread counts*\n"
    rows = []
    for step in ("forward", "forward+backward"):
        key = f"anchored/{step}"
        for rho in ("exp", "log", "lp", "truncated", "linear"):
            cells = [f"{b[key][rho]['time_s'] / a[key][rho]['time_s']:.2f}×" if rho in a.get(key, {}) else "–"
                     for _, a, b in cols]
            rows.append([f"{rho}, {step.replace('+', ' + ')}"] + cells)
    files = ", ".join(f"`{f}`" for f in used)
    return (f"*Time at {many} / time at {few}* (anchored step, B = 1, median wall time; {files}; "
            "below 1: the second thread helps)\n\n" + md(["step"] + [c[0] for c in cols], rows))


def rho_cost(results: Path) -> str:
    """Per ρ: the training step (`train_speed.py --rho`) and the attention step (`rho_speed.py`) against exp."""
    train = load(results, "speed/train_speed_rho.json")
    times = train["step_times_s"]
    lengths = list(times)
    med = lambda n, v: statistics.median(times[n][v])
    step = _rho_speed_tables(load(results, "speed/rho_speed.json"))[0]
    big = max(step[2], key=int)
    attn = {p: step[2][big][f"anchored/{p}"] for p in ("forward", "forward+backward")}
    rows = []
    for rho, name in mt.RHO_NAMES.items():
        cells = []
        for model in ("certified-tied", "certified-untied"):
            v = model if rho == "exp" else f"{model}:{rho}"
            cells.append(" / ".join(f"{med(n, v) / med(n, model):.2f}×" if v in times[n] else "–" for n in lengths))
        cells.append(" / ".join(f"{t[rho]['time_s'] / t['exp']['time_s']:.2f}×" if rho in t else "–"
                                for t in attn.values()))
        rows.append([name] + cells)
    rounds = train.get("rounds") or len(next(iter(times[lengths[0]].values())))
    clock = {"thread_time": "CPU thread time"}.get(train.get("clock"), train.get("clock")) or \
        "clock not recorded in the file (train_speed.py timed wall time when it was written)"
    n_say = " / ".join(lengths)
    return (f"*Time of ρ / time of exp* (training step: `python benchmarks/train_speed.py --rho log lp truncated "
            f"linear --json benchmarks/results/speed/train_speed_rho.json`, B = {train['batch_size']}, median of "
            f"{rounds} rounds, {threads_said(train, 'train_speed_rho.json')}, {clock}; attention step: "
            f"`python benchmarks/rho_speed.py`, anchored, n = {int(big):,}, {step[0]}, {step[1]})\n\n"
            + md(["ρ", f"training step, certified (tied), n = {n_say}", f"training step, certified (untied), "
                   f"n = {n_say}", f"attention step, n = {int(big):,}, forward / forward + backward"], rows))



def train_speed(results: Path) -> str:
    """The side-by-side training-step times (`benchmarks/train_speed.py`), one table per run file."""
    from train_speed import variant_name
    parts = []
    for fname, title in (("train_speed.json", "The accuracy benchmark's models and two variants"),
                         ("train_speed_2threads.json", "At PyTorch's default thread count"),
                         ("train_speed_peers_3.json", "With the peers, an earlier run")):
        if not (results / "speed" / fname).is_file():
            continue
        raw = json.loads((results / "speed" / fname).read_text())
        clock = "wall" if raw.get("clock") == "wall" else "CPU"
        times = raw["step_times_s"]
        lengths = list(times)
        rows = []
        for v in times[lengths[0]]:
            cells = []
            for n in lengths:
                med = statistics.median(times[n][v])
                cells += [f"{med:.3f}", f"{statistics.median(times[n]['standard']) / med:.2f}×"]
            rows.append([variant_name(v)] + cells)
        head = ["model"] + [h for n in lengths for h in (f"n = {n}: s/step ({clock})", f"n = {n}: vs standard")]
        load_avg = " – ".join(f"{x:.1f}" for x in raw["load_average"])
        parts += [f"*{title}* (`benchmarks/results/speed/{fname}`; {raw['rounds']} rounds, B = {raw['batch_size']}, "
                  f"{threads_said(raw, fname)}, load average {load_avg})", "", md(head, rows)]
    return "\n".join(parts)


_INFERENCE = ("certified-tied", "certified-untied", "certified-joint", "certified-joint-untied")


def _inference_medians(raw: dict) -> dict:
    return {n: {v: statistics.median(t) for v, t in cells.items()} for n, cells in raw["wall_times_s"].items()}


def inference_speed(results: Path, file: str = "inference_speed_1thread.json") -> str:
    """Plain inference (`benchmarks/inference_speed.py`): ms per batch and the ratio to the faster of the two
    standard paths at each n (above 1: the certified model is faster)."""
    raw = load(results, f"speed/{file}")
    med = _inference_medians(raw)
    lengths = list(med)
    fastest = {n: min(med[n]["standard (as built)"], med[n]["standard (fastest)"]) for n in lengths}
    rows = [["standard, faster of its two paths"] + [f"{1e3 * fastest[n]:.0f} ms" for n in lengths]]
    for v in _INFERENCE:
        if v in med[lengths[0]]:
            rows.append([mt.row_name((v, "exp", ()))] + [f"{1e3 * med[n][v]:.0f} ms, {fastest[n] / med[n][v]:.2f}×"
                                                       for n in lengths])
    flag = f" --threads {raw['threads']}" if "threads" in raw else ""
    which = ", ".join(f"n = {n}: {min(('standard (as built)', 'standard (fastest)'), key=lambda k: med[n][k])}"
                      for n in lengths)
    load_avg = " – ".join(f"{x:.1f}" for x in raw["load_average"])
    m = raw["model"]
    return (f"*`python benchmarks/inference_speed.py{flag} --rounds {raw['rounds']} --json "
            f"benchmarks/results/speed/{file}`* (B = {raw['batch_size']}, d = {m['d_model']}, depth {m['depth']}, "
            f"{m['n_heads']} heads, no energies; median wall time of {raw['rounds']} rounds, every model in turn in "
            f"one process, {threads_said(raw, file)}, load average {load_avg}; ratio: the faster standard path's "
            f"time / the model's, target ≥ 1.0× at n = 64 and 256; faster standard path {which})\n\n"
            + md(["model"] + [f"n = {int(n):,}" for n in lengths], rows))


def inference_speed_2threads(results: Path) -> str:
    return inference_speed(results, "inference_speed_2threads.json")


def inference_energies(results: Path) -> str:
    """What the energy curve costs at inference: time with `return_energies=True` / plain time, per model."""
    files = [f for f in ("inference_speed_1thread.json", "inference_speed_2threads.json")
             if (results / "speed" / f).is_file()]
    raws = {f: load(results, f"speed/{f}") for f in files}
    meds = {f: _inference_medians(raw) for f, raw in raws.items()}
    threads = {f: raw.get("threads", "?") for f, raw in raws.items()}
    cols = [(f, n) for f in files for n in meds[f]]
    rows = []
    for v in _INFERENCE:
        if all(f"{v} + energies" in meds[f][n] for f, n in cols):
            rows.append([mt.row_name((v, "exp", ()))] + [f"{meds[f][n][v + ' + energies'] / meds[f][n][v]:.2f}×"
                                                       for f, n in cols])
    return ("*Inference with the energy curve / plain inference* (same files and rounds as above; target for the "
            "joint layer ≤ 1.15×)\n\n"
            + md(["model"] + [f"n = {int(n):,}, {threads[f]} thr." for f, n in cols], rows))


def scaling(results: Path) -> str:
    """Time and peak memory against n (`benchmarks/scaling.py`): one table each, then the fitted exponents."""
    raw = json.loads((results / "speed" / "scaling.json").read_text())
    lengths = sorted({p["n"] for pts in raw["points"].values() for p in pts})[-7:]
    out = []
    for title, cell in (("CPU time (s)", lambda p: f"{p['time_s']:.3g}"),
                        ("peak memory above the inputs (MiB)", lambda p: f"{p['peak_bytes'] / 2**20:.0f}")):
        rows = []
        for series, pts in raw["points"].items():
            by_n = {p["n"]: p for p in pts}
            rows.append([series] + [cell(by_n[n]) if n in by_n else "–" for n in lengths])
        out += [f"*{title}*", "", md(["series"] + [f"n = {n:,}" for n in lengths], rows)]
    fmt = lambda v: "–" if v is None else f"{v:.2f}"
    out += ["*Log-log slopes over n ≥ 1,024*", "",
            md(["series", "time exponent", "memory exponent"],
                [[s, fmt(e["time"]), fmt(e["memory"])] for s, e in raw["exponents"].items()])]
    return "\n".join(out)


def profiles_shared_machine(results: Path) -> str:
    """`profiles` of the cells of `shared_machine.py` (`profile_misses.py --cases 'shared-*'`), idle and beside a
    busy process (`--busy`)."""
    return "\n\n".join(profiles(results, f"speed/profile_shared_machine{suffix}.json", f" --cases 'shared-*'{flag}")
                       for suffix, flag in (("", ""), ("_busy", " --busy")))


def profiles(results: Path, rel: str = "speed/profile_misses.json", cases: str = "") -> str:
    """Where the time of each missed speed target goes (`benchmarks/profile_misses.py --json`): per case and
    variant, wall time per call at each thread count and the operators with the most self CPU time."""
    raw = load(results, rel)
    rows = []
    for case in raw["cases"].values():
        for variant, by_threads in case["variants"].items():
            for t, prof in by_threads.items():
                ops = "; ".join(f"`{o['op']}` {100 * o['share']:.0f} %" for o in prof["top"][:3])
                rows.append([case["what"], variant, t, f"{prof['wall_ms']:.1f}", ops])
    return (f"*`python benchmarks/profile_misses.py{cases} --calls {raw['calls']} --json "
            f"benchmarks/results/{rel}`* (torch.profiler, wall time per call with the profiler "
            f"on; {'beside one busy process; ' if raw.get('load') == 'busy' else ''}"
            f"1-minute load average {raw['load_avg_start']:.1f} at the start, {raw['load_avg_end']:.1f} at "
            "the end" + ("; the blocked kernel's worker threads are not seen by the profiler, so at 2 threads ρ ≠ exp "
                         "shows as `_KernelSums` / `_KernelSumsBackward`" if not cases else "") + ")\n\n"
            + md(["case", "variant", "threads", "ms per call", "top operators (share of self CPU time)"], rows))


def compile_speed(results: Path) -> str:
    """`torch.compile` on the certified-joint classifier (`benchmarks/compile_speed.py --json`), one file per
    thread count: eager and compiled medians, the speed-up and the first (compiling) call, per n and pass."""
    files = [f"speed/compile_speed_joint_{t}.json" for t in ("1thread", "2threads")]
    rows, breaks, said = [], set(), []
    for rel in files:
        raw = load(results, rel)
        said.append(f"{raw['rounds']} rounds at {threads_said(raw, rel)}, 1-minute load "
                    f"{raw['load'][0]:.1f} → {raw['load'][1]:.1f}")
        breaks.add(raw["results"]["graph_breaks"]["count"])
        for n, by_pass in raw["results"].items():
            if n == "graph_breaks":
                continue
            for mode, r in by_pass.items():
                med = r["median_s"]
                rows.append([f"{int(n):,}", mode, str(raw.get("threads", "?")), f"{1e3 * med['eager']:.1f}",
                             f"{1e3 * med['compiled']:.1f}", f"{r['speedup']:.2f}×",
                             f"{r['first_compiled_call_s']:.0f}"])
    kind = load(results, files[0])["kind"]
    return (f"*`python benchmarks/compile_speed.py --kind {kind} --count-breaks --threads T --json "
            "benchmarks/results/speed/compile_speed_joint_{1thread,2threads}.json`* (B = 32, width 128, depth 6, "
            f"torch {load(results, files[0])['torch']}, inductor; eager and compiled alternated on fresh batches, "
            f"medians of wall time; {'; '.join(said)}; graph breaks in the eval forward: "
            f"{', '.join(map(str, sorted(breaks)))})\n\n"
            + md(["n", "pass", "threads", "eager (ms)", "compiled (ms)", "speed-up", "first compiled call (s)"], rows))
