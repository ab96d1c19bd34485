"""Your own labelled texts: CSV, TSV, JSON lines, JSON, Parquet and Hugging Face `datasets` folders.

:func:`read_table` reads two columns (text and label) of one file; the format comes from the
extension (``.csv``, ``.tsv``, ``.jsonl``, ``.json``, ``.parquet``) or, for a folder, from the
``state.json`` that ``datasets.Dataset.save_to_disk`` writes. :func:`load_labelled_files` reads a
training file and an optional evaluation file, turns the labels into class indices and, without an
evaluation file, holds out a seeded share of the training rows.

Reading library: the standard library's :mod:`csv` and :mod:`json` for the text formats, and
`pyarrow <https://arrow.apache.org>`_ for Parquet and for ``save_to_disk`` folders (Arrow IPC
streams; the ``datasets`` package itself is not needed to read them). Why: the text formats are
read record by record, so every error names the file, the row and the column exactly (pandas reports
an unreadable byte by its offset, not its row, and guesses column types unless told not to); a text
is kept as written, with no type guessing (a CSV field ``1.0`` is not turned into a number); pandas
would add a large dependency for two columns; and pyarrow
is the one maintained reader of Parquet and of the Arrow files ``datasets`` saves, without the
download and cache machinery of ``datasets.load_dataset``. pyarrow is the optional dependency
group ``data`` (``pip install unfoldformer[data]``); CSV, TSV and JSON need nothing extra.

Rows are numbered from 1 in file order, the header not counted (for CSV/TSV "row 3" is the third
record; for JSON lines, the third non-blank line). Labels are strings or integers (integral floats
count as integers; a CSV/TSV field holding an integer counts as one, so ``1`` in a CSV and ``1`` in
JSON are the same label); the classes are the distinct labels of the training file, integers in
numeric order, strings in code-point order (the two are not mixed). Every problem raises
:class:`~unfoldformer.data.files.DataFormatError` on one line naming the file, row and column: a
missing column, an empty file, unreadable bytes, a row without label or text, a label of another
type, one class only, an evaluation label the training file lacks.
"""
from __future__ import annotations

import csv
import json
import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from .files import DataFormatError, DataNotFoundError

__all__ = ["FORMATS", "LabelledTexts", "load_labelled_files", "read_table", "table_format"]

#: Extension -> format name.
FORMATS = {".csv": "csv", ".tsv": "tsv", ".jsonl": "jsonl", ".json": "json", ".parquet": "parquet"}
_INTEGER = re.compile(r"^[+-]?\d+$")


@dataclass(frozen=True)
class LabelledTexts:
    """Texts with their class indices (0 … K-1) and the label names of those indices."""

    texts: list[str]
    labels: list[int]
    label_names: tuple[str, ...]


def table_format(path: str | Path) -> str:
    """``csv``, ``tsv``, ``jsonl``, ``json``, ``parquet`` or ``datasets`` (a ``save_to_disk`` folder)."""
    path = Path(path)
    if path.is_dir():
        if (path / "dataset_dict.json").is_file():
            splits = ", ".join(json.loads((path / "dataset_dict.json").read_text()).get("splits", []))
            raise DataFormatError(f"{path}: a datasets DatasetDict (splits {splits}); pass one split's folder, "
                                  f"e.g. {path / 'train'}")
        if not (path / "state.json").is_file():
            raise DataFormatError(f"{path}: a folder without state.json, so not a datasets folder written by "
                                  "save_to_disk")
        return "datasets"
    fmt = FORMATS.get(path.suffix.lower())
    if fmt is None:
        raise DataFormatError(f"{path}: unknown file type {path.suffix!r}; expected one of "
                              f"{', '.join(FORMATS)} or a datasets folder (save_to_disk)")
    return fmt


def read_table(path: str | Path, text_column: str = "text", label_column: str = "label") -> tuple[list, list]:
    """(texts, raw labels) of one file, in row order; see the module doc for formats and errors."""
    path = Path(path).expanduser()
    if not path.exists():
        raise DataNotFoundError(f"{path}: no such file or folder")
    fmt = table_format(path)
    columns = (text_column, label_column)
    if fmt in ("csv", "tsv"):
        rows = _read_delimited(path, "\t" if fmt == "tsv" else ",", columns)
    elif fmt in ("jsonl", "json"):
        rows = _read_json(path, columns)
    else:
        rows = _read_arrow(path, fmt, columns)
    if not rows:
        raise DataFormatError(f"{path}: the file is empty (no data rows)")
    texts, labels = [], []
    for number, (text, label) in enumerate(rows, 1):
        where = f"{path}, row {number}"
        if not isinstance(text, str) or not text.strip():
            what = "no text" if text is None or isinstance(text, str) else f"not a text ({text!r})"
            raise DataFormatError(f"{where}, column {text_column!r}: {what}")
        texts.append(text)
        labels.append(_label_value(label, f"{where}, column {label_column!r}", fmt in ("csv", "tsv")))
    return texts, labels


def _label_value(label, where: str, from_text: bool):
    """An int or a str label; an error for a missing one or another type."""
    if label is None or (isinstance(label, str) and not label.strip()) or (isinstance(label, float) and label != label):
        raise DataFormatError(f"{where}: no label (unlabelled row)")
    if isinstance(label, bool):
        raise DataFormatError(f"{where}: label {label!r} is a boolean; use strings or integers")
    if isinstance(label, (int, np.integer)):
        return int(label)
    if isinstance(label, float):
        if not label.is_integer():
            raise DataFormatError(f"{where}: label {label!r} is neither an integer nor a string")
        return int(label)
    if isinstance(label, str):
        return int(label) if from_text and _INTEGER.match(label.strip()) else label
    raise DataFormatError(f"{where}: label {label!r} ({type(label).__name__}) is neither an integer nor a string")


def _decoded(path: Path) -> str:
    data = path.read_bytes()
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        line = data[: exc.start].count(b"\n") + 1
        raise DataFormatError(f"{path}, line {line}: unreadable bytes (not valid UTF-8 at byte {exc.start})") from None


def _missing(path: Path, column: str, present, row: int = 1) -> DataFormatError:
    return DataFormatError(f"{path}, row {row}, column {column!r}: no such column (columns: "
                           f"{', '.join(map(str, present)) or 'none'}; choose with --data.text_column / "
                           "--data.label_column)")


def _read_delimited(path: Path, delimiter: str, columns: tuple[str, str]) -> list[tuple]:
    text = _decoded(path)
    reader = csv.reader(text.splitlines(keepends=True), delimiter=delimiter)
    try:
        header = next(reader, None)
        if header is None:
            raise DataFormatError(f"{path}: the file is empty (no header, no rows)")
        for column in columns:
            if column not in header:
                raise _missing(path, column, header)
        where = [header.index(c) for c in columns]
        rows = []
        for number, fields in enumerate(reader, 1):
            if not fields:
                continue                                           # a blank line
            if len(fields) != len(header):
                raise DataFormatError(f"{path}, row {number}: {len(fields)} fields, but the header has "
                                      f"{len(header)}")
            rows.append(tuple(fields[i] for i in where))
    except csv.Error as exc:
        raise DataFormatError(f"{path}, line {reader.line_num}: not valid {delimiter == ',' and 'CSV' or 'TSV'} "
                              f"({exc})") from None
    return rows


def _read_json(path: Path, columns: tuple[str, str]) -> list[tuple]:
    """JSON lines (one object per line), or a JSON array of objects (``.json`` may be either)."""
    text = _decoded(path)
    stripped = text.lstrip()
    if path.suffix.lower() == ".json" and stripped.startswith("["):
        try:
            records = json.loads(text)
        except ValueError as exc:
            raise DataFormatError(f"{path}: not valid JSON ({exc})") from None
        numbered = list(enumerate(records, 1))
    else:
        numbered, row = [], 0
        for line_no, line in enumerate(text.splitlines(), 1):
            if not line.strip():
                continue
            row += 1
            try:
                numbered.append((row, json.loads(line)))
            except ValueError as exc:
                raise DataFormatError(f"{path}, row {row} (line {line_no}): not valid JSON ({exc})") from None
    rows = []
    for number, record in numbered:
        if not isinstance(record, dict):
            raise DataFormatError(f"{path}, row {number}: expected an object with the columns, got "
                                  f"{type(record).__name__}")
        for column in columns:
            if column not in record:
                raise _missing(path, column, record, number)
        rows.append(tuple(record[c] for c in columns))
    return rows


def _arrow():
    try:
        import pyarrow
        import pyarrow.ipc  # noqa: F401
        import pyarrow.parquet  # noqa: F401
    except ImportError:
        raise DataFormatError("Parquet files and datasets folders need pyarrow: pip install 'unfoldformer[data]' "
                              "(or pip install pyarrow)") from None
    return pyarrow


def _read_arrow(path: Path, fmt: str, columns: tuple[str, str]) -> list[tuple]:
    pa = _arrow()
    try:
        if fmt == "parquet":
            table = pa.parquet.read_table(path)
        else:
            state = json.loads((path / "state.json").read_text(encoding="utf-8"))
            parts = [path / f["filename"] for f in state.get("_data_files", [])]
            if not parts:
                raise DataFormatError(f"{path}: state.json lists no data files")
            tables = []
            for part in parts:
                with pa.memory_map(str(part)) as source:
                    tables.append(pa.ipc.open_stream(source).read_all())
            table = pa.concat_tables(tables)
    except DataFormatError:
        raise
    except (OSError, ValueError, KeyError, pa.ArrowException) as exc:
        kind = "Parquet file" if fmt == "parquet" else "datasets folder"
        raise DataFormatError(f"{path}: not a readable {kind} ({str(exc).splitlines()[0]})") from None
    for column in columns:
        if column not in table.column_names:
            raise _missing(path, column, table.column_names)
    values = [table.column(c).to_pylist() for c in columns]
    names = _class_label_names(path, columns[1]) if fmt == "datasets" else None
    if names is not None:                                          # a ClassLabel column: its names are the labels
        values[1] = [names[v] if isinstance(v, int) and 0 <= v < len(names) else v for v in values[1]]
    return list(zip(*values))


def _class_label_names(folder: Path, column: str) -> list[str] | None:
    """The names of a `datasets` ClassLabel column (from `dataset_info.json`), or None."""
    try:
        feature = json.loads((folder / "dataset_info.json").read_text(encoding="utf-8"))["features"][column]
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return feature.get("names") if isinstance(feature, dict) and feature.get("_type") == "ClassLabel" else None


def load_labelled_files(train_file: str | Path, eval_file: str | Path | None = None, *, text_column: str = "text",
                        label_column: str = "label", eval_fraction: float = 0.1,
                        split_seed: int = 0) -> dict[str, LabelledTexts]:
    """``{"train": …, "eval": …}`` with class indices shared by both splits.

    Without ``eval_file`` a seeded random ``eval_fraction`` of the training rows (at least one,
    at least one row left to train on) is held out; the choice depends only on the number of rows
    and ``split_seed``."""
    texts, raw = read_table(train_file, text_column, label_column)
    names, index = _classes(raw, Path(train_file), label_column)
    labels = [index[v] for v in raw]
    if eval_file is not None:
        eval_texts, eval_raw = read_table(eval_file, text_column, label_column)
        eval_labels = []
        for number, value in enumerate(eval_raw, 1):
            if value not in index:
                raise DataFormatError(f"{eval_file}, row {number}, column {label_column!r}: label {value!r} does not "
                                      f"occur in the training file {train_file} (its labels: {', '.join(names)})")
            eval_labels.append(index[value])
        return {"train": LabelledTexts(texts, labels, names), "eval": LabelledTexts(eval_texts, eval_labels, names)}
    if len(texts) < 2:
        raise DataFormatError(f"{train_file}: {len(texts)} row; holding out evaluation rows needs at least 2 "
                              "(or give --data.eval_file)")
    held = held_out_rows(len(texts), eval_fraction, split_seed)
    is_held = np.zeros(len(texts), dtype=bool)
    is_held[held] = True
    pick = lambda mask: LabelledTexts([t for t, m in zip(texts, mask) if m],           # noqa: E731
                                      [y for y, m in zip(labels, mask) if m], names)
    return {"train": pick(~is_held), "eval": pick(is_held)}


def held_out_rows(n: int, fraction: float, seed: int) -> np.ndarray:
    """Sorted indices of the ``round(fraction · n)`` held-out rows (clipped to 1 … n-1), a pure
    function of (n, fraction, seed)."""
    k = min(max(int(round(fraction * n)), 1), n - 1)
    return np.sort(np.random.default_rng([seed, 104729]).permutation(n)[:k])


def _classes(raw: list, path: Path, column: str) -> tuple[tuple[str, ...], dict]:
    kinds = {type(v) for v in raw}
    if len(kinds) > 1:
        first = next(n for n, v in enumerate(raw, 1) if type(v) is not type(raw[0]))
        raise DataFormatError(f"{path}, row {first}, column {column!r}: label {raw[first - 1]!r} is a "
                              f"{type(raw[first - 1]).__name__}, but row 1's is a {type(raw[0]).__name__}; "
                              "use one type for all labels")
    values = sorted(set(raw))
    if len(values) < 2:
        raise DataFormatError(f"{path}, column {column!r}: every row has the label {values[0]!r}; a classifier "
                              "needs at least 2 classes")
    return tuple(str(v) for v in values), {v: i for i, v in enumerate(values)}
