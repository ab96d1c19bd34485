"""Locating, downloading and checksumming the data files.

The two data sets are used in the layout of their public releases:

* ``SST-2.zip`` (GLUE SST-2) with members ``SST-2/{train,dev,test}.tsv``;
* ``aclImdb_v1.tar.gz`` (Large Movie Review Dataset v1.0) with members
  ``aclImdb/{train,test}/{pos,neg}/ID_RATING.txt``.

:func:`find_data_file` looks for a file, or for its extracted folder
(``SST-2/`` or ``aclImdb/``):

1. in the ``data_dir`` argument only, when one is given (``--data-dir`` on the
   command line, ``--data.data_dir`` for ``train``); a ``data_dir`` that does not
   exist is an error, never a silent fall-through to another folder (with
   ``download=True`` a missing file is downloaded, or taken from an earlier
   verified download in the cache);
2. otherwise in the folder named by the environment variable ``UNFOLDFORMER_DATA``,
3. then in the user cache ``~/.cache/unfoldformer`` (or ``$UNFOLDFORMER_CACHE``).

In each folder the archive is preferred over the extracted folder. A file that
is found is not checksummed (the readers validate the content instead);
:func:`sha256_file` gives the checksum and :func:`file_record` the
``{path, bytes, sha256}`` record that runs store as their data provenance.

If nothing is found and ``download=True``, the file is downloaded from
:data:`DATA_URLS` into a temporary file in the cache folder, its size and sha256
are checked against :data:`KNOWN_CHECKSUMS`, and only then is it renamed into
place with :func:`os.replace`; a failed or rejected download leaves nothing
behind. This cache folder is the only place the library writes to.

``SST-2.zip`` special case: the GLUE server may serve a zip other than the
reproducibly packed copy listed here. A download with an unknown sha256 is
accepted for ``SST-2.zip`` only if it is a valid zip holding
``SST-2/train.tsv``, ``SST-2/dev.tsv`` and ``SST-2/test.tsv``.
"""

from __future__ import annotations

import functools
import hashlib
import os
import tempfile
import urllib.request
import zipfile
from pathlib import Path
from typing import IO

from tqdm import tqdm

from ..errors import UnfoldformerError
from ..utils import file_sha256

__all__ = [
    "DATA_URLS",
    "EXTRACTED_FOLDERS",
    "KNOWN_CHECKSUMS",
    "DataFormatError",
    "DataNotFoundError",
    "cache_dir",
    "file_record",
    "find_data_file",
    "sha256_file",
    "verify_installed_files",
]

ENV_DATA = "UNFOLDFORMER_DATA"
ENV_CACHE = "UNFOLDFORMER_CACHE"

#: Download address of each data file (module level so tests can monkeypatch it).
DATA_URLS: dict[str, str] = {
    "SST-2.zip": "https://dl.fbaipublicfiles.com/glue/data/SST-2.zip",
    "aclImdb_v1.tar.gz": "https://ai.stanford.edu/~amaas/data/sentiment/aclImdb_v1.tar.gz",
}

#: Accepted downloads: file name -> {sha256: size in bytes}.
KNOWN_CHECKSUMS: dict[str, dict[str, int]] = {
    "SST-2.zip": {
        "9a8b8c8cb7e76d1a4adcac192c417d492260fc37b37d1e18c12aee188287997c": 1_565_139,
    },
    "aclImdb_v1.tar.gz": {
        # reproducibly packed copy (shared/data)
        "6bacfe1b4ee9469bfb44e77173f0e16bf9a2d19717657304f79f111f0b7f0cdc": 56_795_133,
        # original download from ai.stanford.edu
        "c40f74a18d3b61f90feba1e17730e0d38e8b97c05fde7008942e91923d1658fe": 84_125_825,
    },
}

#: Name of the folder each archive extracts to.
EXTRACTED_FOLDERS: dict[str, str] = {"SST-2.zip": "SST-2", "aclImdb_v1.tar.gz": "aclImdb"}

SST2_MEMBERS = ("SST-2/train.tsv", "SST-2/dev.tsv", "SST-2/test.tsv")
_CHUNK = 1 << 20


class DataNotFoundError(UnfoldformerError, FileNotFoundError):
    """A data file is neither present locally nor downloadable."""


class DataFormatError(UnfoldformerError, ValueError):
    """A data file exists but its content is not what the reader expects."""


def cache_dir() -> Path:
    """The user cache folder: ``$UNFOLDFORMER_CACHE`` or ``~/.cache/unfoldformer``."""
    override = os.environ.get(ENV_CACHE)
    if override:
        return Path(override).expanduser()
    return Path.home() / ".cache" / "unfoldformer"


def sha256_file(path: str | Path) -> str:
    """Hex sha256 of a file (memoised per path, size and modification time)."""
    resolved = Path(path).resolve()
    stat = resolved.stat()
    return _sha256_cached(str(resolved), stat.st_size, stat.st_mtime_ns)


@functools.lru_cache(maxsize=64)
def _sha256_cached(path: str, size: int, mtime_ns: int) -> str:
    return file_sha256(path)


def file_record(path: str | Path) -> dict:
    """``{"path", "bytes", "sha256"}`` of a data file, or of a folder (total bytes, ``tree:`` digest
    of its files: see :func:`tree_sha256`), for provenance records."""
    resolved = Path(path).resolve()
    if resolved.is_dir():
        size = sum(p.stat().st_size for p in resolved.rglob("*") if p.is_file())
        return {"path": str(resolved), "bytes": size, "sha256": "tree:" + tree_sha256(resolved)}
    return {"path": str(resolved), "bytes": resolved.stat().st_size, "sha256": sha256_file(resolved)}


def verify_installed_files(distribution: str, paths: list[Path]) -> None:
    """Raise DataFormatError if a file that pip installed with package ``distribution`` no longer has
    the sha256 of the package's RECORD (corrupt or altered after installation). Files without a
    record entry, and packages not installed by pip, are not checked."""
    import base64
    import importlib.metadata

    try:
        records = importlib.metadata.files(distribution) or []
    except importlib.metadata.PackageNotFoundError:
        return
    recorded = {Path(r.locate()).resolve(): r.hash for r in records if r.hash and r.hash.mode == "sha256"}
    for path in paths:
        digest = recorded.get(Path(path).resolve())
        if digest is None:
            continue
        want = base64.urlsafe_b64decode(digest.value + "=" * (-len(digest.value) % 4)).hex()
        if sha256_file(path) != want:
            raise DataFormatError(f"{path}: sha256 {sha256_file(path)[:16]}… differs from {want[:16]}… recorded "
                                  f"when {distribution} was installed: the file is corrupt or was altered; "
                                  f"reinstall {distribution}")


def _check_name(name: str) -> None:
    if name not in DATA_URLS:
        raise ValueError(f"unknown data file {name!r}; expected one of {sorted(DATA_URLS)}")


def search_dirs(data_dir: str | Path | None = None) -> list[Path]:
    """The folders searched, in order: ``data_dir`` alone when given (it must exist), else
    ``$UNFOLDFORMER_DATA`` and the cache."""
    if data_dir is not None:
        folder = Path(data_dir).expanduser()
        if not folder.exists():
            raise DataNotFoundError(f"data folder {str(folder)!r} does not exist (given as the data folder: "
                                    "--data-dir, or --data.data_dir for train); nothing else is searched when "
                                    "a folder is given")
        return [folder]
    dirs = []
    env = os.environ.get(ENV_DATA)
    if env:
        dirs.append(Path(env).expanduser())
    dirs.append(cache_dir())
    return dirs


def _candidates(folder: Path, name: str) -> list[Path]:
    """Paths in ``folder`` that hold ``name``: the archive, its extracted folder,
    or ``folder`` itself when it *is* the extracted folder or the archive."""
    extracted = EXTRACTED_FOLDERS[name]
    found = [folder / name, folder / extracted]
    if folder.name in (name, extracted):
        found.append(folder)
    return found


def _locate(name: str, dirs: list[Path]) -> Path | None:
    for folder in dirs:
        for candidate in _candidates(folder, name):
            if candidate.name == name and candidate.is_file():
                return candidate
            if candidate.name != name and candidate.is_dir():
                return candidate
    return None


def _not_found_message(name: str, dirs: list[Path], reason: str) -> str:
    """One line: what was searched, where to get the file and how to point to it."""
    searched = ", ".join(str(d) for d in dirs)
    return (
        f"data file {name!r} not found ({reason}); searched {searched} for the archive {name} or "
        f"its folder {EXTRACTED_FOLDERS[name]}/. Download it from {DATA_URLS[name]} into a folder and "
        f"pass that folder as the data folder (--data-dir on the command line, --data.data_dir for "
        f"train, data_dir=... in Python), or set {ENV_DATA}, or place it in the cache {cache_dir()}"
    )


def find_data_file(name: str, data_dir: str | Path | None = None, download: bool = True) -> Path:
    """Path of the archive ``name`` (or of its extracted folder).

    ``name`` is ``"SST-2.zip"`` or ``"aclImdb_v1.tar.gz"``. Search order and the
    download procedure are described in the module docstring.

    Raises:
        DataNotFoundError: not found and ``download`` is false or fails.
        DataFormatError: the download arrived but failed the checksum check.
    """
    _check_name(name)
    dirs = search_dirs(data_dir)
    found = _locate(name, dirs)
    if found is not None:
        return found
    if not download:
        raise DataNotFoundError(_not_found_message(name, dirs, "download=False"))
    downloaded = _locate(name, [cache_dir()])                 # an earlier verified download
    return downloaded if downloaded is not None else download_data_file(name, dirs)


def download_data_file(name: str, dirs: list[Path] | None = None) -> Path:
    """Download ``name`` into the cache folder, verify it, and return its path."""
    _check_name(name)
    dirs = dirs if dirs is not None else search_dirs()
    target_dir = cache_dir()
    url = DATA_URLS[name]
    try:
        target_dir.mkdir(parents=True, exist_ok=True)
        tmp_path = _download_to_temp(url, target_dir, name)
    except OSError as exc:  # URLError, HTTPError, timeouts and disk errors
        raise DataNotFoundError(
            _not_found_message(name, dirs, f"download from {url} failed: {exc}")
        ) from exc
    try:
        _verify_download(name, tmp_path)
        target = target_dir / name
        os.replace(tmp_path, target)
    except BaseException:
        tmp_path.unlink(missing_ok=True)
        raise
    return target


def _download_to_temp(url: str, folder: Path, name: str) -> Path:
    """Stream ``url`` into a new temporary file in ``folder`` with a progress bar."""
    handle = tempfile.NamedTemporaryFile(dir=folder, prefix=f".{name}.", suffix=".part", delete=False)
    tmp_path = Path(handle.name)
    try:
        with handle, urllib.request.urlopen(url, timeout=60) as response:
            total = int(response.headers.get("Content-Length") or 0) or None
            _copy_with_progress(response, handle, total, name)
    except BaseException:
        tmp_path.unlink(missing_ok=True)
        raise
    return tmp_path


def _copy_with_progress(source: IO[bytes], dest: IO[bytes], total: int | None, label: str) -> None:
    with tqdm(total=total, unit="B", unit_scale=True, desc=label, disable=None) as bar:
        for chunk in iter(lambda: source.read(_CHUNK), b""):
            dest.write(chunk)
            bar.update(len(chunk))


def _verify_download(name: str, path: Path) -> None:
    """Accept a download whose (sha256, size) is known; see module docstring."""
    digest = sha256_file(path)
    size = path.stat().st_size
    known = KNOWN_CHECKSUMS[name]
    if known.get(digest) == size:
        return
    if name == "SST-2.zip" and _is_sst2_zip(path):
        return
    expected = ", ".join(f"sha256 {h} ({n:,} bytes)" for h, n in known.items())
    raise DataFormatError(
        f"downloaded {name} from {DATA_URLS[name]} has sha256 {digest} ({size:,} bytes); "
        f"expected {expected}. The download was discarded. Put a verified copy of {name} "
        f"into a folder given by data_dir / --data-dir or ${ENV_DATA}."
    )


def _is_sst2_zip(path: Path) -> bool:
    """True if ``path`` is an intact zip with the three SST-2 TSV members."""
    try:
        with zipfile.ZipFile(path) as archive:
            names = set(archive.namelist())
            return all(m in names for m in SST2_MEMBERS) and archive.testzip() is None
    except (zipfile.BadZipFile, OSError):
        return False


def tree_sha256(folder: str | Path) -> str:
    """Digest of all files under ``folder`` (see :func:`unfoldformer.data.datasets.dataset_files`)."""
    folder = Path(folder)
    files = (p for p in folder.rglob("*") if p.is_file())
    lines = [f"{sha256_file(p)}  {p.relative_to(folder.parent).as_posix()}\n" for p in files]
    lines.sort(key=lambda line: line.split("  ", 1)[1])
    return hashlib.sha256("".join(lines).encode("utf-8")).hexdigest()
