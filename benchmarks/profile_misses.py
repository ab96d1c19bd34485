"""Profiles of the speed targets that were missed: where the time of the slower variant goes, op by op.

Each case runs two variants side by side (the one that misses its target and the one it is compared
with) under `torch.profiler` at every thread count of `--threads`, after a warm-up, and keeps the
operators with the largest self CPU time (summed over every thread the profiler saw, so a blocked
kernel's worker threads count too), with the wall time of the profiled calls:

- `lp-4096`: the anchored attention step, forward + backward, ρ = lp (the blocked kernel) against exp
  (fused), B = 1, n = 4,096, d = 128, 4 heads (target: ρ ≠ exp within 2.5× of exp);
- `small-n`: the same step for ρ = truncated and exp at n = 64 (target: 2 threads at least as fast as 1);
- `joint-untied-64`: certified-joint-untied against the fastest standard eval path, B = 32, n = 64
  (target: ≥ 1.0×);
- `energies-joint-256`: certified-joint with its energy curve against its plain forward, B = 32,
  n = 256 (target: ≤ 1.15×);
- `shared-<what>-<B>x<n>x<d>`: a cell of `shared_machine.py` (inference or a training step of its 4-layer encoders,
  the same construction): `nn.TransformerEncoder`'s fastest path, certified joint tied and untied (target: ≥ 1.0×).

    python benchmarks/profile_misses.py [--cases NAME|PATTERN ...] [--threads 1 2] [--calls 5] [--busy] [--json FILE]
"""
from __future__ import annotations

# isort: off
import unfoldformer  # noqa: F401  (first, as the command line imports it; it leaves OpenMP's settings alone)
# isort: on
import argparse
import fnmatch
import os
import sys
import time
from collections import defaultdict
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile

sys.path.insert(0, str(Path(__file__).resolve().parent))
import inference_speed as inf  # noqa: E402  (same folder)
import rho_speed as rs  # noqa: E402
import shared_machine as sm  # noqa: E402
from unfoldformer.utils import environment, write_json  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results" / "speed" / "profile_misses.json"
TOP = 8


def _cases() -> dict:
    """case -> (what it checks, {variant: zero-argument call})."""
    out = {
        "lp-4096": ("anchored step fwd+bwd, B 1, n 4,096: lp vs exp",
                    {"lp": rs.make_call("anchored", "lp", True, 4096),
                     "exp": rs.make_call("anchored", "exp", True, 4096)}),
        "small-n": ("anchored step fwd+bwd, B 1, n 64: truncated and exp",
                    {"truncated": rs.make_call("anchored", "truncated", True, 64),
                     "exp": rs.make_call("anchored", "exp", True, 64)}),
    }
    runs = inf.variants(inf._Table())
    batches = {n: inf.make_batch(32, n, seed=0)[:2] for n in (64, 256)}

    def infer(name: str, n: int):
        ids, mask = batches[n]

        def call() -> None:
            with torch.inference_mode():
                runs[name](ids, mask)
        return call
    out["joint-untied-64"] = ("inference, B 32, n 64: certified-joint-untied vs standard (fastest)",
                              {"certified-joint-untied": infer("certified-joint-untied", 64),
                               "standard (fastest)": infer("standard (fastest)", 64)})
    out["energies-joint-256"] = ("inference, B 32, n 256: certified-joint with energies vs plain",
                                 {"certified-joint + energies": infer("certified-joint + energies", 256),
                                  "certified-joint": infer("certified-joint", 256)})
    for what in ("inference", "train"):
        for shape in sm.SHAPES:
            out[f"shared-{what}-{'x'.join(map(str, shape))}"] = (
                f"shared_machine {what}, (B, n, d) = {shape}: standard (fastest) vs certified joint",
                {model: _lazy(sm.make_step, what, model, shape) for model in sm.MODELS})
    return out


def _lazy(make, *args):
    """A call built at its first use (a case's models are built only when that case runs)."""
    built = []

    def call() -> None:
        if not built:
            built.append(make(*args))
        built[0]()
    return call


def profile_call(call, calls: int) -> dict:
    """Wall time per call and the top operators by self CPU time (ms per call, share of their sum)."""
    for _ in range(2):
        call()
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        t0 = time.perf_counter()
        for _ in range(calls):
            call()
        wall = (time.perf_counter() - t0) / calls
    self_us: dict[str, float] = defaultdict(float)
    for evt in prof.key_averages():
        self_us[evt.key] += evt.self_cpu_time_total
    total = sum(self_us.values())
    top = sorted(self_us.items(), key=lambda kv: -kv[1])[:TOP]
    return {"wall_ms": 1e3 * wall, "self_cpu_ms": 1e-3 * total / calls,
            "top": [{"op": k, "self_ms": 1e-3 * v / calls, "share": v / total} for k, v in top]}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--cases", nargs="+", default=None, help="names or patterns (shared-*); default: all")
    p.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    p.add_argument("--calls", type=int, default=5)
    p.add_argument("--json", default=None, help=f"write the profiles here (e.g. {RESULTS})")
    p.add_argument("--busy", action="store_true",
                   help="beside one busy single-thread process (a Python loop), as shared_machine.py's busy cells")
    args = p.parse_args(argv)
    with sm._beside_busy(args.busy):
        return _profile_cases(args)


def _profile_cases(args) -> int:
    torch.set_flush_denormal(True)
    cases = _cases()
    out = {"threads": args.threads, "calls": args.calls, "load_avg_start": os.getloadavg()[0], "cases": {},
           "load": "busy" if args.busy else "idle"}
    names = [n for n in cases if args.cases is None or any(fnmatch.fnmatch(n, pat) for pat in args.cases)]
    for name in names:
        what, variants = cases[name]
        res = out["cases"][name] = {"what": what, "variants": {}}
        for v, call in variants.items():
            res["variants"][v] = {}
            for t in args.threads:
                torch.set_num_threads(t)
                prof = res["variants"][v][str(t)] = profile_call(call, args.calls)
                ops = ", ".join(f"{o['op']} {100 * o['share']:.0f} %" for o in prof["top"][:4])
                print(f"{name:>20} {v:>28} {t} thr: {prof['wall_ms']:9.1f} ms wall, "
                      f"{prof['self_cpu_ms']:9.1f} ms op self time; {ops}")
    out["load_avg_end"] = os.getloadavg()[0]
    out["environment"] = environment()
    if args.json:
        write_json(Path(args.json), out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
