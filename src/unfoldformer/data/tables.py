"""Your own labelled texts: CSV, TSV, JSON lines, JSON, Parquet and Hugging Face `datasets` folders.

:func:`read_table` reads two columns (text and label) of one file; the format comes from the
extension (``.csv``, ``.tsv``, ``.jsonl``, ``.json``, ``.parquet``) or, for a folder, from the
``state.json`` that ``datasets.Dataset.save_to_disk`` writes. :func:`load_labelled_files` reads a
training file and an optional evaluation file, turns the labels into class indices and, without an
evaluation file, holds out a seeded share of the training rows. :func:`read_labelled_file` reads a file
that a trained classifier is scored on, matching its labels to the classifier's class names.

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

Data are read exactly as written. Records end at a line feed only (a CR before it is dropped): a
lone CR, U+0085 or U+2028 inside a text is a character of it. CSV quoting follows RFC 4180 strictly
(a field that opens a quote closes it and is followed by the delimiter or the line's end; anything
else is an error naming the row); a TSV file is read without quoting, so a text keeps its quotes,
unless the file is quoted consistently (every header name in quotes), and then strictly as CSV is.
A column (or JSON key) given twice is refused in every format; so is a text column equal to the
label column, and a `datasets` folder whose `state.json` names a file outside the folder.

Rows are numbered from 1 in file order, the header not counted (for CSV/TSV "row 3" is the third
record; for JSON lines, the third non-blank line). Labels are strings or integers, compared as
written (integral floats count as integers; a CSV/TSV label column counts as integers only when
every label is an integer written plainly, `0`, `7`, `-3`: then ``1`` in a CSV and ``1`` in JSON are
the same label, while ``01`` and ``1`` are two labels); the classes are the distinct labels of the
training file, integers in numeric order, strings in code-point order (the two are not mixed). Every problem raises
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

__all__ = ["FORMATS", "LabelledTexts", "load_labelled_files", "read_labelled_file", "read_table", "table_format"]

#: Extension -> format name.
FORMATS = {".csv": "csv", ".tsv": "tsv", ".jsonl": "jsonl", ".json": "json", ".parquet": "parquet"}
_INTEGER = re.compile(r"-?(0|[1-9][0-9]*)")                 # a plainly written integer: 7, -3 (not 07, +7, " 7")


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
            splits = _metadata(path / "dataset_dict.json").get("splits", [])
            splits = ", ".join(map(str, splits)) if isinstance(splits, list) else "?"
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
    if text_column == label_column:
        raise DataFormatError(f"{path}: the text column and the label column are both {text_column!r}; "
                              "choose two columns (--data.text_column / --data.label_column)")
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
    from_text = fmt in ("csv", "tsv") and all(isinstance(r[1], str) and _INTEGER.fullmatch(r[1]) for r in rows)
    for number, (text, label) in enumerate(rows, 1):
        where = f"{path}, row {number}"
        if not isinstance(text, str) or not text.strip():
            what = "no text" if text is None or isinstance(text, str) else f"not a text ({text!r})"
            raise DataFormatError(f"{where}, column {text_column!r}: {what}")
        texts.append(text)
        labels.append(_label_value(label, f"{where}, column {label_column!r}", from_text))
    return texts, labels


def _label_value(label, where: str, from_text: bool):
    """An int or a str label; an error for a missing one or another type. `from_text`: the column's texts
    are all plain integers, read as integers."""
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
        return int(label) if from_text else label
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


def _duplicate(path: Path, names, row: int | None = None) -> None:
    """DataFormatError for a column name given twice (the same message for every format)."""
    seen = set()
    for name in names:
        if name in seen:
            at = f", row {row}" if row is not None else ""
            raise DataFormatError(f"{path}{at}: column {name!r} is given twice; keep one")
        seen.add(name)


def _lines(text: str) -> list[str]:
    """The lines of a text split at line feeds only (U+0085, U+2028 or a lone CR stay inside a field)."""
    lines = text.split("\n")
    return lines[:-1] if lines[-1] == "" else lines


def _delimited_records(path: Path, text: str, delimiter: str) -> list[tuple[int, list[str]]]:
    """(line number, fields) of each record: quoted strictly (CSV, or a TSV whose header is all quoted),
    else split at the delimiter as written."""
    lines = _lines(text)
    header = lines[0].removesuffix("\r").split(delimiter) if lines else []
    quoted = delimiter == "," or all(len(h) >= 2 and h[0] == h[-1] == '"' for h in header)
    if not quoted:
        return [(n, line.removesuffix("\r").split(delimiter)) for n, line in enumerate(lines, 1)]
    lone_cr = next(chr(c) for c in range(0xE000, 0xF900) if chr(c) not in text)   # a lone CR, kept aside
    reader = csv.reader((re.sub("\r(?!$)", lone_cr, line) + "\n" for line in lines), delimiter=delimiter,
                        strict=True)
    records, row = [], 0
    try:
        while True:
            first = reader.line_num + 1
            fields = next(reader, None)
            if fields is None:
                return records
            row += 1
            records.append((first, [f.replace(lone_cr, "\r") for f in fields]))
    except csv.Error as exc:
        kind = "CSV" if delimiter == "," else "quoted TSV"
        raise DataFormatError(f"{path}, row {row} (line {first}): not valid {kind} ({exc}); a field that opens a "
                              "quote must close it right before the delimiter or the line's end, with quotes "
                              "inside it doubled") from None


def _read_delimited(path: Path, delimiter: str, columns: tuple[str, str]) -> list[tuple]:
    records = _delimited_records(path, _decoded(path), delimiter)
    if not records:
        raise DataFormatError(f"{path}: the file is empty (no header, no rows)")
    header = records[0][1]
    _duplicate(path, header)
    for column in columns:
        if column not in header:
            raise _missing(path, column, header)
    where = [header.index(c) for c in columns]
    rows = []
    for number, (_, fields) in enumerate(records[1:], 1):
        if fields in ([], [""]):
            continue                                           # a blank line
        if len(fields) != len(header):
            raise DataFormatError(f"{path}, row {number}: {len(fields)} fields, but the header has "
                                  f"{len(header)}")
        rows.append(tuple(fields[i] for i in where))
    return rows


def _json_object(pairs: list[tuple[str, object]]) -> dict:
    keys = [k for k, _ in pairs]
    if len(set(keys)) != len(keys):
        raise _DuplicateKey(next(k for i, k in enumerate(keys) if k in keys[:i]))
    return dict(pairs)


class _DuplicateKey(ValueError):
    pass


def _read_json(path: Path, columns: tuple[str, str]) -> list[tuple]:
    """JSON lines (one object per line), or a JSON array of objects (``.json`` may be either)."""
    text = _decoded(path)
    stripped = text.lstrip()
    if path.suffix.lower() == ".json" and stripped.startswith("["):
        try:
            records = json.loads(text, object_pairs_hook=_json_object)
        except _DuplicateKey as dup:
            raise DataFormatError(f"{path}: column {str(dup)!r} is given twice; keep one") from None
        except ValueError as exc:
            raise DataFormatError(f"{path}: not valid JSON ({exc})") from None
        numbered = list(enumerate(records, 1))
    else:
        numbered, row = [], 0
        for line_no, line in enumerate(_lines(text), 1):
            if not line.strip():
                continue
            row += 1
            try:
                numbered.append((row, json.loads(line, object_pairs_hook=_json_object)))
            except _DuplicateKey as dup:
                raise DataFormatError(f"{path}, row {row}: column {str(dup)!r} is given twice; keep one") from None
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
            _duplicate(path, pa.parquet.ParquetFile(path).schema_arrow.names)
            table = pa.parquet.read_table(path)
        else:
            parts = _data_files(path)
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
    _duplicate(path, table.column_names)
    for column in columns:
        if column not in table.column_names:
            raise _missing(path, column, table.column_names)
    values = [table.column(c).to_pylist() for c in columns]
    names = _class_label_names(path, columns[1]) if fmt == "datasets" else None
    if names is not None:                                          # a ClassLabel column: its names are the labels
        values[1] = [names[v] if isinstance(v, int) and 0 <= v < len(names) else v for v in values[1]]
    return list(zip(*values))


def _metadata(path: Path) -> dict:
    """A `datasets` metadata file (a JSON object); DataFormatError in one line if it is damaged."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"), object_pairs_hook=_json_object)
    except (OSError, ValueError) as exc:
        raise DataFormatError(f"{path}: damaged datasets metadata ({str(exc).splitlines()[0]})") from None
    if not isinstance(data, dict):
        raise DataFormatError(f"{path}: damaged datasets metadata (not a JSON object)")
    return data


def _data_files(folder: Path) -> list[Path]:
    """The Arrow files `state.json` lists, each inside `folder` (a name leading outside is refused)."""
    entries = _metadata(folder / "state.json").get("_data_files")
    if not isinstance(entries, list) or not all(isinstance(e, dict) and isinstance(e.get("filename"), str)
                                                for e in entries):
        raise DataFormatError(f"{folder / 'state.json'}: damaged datasets metadata (_data_files must list "
                              "{\"filename\": NAME} objects)")
    if not entries:
        raise DataFormatError(f"{folder}: state.json lists no data files")
    inside = folder.resolve()
    for entry in entries:
        part = (folder / entry["filename"]).resolve()
        if not part.is_relative_to(inside) or part == inside:
            raise DataFormatError(f"{folder / 'state.json'}: data file {entry['filename']!r} lies "
                                  "outside the folder; a datasets folder holds its own files")
    return [folder / e["filename"] for e in entries]


def _class_label_names(folder: Path, column: str) -> list[str] | None:
    """The names of a `datasets` ClassLabel column (from `dataset_info.json`), or None; names given twice
    are refused (they would merge two classes)."""
    if not (folder / "dataset_info.json").is_file():
        return None
    features = _metadata(folder / "dataset_info.json").get("features")
    feature = features.get(column) if isinstance(features, dict) else None
    if not isinstance(feature, dict) or feature.get("_type") != "ClassLabel":
        return None
    names = feature.get("names")
    if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
        raise DataFormatError(f"{folder / 'dataset_info.json'}: damaged datasets metadata (the ClassLabel "
                              f"names of {column!r} must be a list of strings)")
    if len(set(names)) != len(names):
        twice = next(n for i, n in enumerate(names) if n in names[:i])
        raise DataFormatError(f"{folder / 'dataset_info.json'}: ClassLabel {column!r} names {twice!r} twice; "
                              "each class needs its own name")
    return names


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
        eval_labels = _class_indices(eval_raw, index, eval_file, label_column, f"does not occur in the training "
                                     f"file {train_file} (its labels: {', '.join(names)})")
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


def read_labelled_file(path: str | Path, label_names: tuple[str, ...], text_column: str = "text",
                       label_column: str = "label") -> LabelledTexts:
    """Texts and class indices of a labelled file scored by a trained classifier whose classes are
    `label_names`: each label is matched by name (as written; an integer label by its digits, so `1` in
    a CSV and in JSON both match the class named ``1``). Any subset of the classes may occur; a label
    that is none of them is a DataFormatError naming it and its row."""
    texts, raw = read_table(path, text_column, label_column)
    index = {name: i for i, name in enumerate(label_names)}
    labels = _class_indices(raw, index, path, label_column, f"is not one of the run's classes "
                            f"({', '.join(label_names)})", key=str)
    return LabelledTexts(texts, labels, tuple(label_names))


def _class_indices(raw: list, index: dict, path, column: str, unknown: str, key=lambda v: v) -> list[int]:
    """`index[key(label)]` of each label; DataFormatError at the first row whose label is not in `index`."""
    for number, value in enumerate(raw, 1):
        if key(value) not in index:
            raise DataFormatError(f"{path}, row {number}, column {column!r}: label {value!r} {unknown}")
    return [index[key(value)] for value in raw]


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
