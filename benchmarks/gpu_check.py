"""One short device check (≤ 10 minutes on an H200): every pass against float64, then speed at width 384.

1. Correctness on the device (float32) against float64 on the CPU, same rounded inputs:
   `softmax_with_lse` (the device's fused kernel, `softmax.pass_kind`) values and gradients;
   `attention_pass` (log S_i, o_i); `kernels.kernel_sums` for ρ = log (values, gradients);
   `attention_energy` (exp, log); the certified model's hidden states and energy curve.
   Each is reported as max |Δ| / max(1, max |reference|).
2. Speed at width 384, depth 12, 4 heads, FFN 1,536, B = 32 (`--tiny`: width 32, depth 2, B = 2):
   the energy of one padded batch (float64 `attention_energy`); a training step (AdamW) of the
   certified model and of a pre-LN `nn.TransformerEncoder`; inference (plain, with energies) of both.
   Medians of wall time over rounds with the device synchronised.

Writes a JSON (`--json`) and prints a table.

    python benchmarks/gpu_check.py [--device cuda] [--tiny] [--json FILE]
"""
from __future__ import annotations

import argparse
import json
import statistics
import time

import torch
from torch import nn

from unfoldformer import ModelConfig, UnfoldedTransformer
from unfoldformer import kernels as K
from unfoldformer.energy import attention_energy
from unfoldformer.rho import get_rho
from unfoldformer.softmax import attention_pass, pass_kind, softmax_with_lse

D64 = torch.float64


def _rel(got: torch.Tensor, ref: torch.Tensor) -> float:
    ref = ref.detach().to("cpu", D64)
    return float((got.detach().to("cpu", D64) - ref).abs().max() / max(1.0, float(ref.abs().max())))


def _grads(fn, inputs: list[torch.Tensor]) -> list[torch.Tensor]:
    leaves = [t.detach().clone().requires_grad_(True) for t in inputs]
    out = fn(*leaves)
    loss = sum((o.double().sin()).sum() for o in (out if isinstance(out, tuple) else (out,)))
    return [out, *torch.autograd.grad(loss, leaves)]


def correctness(device: torch.device, n: int) -> dict[str, float]:
    g = torch.Generator().manual_seed(0)
    res: dict[str, float] = {}
    q, k = (torch.randn(2, 4, n, 33, generator=g) * 0.5 for _ in range(2))
    v = torch.cat([torch.randn(2, 4, n, 32, generator=g), torch.zeros(2, 4, n, 1)], -1)

    def lse_fn(q, k, v, fused):
        return softmax_with_lse(q, k, v, None, fused=fused)
    dev = _grads(lambda *t: lse_fn(*t, None), [t.to(device) for t in (q, k, v)])
    ref = _grads(lambda *t: lse_fn(*t, False), [t.double() for t in (q, k, v)])
    res["softmax_with_lse out"], res["softmax_with_lse lse"] = _rel(dev[0][0], ref[0][0]), _rel(dev[0][1], ref[0][1])
    for name, a, b in zip(("dq", "dk", "dv"), dev[1:], ref[1:]):
        res[f"softmax_with_lse {name}"] = _rel(a, b)

    C = torch.randn(2, n, 4, 32, generator=g)
    valid = torch.rand(2, n, generator=g) > 0.2
    valid[:, 0] = True
    scales = torch.full((4,), 32 ** -0.25)
    got = attention_pass(C.to(device), scales.to(device), valid.to(device))
    want = attention_pass(C.double(), scales.double(), valid)
    real = valid[..., None]
    res["attention_pass log S"] = _rel(got.log_mass.cpu().where(real, 0.0), want.log_mass.where(real, 0.0))
    res["attention_pass average"] = _rel(got.average.cpu()[valid], want.average[valid])

    a, vals = torch.randn(2, 4, n, 8, generator=g) * 0.5, torch.randn(2, 4, n, 9, generator=g)
    log = get_rho("log")
    dev = _grads(lambda a, v: K.kernel_sums(a, v, log), [a.to(device), vals.to(device)])
    ref = _grads(lambda a, v: K.kernel_sums(a, v, log), [a.double(), vals.double()])
    for name, x, y in zip(("sums", "da", "dv"), dev, ref):
        res[f"kernel_sums log {name}"] = _rel(x, y)

    Y, F = torch.randn(2, n, 64, generator=g) * 0.3, torch.randn(4, 16, 64, generator=g) / 8
    pad = ~valid
    for rho in ("exp", "log"):
        got = attention_energy(Y.to(device), F.to(device), rho, pad.to(device))
        res[f"attention_energy {rho}"] = _rel(got, attention_energy(Y.double(), F.double(), rho, pad, method="gram"))

    cfg = ModelConfig.preset("certified-alternating", d_model=64, n_heads=4, depth=3, ffn_hidden=128)
    torch.manual_seed(0)
    model = UnfoldedTransformer(cfg).eval()
    x = torch.randn(2, n, 64, generator=g)
    with torch.no_grad():
        out64 = model.double()(x.double(), pad, return_energies=True)
        out = model.float().to(device)(x.to(device), pad.to(device), return_energies=True)
    res["model hidden"] = _rel(out.hidden.cpu()[valid], out64.hidden[valid])
    res["model energies"] = _rel(out.energies, out64.energies)
    return res


def _timed(fn, rounds: int, device: torch.device) -> float:
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    fn()
    sync()
    times = []
    for _ in range(rounds):
        start = time.perf_counter()
        fn()
        sync()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def speed(device: torch.device, tiny: bool, rounds: int) -> dict[str, float]:
    d, depth, B, lengths = (32, 2, 2, (16,)) if tiny else (384, 12, 32, (128, 512))
    g = torch.Generator().manual_seed(1)
    out: dict[str, float] = {}
    n_e = 64 if tiny else 2500
    Y = (torch.randn(8 if tiny else 30, n_e, d, generator=g, dtype=D64) * 0.3).to(device)
    pad = torch.rand(Y.shape[:2], generator=g).to(device) < 0.5
    pad[:, 0] = False
    F = (torch.randn(4, d // 4, d, generator=g, dtype=D64) / d ** 0.5).to(device)
    out[f"energy, padded batch {tuple(Y.shape)} float64"] = _timed(lambda: attention_energy(Y, F, "exp", pad), rounds,
                                                                   device)
    torch.manual_seed(0)
    certified = UnfoldedTransformer(ModelConfig.preset("certified-alternating", d_model=d, n_heads=4, depth=depth,
                                                       ffn_hidden=4 * d)).to(device)
    standard = nn.TransformerEncoder(nn.TransformerEncoderLayer(d, 4, 4 * d, dropout=0.0, batch_first=True,
                                                                norm_first=True), depth,
                                     enable_nested_tensor=False).to(device)
    for n in lengths:
        x = torch.randn(B, n, d, generator=g).to(device)
        mask = torch.zeros(B, n, dtype=torch.bool, device=device)
        mask[:, int(0.8 * n):] = True
        out.update(_model_times(certified, standard, x, mask, rounds, device))
    return out


def _model_times(certified: nn.Module, standard: nn.Module, x: torch.Tensor, mask: torch.Tensor, rounds: int,
                 device: torch.device) -> dict[str, float]:
    n, out = x.shape[1], {}
    runs = {"certified": (certified, lambda: certified(x, mask).hidden),
            "standard": (standard, lambda: standard(x, src_key_padding_mask=mask))}
    for name, (module, fn) in runs.items():
        opt = torch.optim.AdamW(module.parameters(), lr=1e-4)

        def step(fn=fn, opt=opt) -> None:
            opt.zero_grad(set_to_none=True)
            fn().square().mean().backward()
            opt.step()
        module.train()
        out[f"{name} training step, n = {n}"] = _timed(step, rounds, device)
        module.eval()
        with torch.inference_mode():
            out[f"{name} inference, n = {n}"] = _timed(fn, rounds, device)
    with torch.inference_mode():
        out[f"certified inference + energies, n = {n}"] = _timed(
            lambda: certified(x, mask, return_energies=True), rounds, device)
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--device", default="cuda")
    p.add_argument("--tiny", action="store_true", help="a small setting (the CPU test of this script)")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--json", help="write the results here")
    args = p.parse_args(argv)
    device = torch.device(args.device)
    correct = correctness(device, 24 if args.tiny else 300)
    times = speed(device, args.tiny, 1 if args.tiny else args.rounds)
    kind = pass_kind(device.type, torch.float32)
    print(f"device {device} ({torch.cuda.get_device_name(device) if device.type == 'cuda' else 'cpu'}), "
          f"float32 softmax path: {kind}")
    print("| check (float32 on the device vs float64) | max rel. diff |\n|---|---|")
    print("\n".join(f"| {k} | {v:.1e} |" for k, v in correct.items()))
    print("\n| benchmark | median wall time |\n|---|---|")
    print("\n".join(f"| {k} | {1e3 * v:.2f} ms |" for k, v in times.items()))
    if args.json:
        with open(args.json, "w") as fh:
            json.dump({"device": str(device), "pass_kind": kind, "correctness": correct, "times_s": times,
                       "tiny": args.tiny, "torch": torch.__version__}, fh, indent=2)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
