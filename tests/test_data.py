"""Tests for unfoldformer.data.files and unfoldformer.data.datasets."""

from __future__ import annotations

import hashlib
import io
import os
import tarfile
import time
import zipfile
from pathlib import Path

import pytest

from unfoldformer.data import (
    DataFormatError,
    DataNotFoundError,
    TextExample,
    dataset_files,
    find_data_file,
    load_dataset,
    load_imdb,
    load_sst2,
    sha256_file,
)
from unfoldformer.data import files as files_module

SST2_SHA = "9a8b8c8cb7e76d1a4adcac192c417d492260fc37b37d1e18c12aee188287997c"
GOOD_TSV = {
    "train.tsv": "sentence\tlabel\nfine film \t1\nbad film \t0\n",
    "dev.tsv": "sentence\tlabel\ngood \t1\nawful \t0\nok \t1\n",
    "test.tsv": "index\tsentence\n0\tsome text\n1\tmore text\n",
}
GOOD_REVIEWS = {
    "test/pos/1_8.txt": "Second positive.",
    "test/pos/0_10.txt": "Great<br /><br />film.",
    "test/neg/0_1.txt": "Terrible.",
    "test/neg/10_3.txt": "Poor film ",
    "train/pos/0_7.txt": "Nice.",
    "train/neg/0_2.txt": "Dull.",
    "train/unsup/1_0.txt": "Unrated B.",
    "train/unsup/0_0.txt": "Unrated A.",
}


@pytest.fixture(autouse=True)
def isolated_cache(tmp_path_factory, monkeypatch) -> Path:
    """Private cache folder, no $UNFOLDFORMER_DATA, and no network: downloads
    point at a file that does not exist unless a test says otherwise."""
    cache = tmp_path_factory.mktemp("cache")
    monkeypatch.setenv("UNFOLDFORMER_CACHE", str(cache))
    monkeypatch.delenv("UNFOLDFORMER_DATA", raising=False)
    missing = (cache / "no-such-file").as_uri()
    monkeypatch.setattr(files_module, "DATA_URLS", dict.fromkeys(files_module.DATA_URLS, missing))
    return cache


def write_sst2_zip(folder: Path, tsv: dict[str, str | None]) -> Path:
    """SST-2.zip with members SST-2/<name>; a value of None leaves the member out."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "SST-2.zip"
    with zipfile.ZipFile(path, "w") as archive:
        for name, text in {**GOOD_TSV, **tsv}.items():
            if text is not None:
                archive.writestr(f"SST-2/{name}", text)
    return path


def write_imdb_tar(folder: Path, reviews: dict[str, str]) -> Path:
    """aclImdb_v1.tar.gz with members aclImdb/<relative path>."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "aclImdb_v1.tar.gz"
    with tarfile.open(path, "w:gz") as tar:
        for relative, text in sorted(reviews.items()):
            data = text.encode("utf-8")
            info = tarfile.TarInfo(f"aclImdb/{relative}")
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return path


def write_imdb_folder(folder: Path, reviews: dict[str, str]) -> Path:
    root = folder / "aclImdb"
    for relative, text in reviews.items():
        (root / relative).parent.mkdir(parents=True, exist_ok=True)
        (root / relative).write_text(text, encoding="utf-8")
    return root


# --------------------------------------------------------------------------- SST-2, real data


def test_sst2_real_counts_and_labels(data_dir):
    train, dev, test = (load_sst2(split, data_dir) for split in ("train", "dev", "test"))
    assert (len(train), len(dev), len(test)) == (67_349, 872, 1_821)
    assert sum(e.label for e in train) == 37_569
    assert sum(e.label == 1 for e in dev) == 444 and sum(e.label == 0 for e in dev) == 428
    assert train[0] == TextExample("hide new secretions from the parental units", 0)
    assert all(e.label is None for e in test)
    for example in train + dev + test:
        assert example.text and example.text == example.text.strip()


def test_sst2_extracted_folder_matches_zip(data_dir, tmp_path):
    with zipfile.ZipFile(data_dir / "SST-2.zip") as archive:
        archive.extractall(tmp_path)
    assert find_data_file("SST-2.zip", tmp_path, download=False) == tmp_path / "SST-2"
    for split in ("train", "dev", "test"):
        assert load_sst2(split, tmp_path) == load_sst2(split, data_dir)
    assert load_sst2("dev", tmp_path / "SST-2") == load_sst2("dev", data_dir)


def test_load_dataset_and_files(data_dir):
    assert load_dataset("sst2", "dev", data_dir) == load_sst2("dev", data_dir)
    assert all(e.label is None for e in load_dataset("sst2", "test", data_dir))
    assert dataset_files("sst2", data_dir) == {str(data_dir / "SST-2.zip"): SST2_SHA}
    with pytest.raises(ValueError, match="unknown dataset"):
        load_dataset("mnist", "train", data_dir)
    with pytest.raises(ValueError, match="split"):
        load_sst2("validation", data_dir)


# --------------------------------------------------------------------------- IMDB, real data


def test_imdb_real_test_split_and_cache(data_dir):
    test = load_imdb("test", data_dir)
    assert len(test) == 25_000
    assert sum(e.label == 1 for e in test) == 12_500 and sum(e.label == 0 for e in test) == 12_500
    assert [e.label for e in test] == sorted(e.label for e in test)  # neg first, then pos
    assert test[0].text.startswith("Once again Mr. Costner has dragged out a movie")
    assert not any("<br />" in e.text for e in test)
    assert all(e.text == e.text.strip() for e in test)
    start = time.perf_counter()
    again = load_imdb("test", data_dir)
    train = load_imdb("train", data_dir)  # read in the same single pass
    assert time.perf_counter() - start < 0.5
    assert again == test and again is not test
    assert len(train) == 25_000 and sum(e.label for e in train) == 12_500
    assert load_dataset("imdb", "test", data_dir) == test


# --------------------------------------------------------------------------- IMDB, small archives


def test_imdb_small_archive_and_folder_agree(tmp_path):
    archive_dir = write_imdb_tar(tmp_path / "a", GOOD_REVIEWS).parent
    folder_dir = write_imdb_folder(tmp_path / "f", GOOD_REVIEWS).parent
    expected_test = [
        TextExample("Terrible.", 0),
        TextExample("Poor film", 0),
        TextExample("Great  film.", 1),
        TextExample("Second positive.", 1),
    ]
    for where in (archive_dir, folder_dir):
        assert load_imdb("test", where) == expected_test
        assert [e.label for e in load_imdb("train", where)] == [0, 1]
        train_all = load_imdb("train", where, include_unsup=True)
        assert [(e.text, e.label) for e in train_all[2:]] == [("Unrated A.", None), ("Unrated B.", None)]


@pytest.mark.parametrize("cut", [0.5, 30, 4])  # 4: only the gzip size trailer
def test_imdb_truncated_archive(tmp_path, cut):
    path = write_imdb_tar(tmp_path, {**GOOD_REVIEWS, "test/pos/2_9.txt": "x" * 5000})
    data = path.read_bytes()
    keep = int(len(data) * cut) if isinstance(cut, float) else len(data) - cut
    path.write_bytes(data[:keep])
    with pytest.raises(DataFormatError, match=r"aclImdb_v1\.tar\.gz.*(truncated|corrupt).*member"):
        load_imdb("test", tmp_path)


@pytest.mark.parametrize(
    ("reviews", "pattern"),
    [
        ({**GOOD_REVIEWS, "test/pos/abc.txt": "x"}, r"member aclImdb/test/pos/abc\.txt.*ID_RATING"),
        ({**GOOD_REVIEWS, "test/neg/5_9.txt": "x"}, r"member aclImdb/test/neg/5_9\.txt.*rating 9"),
        ({**GOOD_REVIEWS, "test/neg/7_2.txt": ""}, r"member aclImdb/test/neg/7_2\.txt.*empty"),
        (
            {k: v for k, v in GOOD_REVIEWS.items() if not k.startswith("test/neg")},
            r"aclImdb/test/neg/ is missing",
        ),
    ],
)
def test_imdb_malformed_archive(tmp_path, reviews, pattern):
    write_imdb_tar(tmp_path, reviews)
    with pytest.raises(DataFormatError, match=r"aclImdb_v1\.tar\.gz.*" + pattern):
        load_imdb("test", tmp_path)


def test_imdb_malformed_folder(tmp_path):
    write_imdb_folder(tmp_path, {**GOOD_REVIEWS, "test/pos/review.txt": "x"})
    with pytest.raises(DataFormatError, match=r"test/pos/review\.txt.*ID_RATING"):
        load_imdb("test", tmp_path)


# --------------------------------------------------------------------------- SST-2, small archives


@pytest.mark.parametrize(
    ("tsv", "pattern"),
    [
        ({"dev.tsv": None}, r"SST-2\.zip: archive member SST-2/dev\.tsv is missing"),
        ({"dev.tsv": "sentence\tlabel\ngood \t1\nbad \t0\textra\n"}, r"dev\.tsv, line 3: .*found 3"),
        ({"dev.tsv": "sentence\tlabel\ngood \t1\nbad \t2\n"}, r"dev\.tsv, line 3: label '2'"),
        ({"dev.tsv": "sentence\tlabel\ngood \t1\nno tab here\n"}, r"dev\.tsv, line 3: .*found 1"),
        ({"dev.tsv": ""}, r"dev\.tsv, line 1: file is empty"),
        ({"dev.tsv": "sentence\tlabel\n"}, r"dev\.tsv, line 2: no data rows"),
        ({"dev.tsv": "text\tlabel\ngood \t1\n"}, r"dev\.tsv, line 1: header"),
        ({"dev.tsv": "sentence\tlabel\n \t1\n"}, r"dev\.tsv, line 2: empty sentence"),
    ],
)
def test_sst2_malformed_zip(tmp_path, tsv, pattern):
    write_sst2_zip(tmp_path, tsv)
    with pytest.raises(DataFormatError, match=pattern):
        load_sst2("dev", tmp_path)


def test_sst2_malformed_test_and_corrupt_zip(tmp_path):
    write_sst2_zip(tmp_path / "a", {"test.tsv": "index\tsentence\nx\tsome text\n"})
    with pytest.raises(DataFormatError, match=r"test\.tsv, line 2: index 'x'"):
        load_sst2("test", tmp_path / "a")
    (tmp_path / "b").mkdir()
    (tmp_path / "b" / "SST-2.zip").write_bytes(b"PK\x03\x04 not really a zip")
    with pytest.raises(DataFormatError, match=r"SST-2\.zip: corrupt zip"):
        load_sst2("train", tmp_path / "b")


def test_sst2_folder_missing_and_bad_file(tmp_path):
    folder = tmp_path / "SST-2"
    folder.mkdir()
    (folder / "train.tsv").write_text("sentence\tlabel\ngood \t1\n")
    with pytest.raises(DataFormatError, match=r"dev\.tsv: missing file"):
        load_sst2("dev", tmp_path)
    (folder / "dev.tsv").write_text("sentence\tlabel\ngood \tpositive\n")
    with pytest.raises(DataFormatError, match=r"SST-2/dev\.tsv, line 2: label 'positive'"):
        load_sst2("dev", tmp_path)


# --------------------------------------------------------------------------- find_data_file


def test_search_order(tmp_path, monkeypatch, isolated_cache):
    explicit, env = tmp_path / "explicit", tmp_path / "env"
    for folder in (explicit, env, isolated_cache):
        folder.mkdir(exist_ok=True)
        (folder / "SST-2.zip").write_bytes(b"placeholder")
    monkeypatch.setenv("UNFOLDFORMER_DATA", str(env))
    assert find_data_file("SST-2.zip", explicit) == explicit / "SST-2.zip"
    assert find_data_file("SST-2.zip") == env / "SST-2.zip"
    # a folder given explicitly is the only one searched, and must exist (no fall-through to $UNFOLDFORMER_DATA)
    with pytest.raises(DataNotFoundError, match="does not exist"):
        find_data_file("SST-2.zip", tmp_path / "typo")
    (tmp_path / "empty").mkdir()
    with pytest.raises(DataNotFoundError, match="SST-2.zip' not found"):
        find_data_file("SST-2.zip", tmp_path / "empty", download=False)
    monkeypatch.delenv("UNFOLDFORMER_DATA")
    assert find_data_file("SST-2.zip", download=False) == isolated_cache / "SST-2.zip"
    # an extracted folder counts; the archive wins within one folder
    (explicit / "aclImdb").mkdir()
    assert find_data_file("aclImdb_v1.tar.gz", explicit, download=False) == explicit / "aclImdb"
    (explicit / "aclImdb_v1.tar.gz").write_bytes(b"placeholder")
    assert find_data_file("aclImdb_v1.tar.gz", explicit) == explicit / "aclImdb_v1.tar.gz"
    with pytest.raises(ValueError, match="unknown data file"):
        find_data_file("mnist.npz", explicit)


def test_missing_without_download(tmp_path):
    with pytest.raises(DataNotFoundError) as info:
        find_data_file("aclImdb_v1.tar.gz", tmp_path, download=False)
    message = str(info.value)
    assert isinstance(info.value, FileNotFoundError)
    assert "aclImdb_v1.tar.gz" in message and "UNFOLDFORMER_DATA" in message
    assert "--data-dir" in message and str(tmp_path) in message


def test_download_verified_into_cache(data_dir, tmp_path, monkeypatch, isolated_cache):
    monkeypatch.setitem(files_module.DATA_URLS, "SST-2.zip", (data_dir / "SST-2.zip").as_uri())
    (tmp_path / "nothing-here").mkdir()
    path = find_data_file("SST-2.zip", tmp_path / "nothing-here")
    assert path == isolated_cache / "SST-2.zip"
    assert sha256_file(path) == SST2_SHA
    assert [p.name for p in isolated_cache.iterdir()] == ["SST-2.zip"]  # no temporary left
    assert len(load_sst2("dev", tmp_path / "nothing-here")) == 872


def test_download_wrong_checksum_leaves_nothing(tmp_path, monkeypatch, isolated_cache):
    fake = tmp_path / "fake.tar.gz"
    fake.write_bytes(b"not the data set" * 100)
    monkeypatch.setitem(files_module.DATA_URLS, "aclImdb_v1.tar.gz", fake.as_uri())
    with pytest.raises(DataFormatError, match=r"aclImdb_v1\.tar\.gz.*sha256.*discarded"):
        find_data_file("aclImdb_v1.tar.gz", tmp_path)
    assert list(isolated_cache.iterdir()) == []


def test_download_sst2_unknown_checksum(tmp_path, monkeypatch, isolated_cache):
    good = write_sst2_zip(tmp_path / "good", {})
    monkeypatch.setitem(files_module.DATA_URLS, "SST-2.zip", good.as_uri())
    assert find_data_file("SST-2.zip") == isolated_cache / "SST-2.zip"  # right members: accepted
    (isolated_cache / "SST-2.zip").unlink()
    bad = write_sst2_zip(tmp_path / "bad", {"test.tsv": None})
    monkeypatch.setitem(files_module.DATA_URLS, "SST-2.zip", bad.as_uri())
    with pytest.raises(DataFormatError, match="sha256"):
        find_data_file("SST-2.zip")
    assert list(isolated_cache.iterdir()) == []


def test_download_network_failure(tmp_path, isolated_cache):
    with pytest.raises(DataNotFoundError, match=r"(?s)SST-2\.zip.*download from .* failed.*UNFOLDFORMER_DATA"):
        find_data_file("SST-2.zip", tmp_path)
    assert list(isolated_cache.iterdir()) == []


def test_dataset_files_for_folder(tmp_path):
    folder = write_imdb_folder(tmp_path, GOOD_REVIEWS)
    lines = sorted(
        f"{hashlib.sha256(p.read_bytes()).hexdigest()}  {p.relative_to(tmp_path).as_posix()}\n"
        for p in folder.rglob("*.txt")
    )
    expected = hashlib.sha256("".join(sorted(lines, key=lambda s: s[66:])).encode()).hexdigest()
    assert dataset_files("imdb", tmp_path) == {str(folder): "tree:" + expected}


def test_installed_files_are_checked_against_the_sha256_pip_recorded(tmp_path, monkeypatch):
    """The MiniLM files are verified against the package's RECORD; a changed byte is an error naming the file."""
    import base64
    import importlib.metadata
    from types import SimpleNamespace

    weights = tmp_path / "model.safetensors"
    weights.write_bytes(b"weights!" * 4096)
    digest = base64.urlsafe_b64encode(hashlib.sha256(weights.read_bytes()).digest()).rstrip(b"=").decode()
    row = SimpleNamespace(hash=SimpleNamespace(mode="sha256", value=digest), locate=lambda: weights)
    monkeypatch.setattr(importlib.metadata, "files", lambda name: [row] if name == "pkg" else None)
    files_module.verify_installed_files("pkg", [weights, tmp_path / "not-recorded.txt"])      # intact: silent
    data = bytearray(weights.read_bytes())
    data[1000] ^= 0x01
    weights.write_bytes(bytes(data))
    stat = weights.stat()
    os.utime(weights, ns=(stat.st_atime_ns, stat.st_mtime_ns + 1_000_000_000))   # a new version of the file
    with pytest.raises(DataFormatError, match=r"model.safetensors: sha256 .* recorded when pkg was installed"):
        files_module.verify_installed_files("pkg", [weights])
