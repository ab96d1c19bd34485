"""Page faults at the smallest shape: inference cells of `shared_machine.py` with glibc's default allocator settings and
with freed memory kept in the process, alternated in fresh processes.

glibc's malloc serves large blocks by mmap and trims the top of its heap once more than a threshold is free there, so
a block freed at the end of one forward may go back to the kernel and come back as fresh pages, one minor page fault
per 4 KiB, in the next. `kept` sets `MALLOC_MMAP_THRESHOLD_` and `MALLOC_TRIM_THRESHOLD_` to 1 GiB for the cell's
process (glibc's documented tunables; PyTorch's CPU tuning guide gives the same advice through jemalloc or
tcmalloc), so freed blocks stay in the heap. Each process reports its median wall time and its minor page faults per
call (`shared_machine.py cell`).

    python benchmarks/malloc_faults.py [--models standard joint-tied joint-untied] [--threads 1] [--processes 5]
                                       [--json FILE]
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent
sys.path.insert(0, str(ROOT))
import shared_machine as sm  # noqa: E402  (same folder)

RESULTS = ROOT / "results" / "speed" / "malloc_faults.json"
KEPT = {"MALLOC_MMAP_THRESHOLD_": str(1 << 30), "MALLOC_TRIM_THRESHOLD_": str(1 << 30)}
SETTINGS = ("default", "kept")


def _cell(model: str, threads: int, setting: str) -> dict:
    env = sm.cell_env(drop=tuple(KEPT), **(KEPT if setting == "kept" else {}))
    return sm._run_cell("inference", model, (64, 16, 64), threads, env=env)


def measure(models, threads, processes: int, out: Path) -> dict:
    """Every cell `processes` times, the file rewritten whole after each process; a rerun with the same settings
    continues where it stopped, a file measured with other settings is refused."""
    from tqdm import tqdm
    settings = {"shape": [64, 16, 64], "what": "inference", "kept": KEPT}
    results = json.loads(out.read_text()) if out.exists() else {**settings, "cells": {}}
    if any(results.get(k) != v for k, v in settings.items()):
        raise SystemExit(f"{out} was measured with other settings: pass another --json")
    bar = tqdm(total=processes * len(models) * len(threads) * len(SETTINGS), desc="processes")
    for round_ in range(processes):
        for t in threads:
            for model in models:
                for setting in SETTINGS:                             # alternated process by process
                    bar.update()
                    entry = results["cells"].setdefault(f"{model} {t} {setting}", {"median_s": [], "faults": []})
                    if len(entry["median_s"]) > round_:
                        continue
                    r = _cell(model, t, setting)
                    entry["median_s"].append(r["median_s"])
                    entry["faults"].append(r["minor_faults_per_call"])
                    sm._write(out, results)                         # whole file each time: a kill loses one process
    bar.close()
    return results


def table(results: dict) -> str:
    lines = ["| model | threads | default ms | default faults per call | kept ms | kept faults per call |",
             "|---|---|---|---|---|---|"]
    keys = sorted({k.rsplit(" ", 1)[0] for k in results["cells"]}, key=lambda k: (k.split()[1], sm.MODELS.index(
        k.split()[0])))
    for key in keys:
        cells = [results["cells"].get(f"{key} {s}") for s in SETTINGS]
        if all(cells):
            model, threads = key.split()
            values = []
            for c in cells:
                values += [f"{1e3 * statistics.median(c['median_s']):.1f}",
                           f"{statistics.median(c['faults']):.0f} ({min(c['faults']):.0f}–{max(c['faults']):.0f})"]
            lines.append(f"| {model} | {threads} | " + " | ".join(values) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--models", nargs="+", choices=sm.MODELS, default=list(sm.MODELS))
    p.add_argument("--threads", type=int, nargs="+", default=[1])
    p.add_argument("--processes", type=int, default=5)
    p.add_argument("--json", type=Path, default=RESULTS)
    p.add_argument("--table", action="store_true", help="print the table of --json and stop")
    args = p.parse_args(argv)
    if args.table:
        print(table(json.loads(args.json.read_text())))
        return
    print(table(measure(args.models, args.threads, args.processes, args.json)))


if __name__ == "__main__":
    main()
