"""MkDocs hook: the figures that `benchmarks/` writes into `benchmarks/results/` appear in the site as
`img/results/NAME.png`, so the pages show them without a second committed copy."""
from __future__ import annotations

from pathlib import Path

from mkdocs.structure.files import File

RESULTS = Path(__file__).resolve().parent.parent / "benchmarks" / "results"


def on_files(files, config):
    for path in sorted(RESULTS.glob("*.png")):
        files.append(File.generated(config, f"img/results/{path.name}", abs_src_path=str(path)))
    return files
