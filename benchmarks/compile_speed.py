"""`torch.compile` on the certified classifier: forward (eval, no grad) and a training step, eager vs compiled.

The accuracy benchmark's classifier (width 128, depth 6, 4 heads, `certified-tied`), B = 32, 20 %
padding, one thread by default. The compiled model is `torch.compile(model)` (default backend,
inductor; it needs a C++ compiler). Rounds alternate eager and compiled on the same fresh batch;
medians of wall time after warm-up (the first compiled call, which compiles, is timed separately).
Graph breaks: run with `TORCH_LOGS=graph_breaks`; `--count-breaks` reports `torch._dynamo.explain`'s count.

    python benchmarks/compile_speed.py [--lengths 64 256] [--rounds 5] [--threads 1] [--count-breaks] [--json FILE]
"""
from __future__ import annotations

# isort: off
# unfoldformer before torch, as the command line imports it (results measured before 2026-12-05 ran with the
# OMP_WAIT_POLICY=PASSIVE that versions of then set in this order; the library now leaves OpenMP's settings alone)
import unfoldformer  # noqa: F401
# isort: on
import argparse
import os
import statistics
import time

import torch

from inference_speed import _classifier  # same folder
from train_speed import _Table, make_batch
from unfoldformer.utils import write_json


def _train_step(model: torch.nn.Module, opt: torch.optim.Optimizer):
    def step(ids, mask, labels):
        opt.zero_grad(set_to_none=True)
        logits, _ = model(ids, mask)                                 # (B, classes)
        loss = torch.nn.functional.cross_entropy(logits, labels)
        loss.backward()
        opt.step()
    return step


def measure(n: int, rounds: int, kind: str, table: _Table) -> dict:
    eager = _classifier(kind, table)
    compiled = torch.compile(eager)
    ids, mask, labels = make_batch(32, n, seed=0)
    out: dict = {}
    for mode in ("forward", "training step"):
        if mode == "forward":
            eager.eval()
            runs = {"eager": lambda i, m, y: eager(i, m), "compiled": lambda i, m, y: compiled(i, m)}
            ctx = torch.no_grad
        else:
            eager.train()
            opt = torch.optim.AdamW(eager.parameters(), lr=1e-4)
            runs = {"eager": _train_step(eager, opt), "compiled": _train_step(compiled, opt)}
            ctx = torch.enable_grad
        with ctx():
            t0 = time.perf_counter()
            runs["compiled"](ids, mask, labels)                         # compiles
            first = time.perf_counter() - t0
            runs["eager"](ids, mask, labels)
            times: dict = {v: [] for v in runs}
            for r in range(rounds):
                ids, mask, labels = make_batch(32, n, seed=r + 1)
                for v in (list(runs) if r % 2 == 0 else list(runs)[::-1]):
                    t0 = time.perf_counter()
                    runs[v](ids, mask, labels)
                    times[v].append(time.perf_counter() - t0)
        med = {v: statistics.median(t) for v, t in times.items()}
        out[mode] = {"median_s": med, "speedup": med["eager"] / med["compiled"], "first_compiled_call_s": first}
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--lengths", type=int, nargs="+", default=[64, 256])
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--kind", default="certified-tied")
    p.add_argument("--count-breaks", action="store_true", help="report torch._dynamo.explain's graph-break count")
    p.add_argument("--json")
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    torch.set_flush_denormal(True)
    table = _Table()
    load = [os.getloadavg()[0]]
    results = {}
    if args.count_breaks:
        model = _classifier(args.kind, table).eval()
        ids, mask, _ = make_batch(32, args.lengths[0], seed=0)
        with torch.no_grad():
            explained = torch._dynamo.explain(model)(ids, mask)
        results["graph_breaks"] = {"count": explained.graph_break_count,
                                   "reasons": [str(b.reason) for b in explained.break_reasons]}
        print(f"graph breaks (forward, eval): {explained.graph_break_count}")
        for reason in dict.fromkeys(r.splitlines()[0] for r in results["graph_breaks"]["reasons"]):
            print(f"  - {reason}")
    for n in args.lengths:
        results[str(n)] = measure(n, args.rounds, args.kind, table)
    load.append(os.getloadavg()[0])
    print("| n | pass | eager | compiled | speed-up | first compiled call |\n|---|---|---|---|---|---|")
    for n in args.lengths:
        for mode, r in results[str(n)].items():
            med = r["median_s"]
            print(f"| {n} | {mode} | {1e3 * med['eager']:.1f} ms | {1e3 * med['compiled']:.1f} ms | "
                  f"{r['speedup']:.2f}× | {r['first_compiled_call_s']:.1f} s |")
    print(f"{args.kind}, B = 32, {args.threads} thread(s), median of {args.rounds}, wall time; "
          f"1-minute load {load[0]:.1f} → {load[1]:.1f}")
    if args.json:                                                   # whole or not at all
        write_json(args.json, {"results": results, "threads": args.threads, "load": load, "kind": args.kind,
                               "rounds": args.rounds, "torch": torch.__version__})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
