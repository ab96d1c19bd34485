"""`unfoldformer evaluate`: accuracy, per-class scores and energy-curve statistics of a saved checkpoint.

    unfoldformer evaluate CHECKPOINT [--data-dir DIR] [--split SPLIT | --data.eval_file FILE
                          [--data.text_column C] [--data.label_column C]] [--max-length N | --full-length]
                          [--safeguard] [--no-energies] [--device DEVICE] [--output FILE]

CHECKPOINT is a `.safetensors` weights file, a `checkpoint.pt` or a run folder (its best weights).
`--data.eval_file` scores a new labelled file (read as `train --data.train_file` reads one; its labels
matched to the run's class names; the run's columns unless `--data.text_column/--data.label_column`).
The result (JSON) goes to stdout; a table of per-class precision, recall, F1 and support with their
macro averages (over the classes present) and the confusion matrix goes to stderr (`train.scores`).
With `--output F.json` the JSON is also written to F.json and the confusion matrix drawn to
F.confusion.png beside it.
Energy statistics (unfolded models only): share of samples whose energy curve E(Y⁰), …, E(Yᵀ)
never rises (beyond the model's float32 round-off allowance; `monotone_share_strict` without it),
share whose every layer descends its own energy, share of layer steps the safeguard shortened,
and the mean curve. An untied model has one energy per layer, so no single curve: its curve share
is null (`"one_energy": false`) and "every layer descends" is what it certifies. `--safeguard`
evaluates with whole-layer descent by backtracking (THEORY §3.5).
Every option is checked before any work (sizes >= 1, device present, labelled split, `--output`
writable, neither the checkpoint, nor `--data.eval_file`, nor in the run folder: `contracts.check_output_apart`);
the run folder's manifest and the weights' checksums are verified (weights without
checksums need the manifest or `--trust-unverified`); a NaN or infinite loss or energy is refused
(exit 2, naming the example), never reported; `--output` is written atomically (whole or absent).
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from . import add_device_argument


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("checkpoint", help="weights (.safetensors), checkpoint.pt, or a run folder")
    parser.add_argument("--data-dir", help="folder with the data files (default: the saved config's)")
    parser.add_argument("--split", help="labelled split (default: the config's evaluation split)")
    parser.add_argument("--data.eval_file", dest="eval_file", metavar="FILE",
                        help="score this labelled file (.csv .tsv .jsonl .json .parquet, datasets folder) instead")
    parser.add_argument("--data.text_column", dest="text_column", metavar="C",
                        help="the file's text column (default: the run's)")
    parser.add_argument("--data.label_column", dest="label_column", metavar="C",
                        help="the file's label column (default: the run's)")
    parser.add_argument("--max-length", type=int, help="truncation (default: the config's data.max_length)")
    parser.add_argument("--full-length", action="store_true", help="no truncation")
    parser.add_argument("--batch-size", type=int, help="examples per batch (long texts get fewer)")
    parser.add_argument("--max-examples", type=int, help="evaluate a fixed random subset of this size")
    parser.add_argument("--safeguard", action="store_true",
                        help="backtracking safeguard: whole-layer descent by construction (unfolded models)")
    parser.add_argument("--no-energies", action="store_true", help="skip the energy statistics")
    add_device_argument(parser)
    parser.add_argument("--output", help="also write the result as JSON to this file, and the confusion matrix "
                        "as a figure beside it (NAME.confusion.png)")
    parser.add_argument("--trust-unverified", action="store_true",
                        help="read weights without checksums that no run-folder manifest vouches for")


def run(args: argparse.Namespace) -> int:
    from ..contracts import check_output_apart, check_path_given
    from ..errors import ConfigError
    from ..runs import check_device, check_output_location
    from ..train import evaluate_checkpoint
    from ..utils import write_json
    from . import check_options

    check_options(args, "max_length", "batch_size", "max_examples")
    if args.full_length and args.max_length is not None:
        raise ConfigError("--max-length and --full-length exclude each other")
    check_path_given("--data.eval_file", args.eval_file)
    if args.eval_file is not None and args.split is not None:
        raise ConfigError("--split and --data.eval_file exclude each other: evaluate a split of the run's data or "
                          "a file")
    if args.eval_file is None and (args.text_column is not None or args.label_column is not None):
        raise ConfigError("--data.text_column and --data.label_column choose the columns of --data.eval_file; "
                          "give the file")
    check_device("--device", args.device)
    if args.output is not None:
        output = check_output_location("--output", args.output, folder=False)
        source = Path(args.checkpoint).expanduser().resolve()
        run = source if source.is_dir() else source.parent if (source.parent / "config.json").is_file() else None
        check_output_apart("--output", [output, confusion_figure(output)],
                           {"checkpoint": source, "data.eval_file": args.eval_file},
                           whole={"run folder": run, "datasets folder": _folder(args.eval_file)})
    result = evaluate_checkpoint(args.checkpoint, data_dir=args.data_dir, split=args.split,
                                 max_length=args.max_length, full_length=args.full_length,
                                 batch_size=args.batch_size, energies=not args.no_energies,
                                 safeguard=args.safeguard, max_examples=args.max_examples, device=args.device,
                                 progress=True, trust_unverified=args.trust_unverified, eval_file=args.eval_file,
                                 text_column=args.text_column, label_column=args.label_column)
    print(json.dumps(result, indent=2))
    print(scores_table(result), file=sys.stderr)
    if args.output:
        from ..train.figures import plot_confusion
        write_json(args.output, result)
        plot_confusion(result, confusion_figure(output), title=_figure_title(result))
    return 0


def _folder(path: str | None) -> str | None:
    """`path` if it names a folder (a datasets folder: every file in it is an input), else None."""
    return path if path is not None and Path(path).expanduser().is_dir() else None


def confusion_figure(output: Path) -> Path:
    """The figure beside the JSON output: F.json -> F.confusion.png."""
    return output.with_name(output.stem + ".confusion.png")


def _figure_title(result: dict) -> str:
    scored = Path(result["eval_file"]["path"]).name if result.get("eval_file") else f"split {result['split']}"
    return f"{Path(result['checkpoint']).parent.name} on {scored}"


def scores_table(result: dict, max_matrix: int = 20) -> str:
    """Per-class precision, recall, F1, support and predicted count, the macro averages, the accuracy and (up to
    `max_matrix` classes) the confusion matrix, as aligned text."""
    classes = result["classes"]
    width = max(9, *(len(row["label"]) for row in classes))
    lines = [f"{'class':<{width}}  precision  recall      f1  support  predicted"]
    for row in classes:
        lines.append(f"{row['label']:<{width}}  {row['precision']:9.3f}  {row['recall']:6.3f}  {row['f1']:6.3f}  "
                     f"{row['support']:7d}  {row['predicted']:9d}")
    macro = result["macro"]
    lines.append(f"{'macro avg':<{width}}  {macro['precision']:9.3f}  {macro['recall']:6.3f}  {macro['f1']:6.3f}  "
                 f"{result['n']:7d}  (over the {macro['classes']} classes present)")
    correct = sum(result["confusion"][c][c] for c in range(len(classes)))
    lines.append(f"accuracy {result['accuracy']:.4f} ({correct} of {result['n']})")
    undefined = result["undefined"]
    for key, why in (("precision", "never predicted: precision"), ("recall", "absent from the data: recall")):
        if undefined[key]:
            lines.append(f"{why} undefined, shown as 0: {', '.join(undefined[key])}")
    if len(classes) > max_matrix:
        lines.append(f"confusion matrix: {len(classes)} classes, see the JSON (--output) and its figure")
        return "\n".join(lines)
    cell = max(5, width, *(len(str(v)) for r in result["confusion"] for v in r))
    lines.append("confusion matrix (rows: true class, columns: predicted class)")
    lines.append(" " * width + "".join(f"  {row['label'][:cell]:>{cell}}" for row in classes))
    for row, counts in zip(classes, result["confusion"]):
        lines.append(f"{row['label']:<{width}}" + "".join(f"  {v:>{cell}d}" for v in counts))
    return "\n".join(lines)
