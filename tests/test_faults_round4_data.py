"""Round 4, data exactly as written: strict delimited reading, records split at line feeds only, labels
compared as written, duplicates refused alike in every format, `datasets` folders confined and checked,
contradictory column or split choices refused. Every refusal is one line (`DataFormatError`/`ConfigError`)."""
from __future__ import annotations

import json

import pytest

from unfoldformer.data.files import DataFormatError
from unfoldformer.data.tables import load_labelled_files, read_table
from unfoldformer.errors import ConfigError
from unfoldformer.train import TrainConfig


def _refused(path, match, **kw):
    with pytest.raises(DataFormatError, match=match) as info:
        read_table(path, **kw)
    assert "\n" not in str(info.value)


def _arrow_folder(folder, columns: dict, info: dict | None = None, filename="data-00000-of-00001.arrow"):
    """A `save_to_disk` folder written with pyarrow alone: one Arrow stream, state.json, dataset_info.json."""
    pa = pytest.importorskip("pyarrow")
    import pyarrow.ipc
    folder.mkdir(parents=True, exist_ok=True)
    table = pa.table(columns) if not isinstance(columns, list) else pa.Table.from_arrays(
        [pa.array(v) for _, v in columns], names=[k for k, _ in columns])
    target = folder / filename
    target.parent.mkdir(parents=True, exist_ok=True)
    with pa.OSFile(str(target), "wb") as sink, pyarrow.ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table)
    (folder / "state.json").write_text(json.dumps({"_data_files": [{"filename": filename}]}))
    if info is not None:
        (folder / "dataset_info.json").write_text(json.dumps(info))
    return folder


# ----------------------------------------------------------------------------- strict delimited reading
def test_tsv_text_opening_a_quote_swallows_no_rows(tmp_path):
    path = tmp_path / "a.tsv"
    path.write_text('text\tlabel\n"great film\t1\nbad\t0\nok" then\t1\nfine\t0\n')
    texts, labels = read_table(path)
    assert texts == ['"great film', "bad", 'ok" then', "fine"] and labels == [1, 0, 1, 0]


def test_tsv_texts_keep_their_quotes(tmp_path):
    path = tmp_path / "a.tsv"
    path.write_text('text\tlabel\n"Great" he said\t1\nsay ""hi""\t0\n')
    assert read_table(path)[0] == ['"Great" he said', 'say ""hi""']


def test_consistently_quoted_tsv_is_unquoted(tmp_path):
    path = tmp_path / "q.tsv"
    path.write_text('"text"\t"label"\n"a\ttab"\t"1"\n"say ""hi"""\t"0"\n')
    assert read_table(path) == (["a\ttab", 'say "hi"'], [1, 0])


def test_consistently_quoted_tsv_with_a_stray_quote_names_the_row(tmp_path):
    path = tmp_path / "q.tsv"
    path.write_text('"text"\t"label"\n"a"\t"1"\n"b" c\t"0"\n')
    _refused(path, r"q.tsv, row 2 \(line 3\): not valid quoted TSV")


def test_csv_quote_then_text_is_refused_not_stripped(tmp_path):
    path = tmp_path / "a.csv"
    path.write_text('text,label\nfine,0\n"great" film,1\n')
    _refused(path, r"a.csv, row 2 \(line 3\): not valid CSV")


def test_csv_unclosed_quote_is_refused(tmp_path):
    path = tmp_path / "a.csv"
    path.write_text('text,label\n"great film,1\nbad,0\nfine,0\n')
    _refused(path, r"a.csv, row 1 \(line 2\): not valid CSV")


def test_csv_rfc_quoting_still_reads(tmp_path):
    path = tmp_path / "a.csv"
    path.write_text('text,label\n"a, b",1\n"say ""hi""",0\n"two\nlines",1\nplain "inner" quote,0\n')
    assert read_table(path)[0] == ["a, b", 'say "hi"', "two\nlines", 'plain "inner" quote']


# ----------------------------------------------------------------------------- line separators inside fields
SEPARATORS = {"U+0085": "\u0085", "U+2028": "\u2028", "lone CR": "\r"}


@pytest.mark.parametrize("fmt", ["csv", "tsv", "jsonl"])
@pytest.mark.parametrize("name", list(SEPARATORS))
def test_line_separators_inside_fields_are_characters(tmp_path, fmt, name):
    sep = SEPARATORS[name]
    texts = [f"first{sep}half", "plain", f"x{sep}"]
    path = tmp_path / f"a.{fmt}"
    if fmt == "jsonl":
        path.write_bytes("".join(json.dumps({"text": t, "label": i % 2}, ensure_ascii=False) + "\n"
                                 for i, t in enumerate(texts)).encode())
    else:
        d = "," if fmt == "csv" else "\t"
        path.write_bytes(("text" + d + "label\n" + "".join(f"{t}{d}{i % 2}\n" for i, t in enumerate(texts))).encode())
    assert read_table(path) == (texts, [0, 1, 0])


def test_crlf_files_read_as_before(tmp_path):
    path = tmp_path / "a.csv"
    path.write_bytes(b'text,label\r\na,1\r\n"b\r\nc",0\r\n')
    assert read_table(path) == (["a", "b\r\nc"], [1, 0])


# ----------------------------------------------------------------------------- labels as written
def test_labels_1_and_01_are_two_classes(tmp_path):
    path = tmp_path / "a.csv"
    path.write_text("text,label\na,1\nb,01\nc,1\nd,01\n")
    split = load_labelled_files(path, tmp_path / "a.csv")["train"]
    assert split.label_names == ("01", "1") and split.labels == [1, 0, 1, 0]


def test_label_with_spaces_is_not_the_integer(tmp_path):
    path = tmp_path / "a.tsv"
    path.write_text("text\tlabel\na\t1\nb\t 1\n")
    assert read_table(path)[1] == ["1", " 1"]


def test_eval_label_01_is_not_training_label_1(tmp_path):
    (tmp_path / "t.csv").write_text("text,label\na,0\nb,1\n")
    (tmp_path / "e.csv").write_text("text,label\nc,01\n")
    with pytest.raises(DataFormatError, match=r"e.csv, row 1, column 'label': label '01' does not occur"):
        load_labelled_files(tmp_path / "t.csv", tmp_path / "e.csv")


def test_plain_integers_stay_integers(tmp_path):
    path = tmp_path / "a.csv"
    path.write_text("text,label\na,10\nb,2\nc,-1\n")
    assert read_table(path)[1] == [10, 2, -1]


# ----------------------------------------------------------------------------- duplicates, every format
def _duplicated(tmp_path, fmt):
    if fmt in ("csv", "tsv"):
        d = "," if fmt == "csv" else "\t"
        path = tmp_path / f"d.{fmt}"
        path.write_text(f"text{d}label{d}label\na{d}1{d}2\nb{d}0{d}3\n")
    elif fmt == "jsonl":
        path = tmp_path / "d.jsonl"
        path.write_text('{"text": "a", "label": 1, "label": 2}\n')
    elif fmt == "json":
        path = tmp_path / "d.json"
        path.write_text('[{"text": "a", "label": 1}, {"text": "b", "label": 0, "label": 2}]')
    elif fmt == "parquet":
        pa = pytest.importorskip("pyarrow")
        import pyarrow.parquet as pq
        path = tmp_path / "d.parquet"
        pq.write_table(pa.Table.from_arrays([pa.array(["a", "b"]), pa.array([1, 0]), pa.array([2, 3])],
                                            names=["text", "label", "label"]), path)
    else:
        path = _arrow_folder(tmp_path / "ds", [("text", ["a", "b"]), ("label", [1, 0]), ("label", [2, 3])])
    return path


@pytest.mark.parametrize("fmt", ["csv", "tsv", "jsonl", "json", "parquet", "datasets"])
def test_a_column_given_twice_is_refused_in_every_format(tmp_path, fmt):
    _refused(_duplicated(tmp_path, fmt), r"column 'label' is given twice; keep one")


# ----------------------------------------------------------------------------- datasets folders
@pytest.mark.parametrize("where", ["../outside.arrow", "/ABS"])
def test_datasets_state_pointing_outside_is_refused(tmp_path, where):
    outside = _arrow_folder(tmp_path / "other", {"text": ["a", "b"], "label": [0, 1]})
    folder = _arrow_folder(tmp_path / "ds", {"text": ["c", "d"], "label": [0, 1]})
    (tmp_path / "outside.arrow").write_bytes((outside / "data-00000-of-00001.arrow").read_bytes())
    name = str(tmp_path / "outside.arrow") if where == "/ABS" else where
    (folder / "state.json").write_text(json.dumps({"_data_files": [{"filename": name}]}))
    _refused(folder, r"state.json: data file .*outside.arrow' lies outside the folder")


def test_datasets_class_label_with_a_name_twice_is_refused(tmp_path):
    info = {"features": {"text": {"_type": "Value"}, "label": {"_type": "ClassLabel", "names": ["neg", "pos", "neg"]}}}
    folder = _arrow_folder(tmp_path / "ds", {"text": ["a", "b", "c"], "label": [0, 1, 2]}, info)
    _refused(folder, r"dataset_info.json: ClassLabel 'label' names 'neg' twice")


@pytest.mark.parametrize("target, content", [("state.json", '{"_data_files": "data.arrow"}'),
                                             ("state.json", '{"_data_files": [{"filename": 3}]}'),
                                             ("dataset_info.json", "{not json"),
                                             ("dataset_info.json", '{"features": {"label": {"_type": "ClassLabel", '
                                                                   '"names": "neg"}}}')],
                         ids=["files-not-a-list", "filename-not-text", "info-not-json", "names-not-a-list"])
def test_damaged_datasets_metadata_is_one_line(tmp_path, target, content):
    folder = _arrow_folder(tmp_path / "ds", {"text": ["a", "b"], "label": [0, 1]}, {"features": {}})
    (folder / target).write_text(content)
    _refused(folder, rf"{target}: damaged datasets metadata")


def test_damaged_dataset_dict_is_one_line(tmp_path):
    (tmp_path / "dd").mkdir()
    (tmp_path / "dd" / "dataset_dict.json").write_text("{broken")
    _refused(tmp_path / "dd", r"dataset_dict.json: damaged datasets metadata")


# ----------------------------------------------------------------------------- contradictory choices
def test_text_column_equal_to_label_column_is_refused(tmp_path):
    path = tmp_path / "a.csv"
    path.write_text("text,label\na,b\nc,d\n")
    _refused(path, r"the text column and the label column are both 'text'", label_column="text")
    with pytest.raises(ConfigError, match="data.text_column and data.label_column are both 'label'"):
        TrainConfig().with_overrides(["--data.train_file", str(path), "--data.text_column", "label"]).validate(
            check_data=False)


def test_train_split_equal_to_eval_split_is_refused():
    with pytest.raises(ConfigError, match="data.train_split and data.eval_split are both 'train'"):
        TrainConfig().with_overrides(["--data.eval_split", "train"]).validate(check_data=False)


def test_eval_file_equal_to_train_file_is_refused(tmp_path):
    path = tmp_path / "a.csv"
    path.write_text("text,label\na,0\nb,1\n")
    same = str(tmp_path / "." / "a.csv")
    cfg = TrainConfig().with_overrides(["--data.train_file", str(path), "--data.eval_file", same])
    with pytest.raises(ConfigError, match="data.eval_file is data.train_file"):
        cfg.validate(check_data=False)
