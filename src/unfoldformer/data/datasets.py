"""Readers for SST-2 (GLUE) and IMDB (aclImdb v1.0) sentiment data.

Both readers work on the archive directly (nothing is extracted to disk) or on
an already extracted folder; see :mod:`unfoldformer.data.files` for where files
are looked for. Every malformed input raises
:class:`~unfoldformer.data.files.DataFormatError` naming the file and the line
number or archive member.

SST-2: ``train.tsv``/``dev.tsv`` have the header ``sentence<TAB>label``, labels
0/1; ``test.tsv`` has ``index<TAB>sentence`` and no labels (``label=None``).
Sentences are stripped (the GLUE files end each sentence with a space).

IMDB: review files ``aclImdb/{train,test}/{pos,neg}/ID_RATING.txt``; label 1 for
``pos`` (ratings 7-10), 0 for ``neg`` (ratings 1-4); ``train/unsup/ID_0.txt``
are unlabelled (``label=None``). ``<br />`` is replaced by a space and the text
stripped. Examples are ordered by (label, id) with neg < pos < unsup. The file
counts are not checked against 12,500 (a smaller, well-formed folder is read as
is), but each of ``pos`` and ``neg`` must be non-empty and ids must be unique.

Parsed results are cached in memory per (file, modification time, split), so a
second call is instant. :class:`TextExample` is frozen, and each call returns a
new list, so callers cannot alter the cache.
"""

from __future__ import annotations

import functools
import re
import tarfile
import zipfile
import zlib
from dataclasses import dataclass
from pathlib import Path

from .files import DataFormatError, file_record, find_data_file, sha256_file, tree_sha256

__all__ = ["DATASET_NAMES", "EVAL_SPLITS", "LABELLED_SPLITS", "TextExample", "dataset_files", "dataset_record",
           "load_dataset", "load_imdb", "load_sst2"]

SST2_FILE = "SST-2.zip"
IMDB_FILE = "aclImdb_v1.tar.gz"
SST2_SPLITS = ("train", "dev", "test")
IMDB_SPLITS = ("train", "test")
DATASET_FILES = {"sst2": SST2_FILE, "imdb": IMDB_FILE}
#: The labelled held-out split of each data set (SST-2 test has no labels).
EVAL_SPLITS = {"sst2": "dev", "imdb": "test"}
#: The splits of each data set, and those with labels.
SPLITS = {"sst2": SST2_SPLITS, "imdb": IMDB_SPLITS}
LABELLED_SPLITS = {"sst2": ("train", "dev"), "imdb": ("train", "test")}
DATASET_NAMES = {"sst2": "SST-2", "imdb": "IMDB"}

_REVIEW_NAME = re.compile(r"^(\d+)_(\d+)\.txt$")
_IMDB_FOLDERS = {"pos": 1, "neg": 0, "unsup": None}
_RATINGS = {"pos": range(7, 11), "neg": range(1, 5), "unsup": range(0, 1)}


@dataclass(frozen=True)
class TextExample:
    """One text with its label (0 negative, 1 positive, ``None`` if unlabelled)."""

    text: str
    label: int | None


# --------------------------------------------------------------------------- SST-2


def load_sst2(split: str = "train", data_dir: str | Path | None = None) -> list[TextExample]:
    """Read SST-2 ``split`` (``train``, ``dev`` or ``test``; test is unlabelled)."""
    if split not in SST2_SPLITS:
        raise ValueError(f"SST-2 split must be one of {SST2_SPLITS}, got {split!r}")
    source = find_data_file(SST2_FILE, data_dir)
    return list(_load_sst2_cached(*_cache_key(source), split))


def _cache_key(path: Path) -> tuple[str, int]:
    """(resolved path, modification time) so a replaced file is read again."""
    resolved = path.resolve()
    return str(resolved), resolved.stat().st_mtime_ns


@functools.lru_cache(maxsize=16)
def _load_sst2_cached(source: str, mtime_ns: int, split: str) -> tuple[TextExample, ...]:
    path = Path(source)
    member = f"SST-2/{split}.tsv"
    if path.is_dir():
        where = path / f"{split}.tsv"
        if not where.is_file():
            raise DataFormatError(f"{where}: missing file (expected member {member})")
        return _parse_sst2_tsv(where.read_bytes(), str(where), split)
    data = _read_zip_member(path, member)
    return _parse_sst2_tsv(data, f"{path}:{member}", split)


def _read_zip_member(path: Path, member: str) -> bytes:
    try:
        with zipfile.ZipFile(path) as archive:
            if member not in archive.namelist():
                raise DataFormatError(f"{path}: archive member {member} is missing")
            return archive.read(member)
    except (zipfile.BadZipFile, zlib.error, EOFError, OSError) as exc:
        raise DataFormatError(f"{path}: corrupt zip archive (member {member}): {exc}") from exc


def _decode(data: bytes, where: str) -> str:
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = data[: exc.start].count(b"\n") + 1
        raise DataFormatError(f"{where}, line {line}: not valid UTF-8") from exc


def _split_lines(data: bytes, where: str) -> list[str]:
    """Lines of a text file (LF or CRLF), without the final empty line."""
    text = _decode(data, where)
    if not text.strip():
        raise DataFormatError(f"{where}, line 1: file is empty")
    lines = text.split("\n")
    if lines[-1] == "":
        lines.pop()
    return [line.removesuffix("\r") for line in lines]


def _parse_sst2_tsv(data: bytes, where: str, split: str) -> tuple[TextExample, ...]:
    lines = _split_lines(data, where)
    labelled = split != "test"
    expected_header = ["sentence", "label"] if labelled else ["index", "sentence"]
    header = lines[0].split("\t")
    if header != expected_header:
        raise DataFormatError(
            f"{where}, line 1: header {header!r}, expected {'<TAB>'.join(expected_header)!r}"
        )
    parse_row = _parse_labelled_row if labelled else _parse_test_row
    examples = tuple(parse_row(line, f"{where}, line {n}") for n, line in enumerate(lines[1:], 2))
    if not examples:
        raise DataFormatError(f"{where}, line 2: no data rows after the header")
    return examples


def _fields(line: str, where: str) -> tuple[str, str]:
    fields = line.split("\t")
    if len(fields) != 2:
        raise DataFormatError(f"{where}: expected 2 tab-separated fields, found {len(fields)}")
    return fields[0], fields[1]


def _nonempty(text: str, where: str) -> str:
    text = text.strip()
    if not text:
        raise DataFormatError(f"{where}: empty sentence")
    return text


def _parse_labelled_row(line: str, where: str) -> TextExample:
    sentence, label = _fields(line, where)
    if label not in ("0", "1"):
        raise DataFormatError(f"{where}: label {label!r} is not 0 or 1")
    return TextExample(_nonempty(sentence, where), int(label))


def _parse_test_row(line: str, where: str) -> TextExample:
    index, sentence = _fields(line, where)
    if not index.isdigit():
        raise DataFormatError(f"{where}: index {index!r} is not a non-negative integer")
    return TextExample(_nonempty(sentence, where), None)


# --------------------------------------------------------------------------- IMDB


def load_imdb(
    split: str = "test", data_dir: str | Path | None = None, include_unsup: bool = False
) -> list[TextExample]:
    """Read IMDB ``split`` (``train`` or ``test``), ordered by (label, id).

    ``include_unsup=True`` appends the 50,000 unlabelled ``train/unsup`` reviews
    (label ``None``) to the train split; it is ignored for ``test``.
    """
    if split not in IMDB_SPLITS:
        raise ValueError(f"IMDB split must be one of {IMDB_SPLITS}, got {split!r}")
    source = find_data_file(IMDB_FILE, data_dir)
    unsup = include_unsup and split == "train"
    folders = ("neg", "pos", "unsup") if unsup else ("neg", "pos")
    by_folder = _load_imdb_cached(*_cache_key(source), unsup)
    for folder in folders:                   # only the split asked for must be there (train alone is fine)
        if not by_folder[(split, folder)]:
            raise DataFormatError(f"{source}: member aclImdb/{split}/{folder}/ is missing or has no reviews")
    return [example for folder in folders for example in by_folder[(split, folder)]]


@functools.lru_cache(maxsize=4)
def _load_imdb_cached(
    source: str, mtime_ns: int, include_unsup: bool
) -> dict[tuple[str, str], tuple[TextExample, ...]]:
    """All labelled reviews (and optionally unsup), keyed by (split, folder).

    One pass over the archive reads both splits (the pass costs the same either
    way), so asking for the other split afterwards is instant.
    """
    path = Path(source)
    wanted = {(s, f) for s in IMDB_SPLITS for f in ("pos", "neg")}
    if include_unsup:
        wanted.add(("train", "unsup"))
    reader = _read_imdb_folder if path.is_dir() else _read_imdb_tar
    raw = reader(path, wanted)
    return {key: _sorted_examples(raw[key], key) if raw.get(key) else () for key in wanted}


def _review_target(relative: str, wanted: set[tuple[str, str]]) -> tuple[str, str] | None:
    """(split, folder) if ``relative`` (e.g. ``test/pos/1_10.txt``) is a wanted review."""
    parts = relative.split("/")
    if len(parts) == 3 and (parts[0], parts[1]) in wanted:
        return parts[0], parts[1]
    return None


def _parse_review(name: str, data: bytes, folder: str, where: str) -> tuple[int, str]:
    """(id, cleaned text) of one review file; validates name, rating and content."""
    match = _REVIEW_NAME.match(name)
    if match is None:
        raise DataFormatError(f"{where}: file name {name!r} does not match ID_RATING.txt")
    review_id, rating = int(match.group(1)), int(match.group(2))
    if rating not in _RATINGS[folder]:
        raise DataFormatError(f"{where}: rating {rating} is not valid for folder {folder!r}")
    text = _decode(data, where).replace("<br />", " ").strip()
    if not text:
        raise DataFormatError(f"{where}: review file is empty")
    return review_id, text


Reviews = dict[tuple[str, str], dict[int, str]]


def _add_review(raw: Reviews, key: tuple[str, str], name: str, data: bytes, where: str) -> None:
    review_id, text = _parse_review(name, data, key[1], where)
    folder = raw.setdefault(key, {})
    if review_id in folder:
        raise DataFormatError(f"{where}: duplicate review id {review_id} in {key[0]}/{key[1]}")
    folder[review_id] = text


def _read_imdb_tar(path: Path, wanted: set[tuple[str, str]]) -> Reviews:
    """Stream the .tar.gz once and collect the wanted reviews."""
    raw: Reviews = {}
    member = "(archive header)"
    try:
        with tarfile.open(path, "r:gz") as tar:
            for info in tar:
                member = info.name
                relative = member.removeprefix("./").removeprefix("aclImdb/")
                key = _review_target(relative, wanted) if info.isfile() else None
                if key is not None:
                    where = f"{path}: member {member}"
                    _add_review(raw, key, relative.rsplit("/", 1)[1], _read_member(tar, info), where)
            tar.fileobj.read()  # drain to the gzip trailer so truncation is detected
    except (tarfile.TarError, EOFError, zlib.error, OSError) as exc:
        raise DataFormatError(
            f"{path}: truncated or corrupt archive (at member {member}): {exc}"
        ) from exc
    return raw


def _read_member(tar: tarfile.TarFile, info: tarfile.TarInfo) -> bytes:
    handle = tar.extractfile(info)
    if handle is None:
        raise tarfile.ReadError(f"cannot read member {info.name}")
    return handle.read()


def _read_imdb_folder(path: Path, wanted: set[tuple[str, str]]) -> Reviews:
    """Read the wanted reviews from an extracted ``aclImdb/`` folder."""
    raw: Reviews = {}
    for key in sorted(wanted):
        folder = path / key[0] / key[1]
        if not folder.is_dir():
            continue  # reported as missing by load_imdb
        for file in folder.iterdir():
            if file.is_file():
                _add_review(raw, key, file.name, file.read_bytes(), str(file))
    return raw


def _sorted_examples(reviews: dict[int, str], key: tuple[str, str]) -> tuple[TextExample, ...]:
    split, folder = key
    label = _IMDB_FOLDERS[folder]
    return tuple(TextExample(reviews[i], label) for i in sorted(reviews))


# --------------------------------------------------------------------------- generic


def _dataset_key(name: str) -> str:
    key = name.lower().replace("-", "")
    if key not in DATASET_FILES:
        raise ValueError(f"unknown dataset {name!r}; expected one of {sorted(DATASET_FILES)}")
    return key


def load_dataset(name: str, split: str, data_dir: str | Path | None = None) -> list[TextExample]:
    """``load_sst2`` or ``load_imdb`` by name (``"sst2"`` or ``"imdb"``).

    SST-2 ``test`` is allowed but unlabelled (all labels ``None``).
    """
    if _dataset_key(name) == "sst2":
        return load_sst2(split, data_dir)
    return load_imdb(split, data_dir)


def dataset_files(name: str, data_dir: str | Path | None = None) -> dict[str, str]:
    """``{path: sha256}`` of the file a data set is read from, for reports.

    For an extracted folder the value is ``"tree:<sha256>"``: the sha256 of the
    text with one line ``<sha256 of file><two spaces><path>`` per file (paths
    start with the folder name, sorted, each line newline-terminated), the
    digest used in ``shared/data/README.md``.
    """
    source = find_data_file(DATASET_FILES[_dataset_key(name)], data_dir)
    if source.is_dir():
        return {str(source): "tree:" + tree_sha256(source)}
    return {str(source): sha256_file(source)}


def dataset_record(name: str, data_dir: str | Path | None = None) -> dict:
    """``{"path", "bytes", "sha256"}`` of the file a data set is read from (provenance of a run)."""
    return file_record(find_data_file(DATASET_FILES[_dataset_key(name)], data_dir, download=False))
