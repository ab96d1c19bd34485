"""Speed in the conditions users have: torch imported first, 1 and 2 threads, idle and beside a busy process.

Every cell runs in a fresh Python process that imports torch *before* unfoldformer (as the README's examples
and most user scripts do, so the library cannot set OpenMP's wait policy before the runtime starts), sets the
thread count, warms up, and reports the median wall time of its repeats. The cells of one condition run one
after another with the variants alternated (standard, tied, untied, standard, …); each condition (threads ×
load) is measured idle and beside one busy single-thread process (a Python loop that never sleeps, started
before and killed after the condition's cells, the everyday state of a laptop or a shared server).

Variants (`--variants`, alternated cell by cell like the models, so a slow spell of the machine spreads over them):
`torch-first` (the default and the main table); `unfoldformer-first` imports the library before torch (as the
command line does), which must change nothing (no import-order trap: the library leaves OpenMP's settings alone);
`step-region` is `torch-first` with the whole training step (loss, backward, optimiser) inside
`unfoldformer.threads.free_core_threads()`, as the library's own training loops run it (training cells only).

Cells:
- `inference` / `train`: a 4-layer encoder, 4 heads, FFN 4·width, on (B, n, width) float32 with no padding:
  `standard` — `nn.TransformerEncoder` (pre-LN, ReLU, dropout 0, final LayerNorm) in its fastest path (eval
  mode under `torch.inference_mode`: PyTorch's fused encoder-layer kernel; training: the module graph, SDPA
  inside); `joint-tied` / `joint-untied` — `uf.CertifiedEncoder(uf.CertifiedEncoderLayer(...), 4, tied=...,
  norm=LayerNorm)`, the joint layer. A training step is forward, mean-square loss, backward, AdamW step.
- `energy`: the attention energy (ρ = exp, float64, one head with a d × d map) of one padded batch of 30
  sequences with IMDB-like lengths (longest 2,500, d = 300: `energy_speed.py` (b)), and, in the same process,
  the per-sample pair-difference reference of `energy_speed.py` on the same sequences: the ratio is the
  issue's ≥ 50× target.

    python benchmarks/shared_machine.py run [--quick] [--processes K] [--shapes 64,16,64 ...] [--json FILE]
                                            [--variants torch-first unfoldformer-first step-region]
    python benchmarks/shared_machine.py table [--json FILE]              # the markdown table
    python benchmarks/shared_machine.py cell --what inference --model joint-tied --shape 64 16 64 --threads 2
    python benchmarks/shared_machine.py alternate --what inference --model joint-untied [--busy] [--json FILE]

`alternate` is a diagnosis, not a cell: in one fresh process (torch first) it alternates the caller's thread count
between 1 and 2 call by call, so a difference between the 1- and 2-thread cells that comes from the process (where
it runs, its memory) and not from the thread count shows as equal medians here.
"""
from __future__ import annotations

import argparse
import contextlib
import functools
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent
RESULTS = ROOT / "results" / "speed" / "shared_machine.json"
SHAPES = [(64, 16, 64), (32, 64, 128), (8, 256, 256), (1, 4096, 128)]
MODELS = ("standard", "joint-tied", "joint-untied")
THREADS = (1, 2)
LOADS = ("idle", "busy")
DEPTH, HEADS = 4, 4


# ----------------------------------------------------------------------------- one cell (a fresh process)
def _encoder(model: str, d: int):
    import torch
    from torch import nn

    import unfoldformer as uf
    torch.manual_seed(0)
    if model == "standard":
        layer = nn.TransformerEncoderLayer(d, HEADS, 4 * d, dropout=0.0, batch_first=True, norm_first=True)
        return nn.TransformerEncoder(layer, DEPTH, norm=nn.LayerNorm(d), enable_nested_tensor=False)
    layer = uf.CertifiedEncoderLayer(d, HEADS, 4 * d)
    return uf.CertifiedEncoder(layer, DEPTH, tied=model == "joint-tied", norm=nn.LayerNorm(d))


def _timed(fn, repeats: int, budget_s: float = 4.0) -> list[float]:
    times = []
    start = time.perf_counter()
    while len(times) < repeats or (len(times) < 3 * repeats and time.perf_counter() - start < budget_s):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return times


def make_step(what: str, model: str, shape: tuple[int, int, int], step_region: bool = False):
    """The timed call of an `inference` or `train` cell: a zero-argument function (also `profile_misses.py`'s).
    `step_region`: the training step runs inside `free_core_threads()` (the library's training loops)."""
    import torch

    from unfoldformer.threads import free_core_threads

    B, n, d = shape
    enc = _encoder(model, d)
    x = torch.randn(B, n, d)
    if what == "inference":
        enc.eval()

        def step():
            with torch.inference_mode():
                enc(x)
    else:
        enc.train()
        opt = torch.optim.AdamW(enc.parameters(), lr=1e-4)

        def step():
            opt.zero_grad(set_to_none=True)
            enc(x).square().mean().backward()
            opt.step()

        if step_region:
            user_step = step

            def step():
                with free_core_threads():
                    user_step()
    return step


ORDERS = ("torch-first", "unfoldformer-first")
VARIANTS = (*ORDERS, "step-region")           # step-region: torch first, the training step in the thread region


def cell(what: str, model: str, shape: tuple[int, int, int], threads: int, repeats: int,
         order: str = "torch-first", step_region: bool = False) -> dict:
    import importlib
    for name in ("torch", "unfoldformer") if order == "torch-first" else ("unfoldformer", "torch"):
        importlib.import_module(name)                               # torch first, as most user scripts import it
    import torch
    torch.set_num_threads(threads)
    if what == "energy":
        return _energy_cell(repeats)
    step = make_step(what, model, shape, step_region)
    for _ in range(2):
        step()
    faults = _minor_faults()
    times = _timed(step, repeats)
    faults = None if faults is None else (_minor_faults() - faults) / len(times)
    return {"median_s": statistics.median(times), "repeats": len(times), "minor_faults_per_call": faults}


def _minor_faults() -> int | None:
    """This process's minor page faults so far (None where `resource` is missing: Windows)."""
    try:
        import resource
    except ImportError:
        return None
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt


@functools.cache
def _energy_batch():
    """The energy cell's sequences, their padded batch (30, 2,500, 300), its mask and the map F (built once)."""
    import torch

    from energy_speed import imdb_like_lengths, padded
    torch.manual_seed(0)
    d = 300
    seqs = [torch.randn(k, d, dtype=torch.float64) * 0.3 for k in imdb_like_lengths(200)[:30]]
    F = torch.randn(d, d, dtype=torch.float64) / d ** 0.5
    return (seqs, *padded(seqs), F)


def _energy_call() -> None:
    """One call of the library's energy on the energy cell's padded batch."""
    from unfoldformer.energy import attention_energy
    _, Y, pad, F = _energy_batch()
    attention_energy(Y, F, "exp", pad)


def _energy_cell(repeats: int) -> dict:
    from energy_speed import pairwise_reference
    from unfoldformer.energy import attention_energy
    seqs, Y, pad, F = _energy_batch()
    attention_energy(Y[:2, :256], F, "exp", pad[:2, :256])          # warm-up
    times = _timed(_energy_call, repeats, budget_s=0.0)
    t0 = time.perf_counter()
    for y in seqs:
        pairwise_reference(y, F)
    reference = time.perf_counter() - t0
    library = statistics.median(times)
    return {"median_s": library, "repeats": len(times), "reference_s": reference, "ratio": reference / library}


def alternate(what: str, model: str, shape: tuple[int, int, int], rounds: int) -> dict:
    """Median wall time of the caller at 1 and at 2 threads, alternated call by call in this process."""
    import torch

    import unfoldformer  # noqa: F401
    torch.set_num_threads(2)
    step = _energy_call if what == "energy" else make_step(what, model, shape)
    for _ in range(2):
        step()
    times = {1: [], 2: []}
    for _ in range(rounds):
        for threads in (1, 2):
            torch.set_num_threads(threads)
            t0 = time.perf_counter()
            step()
            times[threads].append(time.perf_counter() - t0)
    return {str(k): statistics.median(v) for k, v in times.items()}


# ----------------------------------------------------------------------------- the conditions
@contextlib.contextmanager
def _beside_busy(busy: bool):
    """The body beside one busy single-thread process (started half a second before it), or alone."""
    if not busy:
        yield
        return
    proc = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        time.sleep(0.5)
        yield
    finally:
        proc.kill()
        proc.wait()


def cell_env(drop: tuple[str, ...] = (), **extra: str) -> dict:
    """The environment of a cell's process: this one's without the thread settings (and `drop`), plus `extra`."""
    unset = ("OMP_WAIT_POLICY", "OMP_NUM_THREADS", "MKL_NUM_THREADS", *drop)
    return {**{k: v for k, v in os.environ.items() if k not in unset}, **extra}


def _run_cell(what, model, shape, threads, repeats=7, variant="torch-first", env: dict | None = None) -> dict:
    """One cell in a fresh process (`cell`), in `env` (default: `cell_env()`): its result."""
    order = "torch-first" if variant == "step-region" else variant
    cmd = [sys.executable, str(Path(__file__)), "cell", "--what", what, "--model", model,
           "--shape", *map(str, shape), "--threads", str(threads), "--repeats", str(repeats), "--order", order,
           *(["--step-region"] if variant == "step-region" else [])]
    out = subprocess.run(cmd, check=True, capture_output=True, text=True, env=cell_env() if env is None else env,
                         cwd=ROOT)
    return json.loads(out.stdout.strip().splitlines()[-1])


def run(quick: bool, out: Path, shapes=SHAPES, energy: bool = True, processes: int = 1,
        variants: tuple[str, ...] = ("torch-first",)) -> dict:
    """Every cell of every condition, each the median over `processes` fresh processes (rounds: each round runs
    every cell once, the models and variants alternating within a shape, so a slow spell of the machine spreads
    over them); the file is rewritten whole after each process, and a rerun continues where it stopped (a file
    measured with other variants is refused, not mixed)."""
    from tqdm import tqdm
    repeats = 3 if quick else 7
    cells = [(w, m, s, v) for s in shapes for w in ("inference", "train") for m in MODELS for v in variants
             if not (v == "step-region" and w != "train")]        # the region changes only the training step
    if energy:
        cells += [("energy", "library", (30, 2500, 300), v) for v in variants if v != "step-region"]
    results = json.loads(out.read_text()) if out.exists() else {"cells": []}
    found = results.get("variants", ["torch-first"])
    if results["cells"] and found != list(variants):
        raise SystemExit(f"{out} was measured with variants {found}, not {list(variants)}: pass another --json")
    results["variants"] = list(variants)
    for c in results["cells"]:                                      # cells measured before --processes: one each
        c.setdefault("process_medians", [c["median_s"]])
        c["variant"] = _variant(c)
    index = {_key(c): c for c in results["cells"]}
    bar = tqdm(total=len(LOADS) * len(THREADS) * len(cells) * processes, desc="processes")
    for load in LOADS:
        with _beside_busy(load == "busy"):
            for threads in THREADS:
                for round_ in range(processes):
                    for what, model, shape, variant in cells:       # models, variants alternate in a shape
                        bar.update()
                        key = (load, threads, what, model, tuple(shape), variant)
                        cell = index.get(key)
                        if cell is not None and len(cell["process_medians"]) > round_:
                            continue
                        r = _run_cell(what, model, shape, threads, repeats, variant)
                        if cell is None:
                            cell = index[key] = {"load": load, "threads": threads, "what": what, "model": model,
                                                 "shape": list(shape), "variant": variant, "process_medians": []}
                            results["cells"].append(cell)
                        cell["process_medians"].append(r["median_s"])
                        cell.update(r, median_s=statistics.median(cell["process_medians"]), loadavg=os.getloadavg()[0])
                        if "reference_s" in r:                      # the energy's ratio to the cell's median
                            cell["ratio"] = r["reference_s"] / cell["median_s"]
                        _write(out, results)                        # whole file each time: a kill loses one process
    bar.close()
    return results


def _variant(c: dict) -> str:
    """A cell's variant; cells measured before `--variants` are torch-first."""
    return c.get("variant", "torch-first")


def _key(c: dict) -> tuple:
    return c["load"], c["threads"], c["what"], c["model"], tuple(c["shape"]), _variant(c)


def _write(path: Path, data: dict) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(data, indent=1) + "\n")
    os.replace(tmp, path)


# ----------------------------------------------------------------------------- the table
def _ms_ratio(cell: dict, standard: dict) -> str:
    return f"{1e3 * cell['median_s']:.1f} ({standard['median_s'] / cell['median_s']:.2f}×)"


def _scaling(one: dict | None, two: dict | None) -> str:
    """1-thread time over 2-thread time (> 1: the second thread helps)."""
    return f"{one['median_s'] / two['median_s']:.2f}×" if one and two else ""


def table(results: dict) -> str:
    """Three markdown tables: times and ratios against the standard encoder, 2-thread over 1-thread speed, the
    padded-batch energy against its pair-difference reference."""
    cells = {(c["load"], c["threads"], c["what"], c["model"], tuple(c["shape"])): c for c in results["cells"]
             if _variant(c) == "torch-first"}
    shapes = sorted({k[4] for k in cells if k[2] != "energy"}, key=lambda s: s[1] * s[2])
    rows = [(load, what, shape) for load in LOADS for what in ("inference", "train") for shape in shapes]
    ratios = ["| load | what | shape (B, n, d) | threads | standard ms | joint tied ms (×) | joint untied ms (×) |",
              "|---" * 7 + "|"]
    scaling = ["| load | what | shape (B, n, d) | standard: 1 thread / 2 threads | joint tied | joint untied |",
               "|---" * 6 + "|"]
    for load, what, shape in rows:
        for threads in THREADS:
            std, tied, untied = (cells.get((load, threads, what, m, shape)) for m in MODELS)
            if std and tied and untied:
                ratios.append(f"| {load} | {what} | {', '.join(map(str, shape))} | {threads} | "
                              f"{1e3 * std['median_s']:.1f} | {_ms_ratio(tied, std)} | {_ms_ratio(untied, std)} |")
        scale = [_scaling(cells.get((load, 1, what, m, shape)), cells.get((load, 2, what, m, shape))) for m in MODELS]
        if all(scale):
            scaling.append(f"| {load} | {what} | {', '.join(map(str, shape))} | {' | '.join(scale)} |")
    lines = ratios + ["", "Speed-up from the second thread (> 1×: faster at 2 threads):", ""] + scaling
    energy = [c for c in results["cells"] if c["what"] == "energy" and _variant(c) == "torch-first"]
    if energy:
        lines += ["", "| load | threads | padded-batch energy s | pair-difference reference s | ratio |",
                  "|---|---|---|---|---|"]
        for c in sorted(energy, key=lambda c: (LOADS.index(c["load"]), c["threads"])):
            lines.append(f"| {c['load']} | {c['threads']} | {c['median_s']:.3f} | {c['reference_s']:.1f} | "
                         f"{c['ratio']:.0f}× |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="command", required=True)
    c = sub.add_parser("cell")
    c.add_argument("--what", choices=("inference", "train", "energy"), required=True)
    c.add_argument("--model", default="standard")
    c.add_argument("--shape", type=int, nargs=3, default=(64, 16, 64))
    c.add_argument("--threads", type=int, default=1)
    c.add_argument("--repeats", type=int, default=7)
    c.add_argument("--order", choices=ORDERS, default="torch-first")
    c.add_argument("--step-region", action="store_true")
    r = sub.add_parser("run")
    r.add_argument("--quick", action="store_true", help="3 repeats per cell instead of 7")
    r.add_argument("--no-energy", action="store_true")
    r.add_argument("--processes", type=int, default=1, help="fresh processes per cell (their median is the cell)")
    r.add_argument("--shapes", nargs="+", default=None, metavar="B,N,D", help="only these shapes (default: all)")
    r.add_argument("--json", type=Path, default=RESULTS)
    r.add_argument("--variants", nargs="+", choices=VARIANTS, default=["torch-first"],
                   help="alternated cell by cell (module doc); the table shows torch-first")
    a = sub.add_parser("alternate")
    a.add_argument("--what", choices=("inference", "train", "energy"), required=True)
    a.add_argument("--model", default="joint-untied")
    a.add_argument("--shape", type=int, nargs=3, default=(64, 16, 64))
    a.add_argument("--rounds", type=int, default=40)
    a.add_argument("--busy", action="store_true", help="beside one busy single-thread process")
    a.add_argument("--json", type=Path, default=None, help="append the result to this file's list")
    t = sub.add_parser("table")
    t.add_argument("--json", type=Path, default=RESULTS)
    args = p.parse_args(argv)
    if args.command == "cell":
        print(json.dumps(cell(args.what, args.model, tuple(args.shape), args.threads, args.repeats, args.order,
                              args.step_region)))
    elif args.command == "alternate":
        with _beside_busy(args.busy):
            medians = alternate(args.what, args.model, tuple(args.shape), args.rounds)
        model, shape = ("library", [30, 2500, 300]) if args.what == "energy" else (args.model, list(args.shape))
        record = {"what": args.what, "model": model, "shape": shape, "busy": args.busy,
                  "rounds": args.rounds, "median_s": medians, "loadavg": os.getloadavg()[0]}
        print(json.dumps(record))
        if args.json is not None:
            old = json.loads(args.json.read_text()) if args.json.exists() else []
            _write(args.json, old + [record])
    elif args.command == "run":
        shapes = SHAPES if args.shapes is None else [tuple(int(v) for v in item.split(",")) for item in args.shapes]
        print(table(run(args.quick, args.json, shapes, energy=not args.no_energy, processes=args.processes,
                        variants=tuple(args.variants))))
    else:
        print(table(json.loads(args.json.read_text())))


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))
    main()
