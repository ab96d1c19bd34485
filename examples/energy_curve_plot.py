"""Plot the energy curves of a certified model, without and with the safeguard.

    python examples/energy_curve_plot.py                     # a random-init certified model on random tokens
    python examples/energy_curve_plot.py --run runs/sst2     # a trained run, on a few sentences
    python examples/energy_curve_plot.py --out curves.png

Each line is one input's E(Y⁽ᵗ⁾) − E(Y⁽⁰⁾) over the layers t. With `safeguard=True` no curve rises
(whole-layer descent by backtracking); without it a layer may raise the energy. UNFOLDFORMER_EXAMPLE_TINY=1
runs a tiny model (the test suite does).
"""
from __future__ import annotations

import argparse
import os

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import torch  # noqa: E402

import unfoldformer as uf  # noqa: E402

TINY = os.environ.get("UNFOLDFORMER_EXAMPLE_TINY") == "1"
SENTENCES = ["a gorgeous, witty, seductive movie.", "the plot is thin and the jokes fall flat.",
             "an uneven but often moving portrait.", "i would not watch it again."]


def curves_random(safeguard: bool) -> torch.Tensor:
    """(B, depth + 1) energy curves of a random-init certified model on random tokens."""
    d, n, depth = (16, 8, 3) if TINY else (64, 32, 6)
    torch.manual_seed(0)
    model = uf.UnfoldedTransformer(uf.ModelConfig.preset("certified-alternating", d_model=d, n_heads=2, depth=depth)).eval()
    x = torch.randn(4, n, d)                                           # (B, n, d)
    pad = torch.zeros(4, n, dtype=torch.bool)
    pad[1, n // 2:] = True                                              # one padded text
    with torch.no_grad():
        return model(x, pad, return_energies=True, safeguard=safeguard).energies


def curves_trained(run: str, safeguard: bool) -> torch.Tensor:
    predictor = uf.load(run)
    return torch.tensor([p.energies for p in predictor.predict(SENTENCES, safeguard=safeguard)])


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--run", help="a trained run folder (default: a random-init model)")
    p.add_argument("--out", default="energy_curves.png")
    args = p.parse_args(argv)
    fig, axes = plt.subplots(1, 2, figsize=(9, 3.5), sharey=True)
    for ax, safeguard in zip(axes, (False, True)):
        E = curves_trained(args.run, safeguard) if args.run else curves_random(safeguard)   # (B, T + 1)
        tol = uf.descent_tolerance(torch.float32)
        rises = (E.diff(dim=1) > tol * (1 + E[:, :-1].abs())).any(dim=1)                  # (B,)
        for i, curve in enumerate(E):
            ax.plot(range(curve.numel()), (curve - curve[0]).tolist(), "o-", ms=3, label=f"input {i}")
        ax.set(title=f"safeguard {'on' if safeguard else 'off'}: {int(rises.sum())} of {len(E)} curves rise",
               xlabel="layer t")
        print(f"safeguard {'on ' if safeguard else 'off'}: curves that rise: {int(rises.sum())} of {len(E)}")
        if safeguard:
            assert not rises.any(), "with the safeguard no curve may rise"
    axes[0].set_ylabel("E(Y$^{(t)}$) − E(Y$^{(0)}$)")
    axes[0].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(args.out, dpi=100)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
