"""The probe report: how energy-like is each layer of a pretrained encoder (THEORY §6).

`run_probe(settings)` runs `probe.measures.probe` on random SST-2 dev (or IMDB test) texts and
writes, into `settings.out`:

- `heads.png`: per-head heatmaps (layers × heads) of the skew ratio, the negative eigen-mass
  of the symmetric logit form, the value-structure distance (to the nearest scaled rank-d_head
  projector, the certified value/output structure of §3.2) and the value PSD distance;
- `energy_curve.png`: the fixed reference energies at every hidden state t = 0..L, box plots
  per t plus the mean (as the paper's figures 5–6, §7; raw energies shifted by the lowest
  lower whisker, and energies per token pair);
- `own_energy_change.png`: per layer, the relative change of its own energy E_ℓ
  (E_ℓ(Y⁽ℓ⁺¹⁾) − E_ℓ(Y⁽ℓ⁾)) / |E_ℓ(Y⁽ℓ⁾)| and the share of samples where it falls;
- `probe.md` (tables, definitions, data file, wall time), `probe.json` (all numbers, per-sample
  energies), `config.json` (the resolved `ProbeSettings`, the model folder, the data file read
  with its size and sha256), `complete.json` (every file with its sha256).
The folder is built whole or not at all (`runs.staged_output`): the settings, the model folder,
the data file and the output location are checked before any work (the output never being the model
folder, the data folder or file, nor inside the model folder or holding them: `contracts.check_output_apart`),
and a failure leaves an earlier report as it was. Definitions of every measure are in the docstring of
`unfoldformer.probe`.
"""
from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..contracts import check_path_given, check_seed, require_finite
from ..data import EVAL_SPLITS, dataset_record, load_dataset, seeded_subset
from ..data.datasets import SPLITS
from ..errors import ConfigError
from ..plots import lowest_whisker, pyplot, save_figure
from ..runs import check_output_apart, check_output_folder, staged_output
from ..utils import atomic_write_text, write_json

__all__ = ["OUTPUT_FILES", "ProbeSettings", "render_markdown", "run_probe", "sample_texts"]

OUTPUT_FILES = ("config.json", "heads.png", "energy_curve.png", "own_energy_change.png", "probe.json", "probe.md")

HEAD_PANELS = (("skew_ratio", "skew ratio ‖K‖/‖G‖"),
               ("negative_mass", "negative eigen-mass of S"),
               ("value_structure_distance", "value-structure distance (projector)"),
               ("value_psd_distance", "value PSD distance"))


@dataclass
class ProbeSettings:
    """Everything that shapes one probe run (saved as `config.json` next to its outputs)."""

    model: str = "minilm"               # a local Hugging Face folder, or 'minilm'
    dataset: str = "sst2"
    split: str | None = None            # default: the labelled held-out split (dev / test)
    samples: int = 200
    max_length: int = 128
    batch_size: int = 32
    seed: int = 0
    data_dir: str | None = None
    threads: int = 1
    out: str = "probe_report"

    def __post_init__(self) -> None:
        if self.dataset not in EVAL_SPLITS:
            raise ConfigError(f"unknown dataset {self.dataset!r}; valid: {', '.join(EVAL_SPLITS)}")
        self.split = EVAL_SPLITS[self.dataset] if self.split is None else self.split   # '' is an error, not "default"
        if self.split not in SPLITS[self.dataset]:
            raise ConfigError(f"split {self.split!r} is not a split of {self.dataset}; valid: "
                              f"{', '.join(SPLITS[self.dataset])}")
        for name in ("samples", "max_length", "batch_size", "threads"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ConfigError(f"{name} must be an integer >= 1, got {value!r}")
        check_seed("seed", self.seed)
        check_path_given("out", self.out)
        check_path_given("data_dir", self.data_dir)


def _data_file(settings: ProbeSettings):
    """The data set's file, if it is there (else nothing of it can be overwritten)."""
    from ..data import find_data_file
    from ..data.datasets import DATASET_FILES
    try:
        return find_data_file(DATASET_FILES[settings.dataset], settings.data_dir, download=False)
    except (OSError, ValueError, KeyError):
        return None


def sample_texts(dataset: str, split: str, samples: int, seed: int, data_dir=None) -> list[str]:
    """`samples` random texts of a dataset split (`data.seeded_subset`, in data order)."""
    examples = load_dataset(dataset, split, data_dir)
    idx = seeded_subset(len(examples), samples, seed)
    return [e.text for e in examples] if idx is None else [examples[i].text for i in idx]


def run_probe(settings: ProbeSettings, progress=None) -> dict:
    """Probe `settings.model` and write the report files into `settings.out`; returns probe.json's content.

    `progress(k)` is called after each batch of k texts."""
    from .hf import resolve_model_path
    from .measures import probe

    start = time.perf_counter()
    out = check_output_folder("--out", settings.out, "probe", OUTPUT_FILES.__contains__)
    model_path = resolve_model_path(settings.model)
    check_output_apart("--out", out, {"--data-dir": settings.data_dir, "data file": _data_file(settings)},
                       whole={"--model folder": model_path}, replaced=True)
    texts = sample_texts(settings.dataset, settings.split, settings.samples, settings.seed, settings.data_dir)
    config = {**dataclasses.asdict(settings), "model_path": str(model_path),
              "data_files": [dataset_record(settings.dataset, settings.data_dir)]}
    result = probe(settings.model, texts, max_length=settings.max_length, batch_size=settings.batch_size,
                   progress=progress, num_threads=settings.threads)
    summary = {**result.summary(), "wall_seconds": time.perf_counter() - start, "config": config,
               "per_sample": _per_sample(result)}
    require_finite(summary["per_sample"], "probe: per-sample energies")   # NaN would be written as null
    with staged_output(settings.out, "probe", config, owned=OUTPUT_FILES.__contains__) as out:
        write_json(out / "config.json", config)
        plot_heads(result, out / "heads.png")
        plot_energy_curve(result, out / "energy_curve.png")
        plot_own_change(result, out / "own_energy_change.png")
        write_json(out / "probe.json", summary, indent=1)
        atomic_write_text(out / "probe.md", render_markdown(summary))
    return summary


# ----------------------------------------------------------------------------- files
def _per_sample(result) -> dict:
    e = result.energy
    return {"lengths": e.lengths, "own_in": e.own_in, "own_out": e.own_out,
            "reference_mean_form": e.reference, "reference_mean_energy": e.mean_energy}


def _matrix_table(matrix, row_name: str = "layer") -> list[str]:
    H = len(matrix[0])
    lines = [f"| {row_name} | " + " | ".join(f"h{h}" for h in range(H)) + " |",
             "|---" * (H + 1) + "|"]
    for l, row in enumerate(matrix):
        cells = ("nan" if v is None or v != v else f"{v:.2f}" for v in row)
        lines.append(f"| {l} | " + " | ".join(cells) + " |")
    return lines


def render_markdown(s: dict) -> str:
    """probe.md from the summary dict."""
    c = s["config"]
    lines = [f"# Probe of {c['model']} ({s['model_class']})", "",
             f"{s['samples']} random {c['dataset']} {c['split']} texts (seed {c['seed']}, "
             f"max length {c['max_length']}); **wall time {s['wall_seconds']:.1f} s** "
             f"(probe {s['seconds']:.1f} s). Notes: {'; '.join(s['notes'])}.", "",
             "Definitions (see `unfoldformer.probe`): G_h = scale·W_Q[h]ᵀW_K[h], S/K its symmetric/skew "
             "parts; skew ratio ‖K‖/‖G‖; negative eigen-mass Σ|λ₋(S)|/Σ|λ(S)|; value map "
             "M_h = W_V[h]ᵀW_O[h]ᵀ, value-structure distance = min ‖M − cP‖/‖M‖ over rank-d_head "
             "projectors P, value PSD distance = ‖M − (sym M)₊‖/‖M‖. "
             "E_ℓ = Σ_h Σ_{i<j} −exp(−½‖(y_i−y_j)F_hᵀ‖²) with F_hᵀF_h = S_h⁺; biases ignored. "
             "Mean-form, mean-energy and the whisker shift of `energy_curve.png`: `docs/concepts/definitions.md`.", "",
             "## Per layer: does layer ℓ lower its own energy E_ℓ?", "",
             "| layer | share with E_ℓ(Y⁽ℓ⁺¹⁾) < E_ℓ(Y⁽ℓ⁾) | mean rel. change | median rel. change |",
             "|---|---|---|---|"]
    for row in s["per_layer"]:
        lines.append(f"| {row['layer']} | {row['share_decreased']:.3f} | "
                     f"{row['mean_relative_change']:+.3f} | {row['median_relative_change']:+.3f} |")
    lines += ["", "## Fixed reference energies over hidden states t = 0..L", ""]
    for name, ref in s["reference"].items():
        steps = " ".join(f"{v:.2f}" for v in ref["share_decreased_per_step"])
        means = " ".join(f"{v:.1f}" for v in ref["mean"])
        lines += [f"- **{name}**: mean {means}; share of samples decreasing per step {steps}"]
    for key, title in HEAD_PANELS:
        mean = np.nanmean(np.array(s["heads"][key], dtype=float))
        lines += ["", f"## Per head: {title}", "", f"Mean {mean:.3f}; i.i.d. Gaussian weights of the "
                  f"same shapes give {s['random_baseline'][key]:.3f}.", ""] + _matrix_table(s["heads"][key])
    data = "; ".join(f"`{f['path']}` ({f['bytes']:,} bytes, sha256 `{f['sha256']}`)" for f in c.get("data_files", []))
    lines += ["", "Figures: `heads.png`, `energy_curve.png`, `own_energy_change.png`.", "", f"Data read: {data}.", ""]
    return "\n".join(lines)


# ----------------------------------------------------------------------------- figures
def plot_heads(result, path: Path) -> None:
    """Heatmaps layers × heads of the four per-head measures, colour scale [0, 1]."""
    plt = pyplot()
    L, H = result.heads.skew_ratio.shape
    fig, axes = plt.subplots(1, len(HEAD_PANELS), figsize=(3.2 + 0.35 * H * len(HEAD_PANELS), 0.45 * L + 1.8))
    for ax, (key, title) in zip(axes, HEAD_PANELS):
        data = getattr(result.heads, key)                          # (L, H)
        im = ax.imshow(data, vmin=0, vmax=1, cmap="viridis", aspect="auto")
        ax.set(title=title, xlabel="head", ylabel="layer", xticks=range(H), yticks=range(L))
        ax.title.set_fontsize(9)
        ax.tick_params(labelsize=7)
        if L * H <= 200:
            for (l, h), v in np.ndenumerate(data):
                ax.text(h, l, f"{v:.2f}", ha="center", va="center", fontsize=5,
                        color="white" if v < 0.5 else "black")
    fig.colorbar(im, ax=axes, shrink=0.8)
    save_figure(fig, path, bbox_inches="tight")


def _box_with_mean(ax, values: np.ndarray, title: str, ylabel: str) -> None:
    t = np.arange(values.shape[1])
    ax.boxplot(values, positions=t, widths=0.6, showfliers=False)
    ax.plot(t, values.mean(0), "o-", color="tab:red", ms=3, label="mean")
    ax.set(title=title, xlabel="hidden state t", ylabel=ylabel)
    ax.title.set_fontsize(9)
    ax.legend(fontsize=7)


def plot_energy_curve(result, path: Path) -> None:
    """Rows: mean-form and mean-energy references; columns: shifted raw energy, energy per pair."""
    plt = pyplot()
    e = result.energy
    pairs = np.maximum(e.lengths * (e.lengths - 1) / 2, 1)[:, None]  # (N, 1)
    refs = e.references
    fig, axes = plt.subplots(len(refs), 2, figsize=(10, 3.6 * len(refs)), squeeze=False)
    for row, (name, values) in zip(axes, refs.items()):
        shifted = values - lowest_whisker(values)                 # (N, L+1)
        _box_with_mean(row[0], shifted, f"{name}: E(Y⁽ᵗ⁾) − lowest whisker", "energy (shifted)")
        _box_with_mean(row[1], values / pairs, f"{name}: E(Y⁽ᵗ⁾) per token pair", "energy / pair")
    fig.tight_layout()
    save_figure(fig, path)


def plot_own_change(result, path: Path) -> None:
    """Per layer: box plot of the relative own-energy change and the share of samples that descend."""
    plt = pyplot()
    e = result.energy
    rel, share = e.own_relative_change, e.own_decreased.mean(0)    # (N, L), (L,)
    layers = np.arange(rel.shape[1])
    fig, (ax0, ax1) = plt.subplots(1, 2, figsize=(10, 3.8))
    ax0.boxplot([c[np.isfinite(c)] for c in rel.T], positions=layers, widths=0.6, showfliers=False)
    ax0.plot(layers, np.nanmean(rel, 0), "o-", color="tab:red", ms=3, label="mean")
    ax0.axhline(0, color="gray", lw=0.8)
    ax0.set(title="(E_ℓ(Y⁽ℓ⁺¹⁾) − E_ℓ(Y⁽ℓ⁾)) / |E_ℓ(Y⁽ℓ⁾)|  (< 0: descent)", xlabel="layer ℓ",
            ylabel="relative change of own energy")
    ax0.title.set_fontsize(9)
    ax0.legend(fontsize=7)
    ax1.bar(layers, share, color="tab:blue")
    ax1.set(ylim=(0, 1.12), title="share of samples whose own energy falls", xlabel="layer ℓ",
            xticks=layers)
    ax1.title.set_fontsize(9)
    for l, v in zip(layers, share):
        ax1.text(l, v + 0.02, f"{v:.2f}", ha="center", fontsize=7)
    fig.tight_layout()
    save_figure(fig, path)
