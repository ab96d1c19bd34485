"""Command line: `unfoldformer COMMAND ...`, one module per command in this package.

Each command module provides `add_arguments(parser)` and `run(args) -> int` and is imported
only when its command runs (so `unfoldformer --help` stays fast). `main` is the one error path
of every command: an `UnfoldformerError` (bad setting, missing or malformed file, unreadable
checkpoint, unsupported model) prints `unfoldformer COMMAND: error: MESSAGE` and exits with
status 2; so does an `OSError` of the system (a full disk, a symbolic-link loop, a permission), in
one line naming the file. A closed output pipe (`unfoldformer zoo | head`) ends the command quietly
with status 141, as a command killed by SIGPIPE does. Anything else is a bug and keeps its traceback.
An `UnverifiedFileWarning` (a file read without checksums) prints one line, `unfoldformer COMMAND: warning: MESSAGE`.

`check_options(args, *names)` checks integer options (>= 1 unless unset) before a command
does any work, each error naming its option.
"""
from __future__ import annotations

import argparse
import importlib
import os
import sys
import warnings

from ..errors import UnfoldformerError, UnverifiedFileWarning

COMMANDS: dict[str, str] = {
    "demo": "energy trace of a certified model on random inputs",
    "presets": "list the model presets and their settings",
    "reproduce": "reproduce the paper's figures 1-6 and write a report",
    "probe": "probe a pretrained Transformer: how energy-like is each layer",
    "rho-study": "what the attention penalty rho changes: kernels, token diversity, accuracy, speed",
    "train": "train a classifier (certified, paper or standard Transformer)",
    "evaluate": "evaluate a saved checkpoint: accuracy and energy curves",
    "predict": "labels, probabilities and energy curves of a trained classifier for new texts",
    "zoo": "list the trained classifiers shipped with the package",
    "plot": "loss, accuracy and energy figures of a run folder (PNG, written into it)",
    "lm": "language model: train, evaluate, generate (certified decoder or standard GPT)",
    "distill": "distil all-MiniLM-L6-v2 into a certified joint encoder (resumable)",
}


def _module(name: str):
    return importlib.import_module(f"{__name__}.{name.replace('-', '_')}")


def build_parser(argv: list[str]) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="unfoldformer", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    parser.set_defaults(subparsers=sub.choices)
    wanted = next((a for a in argv if not a.startswith("-")), None)
    for name, help_text in COMMANDS.items():
        p = sub.add_parser(name, help=help_text, description=help_text)
        if name == wanted:  # only import the module of the command being run
            _module(name).add_arguments(p)
    return parser


def add_device_argument(parser: argparse.ArgumentParser, cpu_only: bool = False) -> None:
    """`--device auto|cpu|cuda|mps` (also cuda:N), the same on every command that runs a model."""
    extra = "; this command is not implemented for cuda / mps and refuses them" if cpu_only else ""
    parser.add_argument("--device", default="auto", metavar="DEVICE",
                        help=f"auto (cuda, else mps, else cpu), cpu, cuda, cuda:N or mps (default auto){extra}")


def check_device_option(args: argparse.Namespace, command: str | None = None) -> str:
    """ConfigError for a `--device` torch cannot use here; with `command`, also for any device but the CPU
    (that command computes on the CPU). Returns the resolved device."""
    from ..errors import ConfigError
    from ..runs import check_device, resolve_device
    check_device("--device", args.device)
    if command is not None and args.device not in ("auto", "cpu"):
        raise ConfigError(f"--device={args.device!r}: {command} computes on the CPU only (it is not implemented "
                          "for cuda / mps); use --device cpu or auto")
    return "cpu" if command is not None else resolve_device(args.device)


def check_options(args: argparse.Namespace, *names: str, low: int = 1) -> None:
    """ConfigError naming the option (`--max-length`) for an integer option below `low` (unset is fine)."""
    from ..runs import check_at_least
    for name in names:
        check_at_least(f"--{name.replace('_', '-')}", getattr(args, name), low, optional=True)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser(argv)
    args, extra = parser.parse_known_args(argv)
    if args.command is None:
        parser.print_help()
        return 2
    module = _module(args.command)
    if extra and not getattr(module, "ACCEPTS_EXTRA_ARGS", False):
        args.subparsers[args.command].error(f"unrecognized arguments: {' '.join(extra)}")
    args.extra = extra
    try:
        with warnings.catch_warnings():
            plain = warnings.showwarning

            def show(message, category, *rest, **kw):
                if issubclass(category, UnverifiedFileWarning):
                    print(f"unfoldformer {args.command}: warning: {message}", file=sys.stderr)
                else:
                    plain(message, category, *rest, **kw)

            warnings.showwarning = show
            return int(module.run(args) or 0)
    except UnfoldformerError as exc:
        print(f"unfoldformer {args.command}: error: {exc}", file=sys.stderr)
        return 2
    except BrokenPipeError:
        _silence_stdout()
        return 141
    except OSError as exc:
        where = f"{exc.filename}: " if exc.filename else ""
        print(f"unfoldformer {args.command}: error: {where}{exc.strerror or exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"unfoldformer {args.command}: interrupted", file=sys.stderr)
        return 130


def _silence_stdout() -> None:
    """After a closed pipe: point stdout at devnull so the interpreter's last flush cannot fail again
    (the Python documentation's recipe, signal module, "Note on SIGPIPE")."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError, AttributeError):              # stdout is not a file (tests capture it)
        pass


if __name__ == "__main__":
    raise SystemExit(main())
