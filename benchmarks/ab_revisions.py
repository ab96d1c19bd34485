"""A speed change, measured: cells of `shared_machine.py` run with an earlier revision's `src` and the working tree's,
alternated in fresh processes.

    python benchmarks/ab_revisions.py --base REV [--what inference train] [--models joint-tied joint-untied]
                                      [--shape 64 16 64] [--threads 1 2] [--processes 5] [--busy] --json FILE
    python benchmarks/ab_revisions.py --table --json FILE

The base's `src` is exported with `git archive` into a temporary folder and put first on PYTHONPATH for its processes
(checked: each side reports which `unfoldformer` it imported), so both sides run this checkout's benchmark code on
their own library. Each process is one `shared_machine.py cell` (torch imported first, warm-up, median of its
repeats); within a round every cell runs base then new, and the cells follow one another, so a slow spell of the
machine falls on both sides. The file is rewritten whole after each process; a rerun with the same settings continues
where it stopped, and a file measured with other settings is refused.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent
REPO = ROOT.parent
sys.path.insert(0, str(ROOT))
import shared_machine as sm  # noqa: E402  (same folder)

SIDES = ("base", "new")


def _export(rev: str, into: Path) -> tuple[str, Path]:
    """`rev`'s full commit and its `src` folder, exported under `into`."""
    commit = subprocess.run(["git", "rev-parse", "--verify", f"{rev}^{{commit}}"], cwd=REPO, check=True,
                            capture_output=True, text=True).stdout.strip()
    archive = subprocess.run(["git", "archive", commit, "src"], cwd=REPO, check=True, capture_output=True).stdout
    subprocess.run(["tar", "-x", "-C", str(into)], input=archive, check=True)
    return commit, into / "src"


def _env(src: Path | None) -> dict:
    """A cell's environment (`shared_machine.cell_env`), with `src` first on PYTHONPATH (None: the installed tree)."""
    if src is None:
        return sm.cell_env()
    return sm.cell_env(PYTHONPATH=os.pathsep.join([str(src), *filter(None, [os.environ.get("PYTHONPATH")])]))


def _imported(env: dict) -> Path:
    out = subprocess.run([sys.executable, "-c", "import unfoldformer; print(unfoldformer.__file__)"], env=env,
                         check=True, capture_output=True, text=True, cwd=ROOT)
    return Path(out.stdout.strip()).resolve()


def _cell(what: str, model: str, shape, threads: int, env: dict) -> float:
    return sm._run_cell(what, model, shape, threads, env=env)["median_s"]


def measure(args) -> dict:
    from tqdm import tqdm
    settings = {"what": args.what, "models": args.models, "shape": args.shape, "threads": args.threads,
                "busy": args.busy}
    results = json.loads(args.json.read_text()) if args.json.exists() else {}
    with tempfile.TemporaryDirectory() as tmp:
        commit, base_src = _export(args.base, Path(tmp))
        found = {k: results.get(k) for k in (*settings, "base_commit")}
        if results and found != {**settings, "base_commit": commit}:
            raise SystemExit(f"{args.json} was measured with other settings ({found}): pass another --json")
        envs = {"base": _env(base_src), "new": _env(None)}
        where = {side: _imported(env) for side, env in envs.items()}
        if not where["base"].is_relative_to(base_src.resolve()) or where["new"].is_relative_to(Path(tmp).resolve()):
            raise SystemExit(f"the sides import the wrong library: {where}")
        head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=REPO, capture_output=True, text=True).stdout.strip()
        dirty = bool(subprocess.run(["git", "status", "--porcelain", "--", "src"], cwd=REPO,
                                    capture_output=True, text=True).stdout.strip())
        results.update(settings, base_commit=commit, new=f"{head}{' + uncommitted src' if dirty else ''}",
                       seconds="median wall time of one process's repeats (shared_machine.py cell)")
        results.setdefault("cells", {})
        cells = [(w, m, t) for t in args.threads for w in args.what for m in args.models]
        bar = tqdm(total=len(cells) * args.processes * 2, desc="processes")
        with sm._beside_busy(args.busy):
            for round_ in range(args.processes):
                for what, model, threads in cells:
                    entry = results["cells"].setdefault(f"{what} {model} {threads}", {"base": [], "new": []})
                    for side in SIDES:
                        bar.update()
                        if len(entry[side]) > round_:
                            continue
                        entry[side].append(_cell(what, model, args.shape, threads, envs[side]))
                        sm._write(args.json, results)               # whole file each time: a kill loses one process
        bar.close()
    return results


def table(results: dict) -> str:
    lines = ["| cell (what, model, threads) | processes | base ms (median) | new ms (median) | new / base |",
             "|---|---|---|---|---|"]
    for name, entry in results["cells"].items():
        k = min(len(entry["base"]), len(entry["new"]))
        if k:
            base, new = statistics.median(entry["base"][:k]), statistics.median(entry["new"][:k])
            lines.append(f"| {name} | {k} | {1e3 * base:.2f} | {1e3 * new:.2f} | {new / base:.2f}× |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--base", help="the earlier revision (any git revision)")
    p.add_argument("--what", nargs="+", choices=("inference", "train"), default=["inference", "train"])
    p.add_argument("--models", nargs="+", choices=sm.MODELS, default=["joint-tied", "joint-untied"])
    p.add_argument("--shape", type=int, nargs=3, default=[64, 16, 64])
    p.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    p.add_argument("--processes", type=int, default=5, help="fresh processes per cell and side")
    p.add_argument("--busy", action="store_true", help="beside one busy single-thread process")
    p.add_argument("--json", type=Path, required=True)
    p.add_argument("--table", action="store_true", help="print the table of --json and stop")
    args = p.parse_args(argv)
    if args.table:
        print(table(json.loads(args.json.read_text())))
        return
    if args.base is None:
        p.error("--base is required to measure")
    print(table(measure(args)))


if __name__ == "__main__":
    main()
