"""The documentation site builds in strict mode (every link, anchor, page and API name resolves), and
no Markdown table in README.md or docs/ is wider than 8 columns."""
import importlib.util
import re
import subprocess
import sys

import pytest

from conftest import REPO_ROOT

MAX_COLUMNS = 8
_CELL_SEP = re.compile(r"(?<!\\)\|")          # an unescaped pipe separates cells


def _markdown_files():
    return [REPO_ROOT / "README.md", *sorted((REPO_ROOT / "docs").rglob("*.md"))]


def table_widths(text: str) -> list[tuple[int, int]]:
    """(line number, columns) of every Markdown table's header row in `text` (code blocks skipped)."""
    out, fenced, previous = [], False, ""
    lines = text.splitlines()
    for i, line in enumerate(lines):
        if line.lstrip().startswith("```"):
            fenced = not fenced
        if fenced:
            continue
        if re.fullmatch(r"\s*\|?\s*:?-{3,}:?\s*(\|\s*:?-{3,}:?\s*)*\|?\s*", line) and previous.lstrip().startswith("|"):
            out.append((i, len(_CELL_SEP.split(previous.strip().strip("|")))))
        previous = line
    return out


def test_table_widths_counts_the_columns_of_a_table():
    text = "| a | b \\| c | `d` |\n|---|---|---|\n| 1 | 2 | 3 |\n\n```\n| x | y |\n|---|---|\n```\n"
    assert table_widths(text) == [(1, 3)]


def test_no_table_is_wider_than_eight_columns():
    wide = [f"{path.relative_to(REPO_ROOT)}:{line} has {n} columns"
            for path in _markdown_files() for line, n in table_widths(path.read_text(encoding="utf-8"))
            if n > MAX_COLUMNS]
    assert not wide, "\n".join(wide)


def ragged_rows(text: str) -> list[int]:
    """Line numbers (1-based) of table rows whose unescaped-pipe cell count differs from their header's (a `|`
    inside a cell, e.g. |x| for an absolute value, splits it and shifts the row); code blocks skipped."""
    out, fenced, header = [], False, None
    for i, line in enumerate(text.splitlines(), 1):
        if line.lstrip().startswith("```"):
            fenced = not fenced
        if fenced or not line.lstrip().startswith("|"):
            header = None
            continue
        cells = len(_CELL_SEP.split(line.strip().strip("|")))
        if header is None:
            header = cells
        elif cells != header:
            out.append(i)
    return out


def test_ragged_rows_finds_a_pipe_inside_a_cell():
    assert ragged_rows("| a | b |\n|---|---|\n| \\|x\\| | 2 |\n| |x| | 2 |\n") == [4]


def test_every_table_row_has_its_headers_number_of_cells():
    ragged = [f"{path.relative_to(REPO_ROOT)}:{line}" for path in _markdown_files()
              for line in ragged_rows(path.read_text(encoding="utf-8"))]
    assert not ragged, "rows with a stray | (escape it as \\|): " + ", ".join(ragged)


@pytest.mark.skipif(importlib.util.find_spec("mkdocs") is None or importlib.util.find_spec("mkdocstrings") is None,
                    reason="the docs group is not installed (pip install -e '.[docs]')")
def test_site_builds_strictly(tmp_path):
    result = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path / "site"),
                             "--config-file", str(REPO_ROOT / "mkdocs.yml")],
                            capture_output=True, text=True, timeout=300, cwd=REPO_ROOT,
                            env={**__import__("os").environ, "NO_MKDOCS_2_WARNING": "1"})
    assert result.returncode == 0, result.stderr[-4000:]
    api = (tmp_path / "site" / "api" / "index.html").read_text(encoding="utf-8")
    import unfoldformer
    missing = [name for name in unfoldformer.__all__ if f'id="unfoldformer.{name}"' not in api]
    assert not missing, f"the API reference does not document {missing}"
    for page in ("index.html", "results/accuracy/index.html", "concepts/definitions/index.html", "theory/index.html"):
        assert (tmp_path / "site" / page).is_file(), page
    _check_api_signatures(api)
    from unfoldformer.paper.settings import FIGURE_FILES  # the figures `unfoldformer reproduce` writes
    page = (tmp_path / "site" / "results" / "reproduction" / "index.html").read_text(encoding="utf-8")
    for name in FIGURE_FILES.values():
        assert f'src="../../img/reproduction/{name}"' in page, name
        assert (tmp_path / "site" / "img" / "reproduction" / name).stat().st_size > 10_000, name


def _check_api_signatures(api: str) -> None:
    """The entry points a user starts from appear with their rendered signatures (argument names) and an
    example, read from the built HTML (tags stripped)."""
    import html
    import re
    text = html.unescape(re.sub(r"<[^>]+>", "", api))
    for name, args in (("CertifiedEncoderLayer", ("d_model", "nhead", "dim_feedforward", "layer")),
                       ("CertifiedEncoder", ("encoder_layer", "num_layers", "tied")),
                       ("UnfoldedTransformer", ("config", "layers")),
                       ("train", ("cfg", "resume")), ("load", ("path", "data_dir", "max_length", "device"))):
        calls = [m.group(1) for m in re.finditer(rf"\b{name}\s*\(([^)]*)\)", text)]
        assert any(all(a in call for a in args) for call in calls), f"no signature of {name} with {args}: {calls}"
    for anchor in ("unfoldformer.train.train", "unfoldformer.train.TrainConfig", "unfoldformer.inference.Prediction"):
        assert f'id="{anchor}"' in api, anchor
    assert "save_pretrained" in text and "from_pretrained" in text and text.count("Example") >= 5
