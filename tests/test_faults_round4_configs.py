"""Round 4, configs are data: no interpolation or resolver anywhere (files, saved configs, command line),
YAML anchors/aliases refused, size and depth bounded; every refusal one line (`ConfigError`, exit 2)."""
from __future__ import annotations

import json
import time

import pytest

from unfoldformer import cli
from unfoldformer.config_files import MAX_DEPTH
from unfoldformer.errors import ConfigError
from unfoldformer.train import TrainConfig

SECRET = "tok-3f9a"


@pytest.fixture(autouse=True)
def _secret(monkeypatch):
    monkeypatch.setenv("UF_TEST_SECRET", SECRET)


def _one_line(exc: pytest.ExceptionInfo) -> str:
    text = str(exc.value)
    assert "\n" not in text, text
    return text


@pytest.mark.parametrize("suffix", [".yaml", ".json"])
def test_file_env_resolver_stays_literal(tmp_path, suffix):
    path = tmp_path / f"c{suffix}"
    data = {"run": {"out_dir": "${oc.env:UF_TEST_SECRET}"}, "data": {"text_column": "${oc.env:UF_TEST_SECRET,x}"}}
    path.write_text(json.dumps(data))                           # JSON is YAML too
    cfg = TrainConfig.load(path)
    assert cfg.run.out_dir == "${oc.env:UF_TEST_SECRET}"
    assert cfg.data.text_column == "${oc.env:UF_TEST_SECRET,x}"
    assert SECRET not in json.dumps(cfg.to_dict())


def test_file_relative_interpolation_stays_literal(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("data:\n  text_column: review\n  label_column: ${data.text_column}\n")
    assert TrainConfig.load(path).data.label_column == "${data.text_column}"


def test_saved_config_is_read_literally():
    saved = TrainConfig().to_dict()
    saved["run"]["out_dir"] = "runs/${oc.env:UF_TEST_SECRET}"
    assert TrainConfig.from_dict(saved).run.out_dir == "runs/${oc.env:UF_TEST_SECRET}"


def test_saved_config_round_trip_keeps_dollar_text(tmp_path):
    cfg = TrainConfig().with_overrides(["--run.out_dir", "out/${x}", "--data.text_column", "${oc.decode:'1'}"])
    cfg.save(tmp_path / "config.json")
    cfg.save(tmp_path / "config.yaml")
    assert TrainConfig.load(tmp_path / "config.json") == cfg == TrainConfig.load(tmp_path / "config.yaml")


@pytest.mark.parametrize("value", ["${oc.env:UF_TEST_SECRET}", "${data.label_column}", "a${b}c", "\\${x}",
                                   "${oc.decode:'[1]'}", "${", "$HOME"])
def test_command_line_values_are_literal(value):
    cfg = TrainConfig().with_overrides(["--data.text_column", value])
    assert cfg.data.text_column == value


def test_command_line_file_name_with_dollar_braces(tmp_path):
    path = tmp_path / "a${b}.csv"
    path.write_text("text,label\nx,1\n")
    cfg = TrainConfig().with_overrides([f"--data.train_file={path}"])
    assert cfg.data.train_file == str(path) and cfg.data.dataset == "files"


def test_cli_names_the_literal_missing_file(tmp_path, capsys):
    missing = tmp_path / "a${oc.env:UF_TEST_SECRET}.csv"
    code = cli.main(["train", "--data.train_file", str(missing), "--run.out_dir", str(tmp_path / "run")])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1, err
    assert "a${oc.env:UF_TEST_SECRET}.csv: no such file" in err and SECRET not in err


def test_yaml_aliases_are_refused(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("x: &dir runs/a\nrun:\n  out_dir: *dir\n")
    with pytest.raises(ConfigError, match=r"c.yaml:1:\d+: YAML anchors and aliases") as exc:
        TrainConfig.load(path)
    _one_line(exc)


def test_billion_laughs_refused_fast(tmp_path):
    lines = ['a: &a ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]']
    lines += [f"{c}: &{c} [*{p},*{p},*{p},*{p},*{p},*{p},*{p},*{p},*{p}]" for p, c in zip("abcdefgh", "bcdefghi")]
    path = tmp_path / "laughs.yaml"
    path.write_text("\n".join(lines) + "\n")
    start = time.perf_counter()
    with pytest.raises(ConfigError, match="anchors and aliases") as exc:
        TrainConfig.load(path)
    assert time.perf_counter() - start < 1.0                   # refused at the first anchor, nothing expanded
    _one_line(exc)


def test_cli_billion_laughs_one_line(tmp_path, capsys):
    path = tmp_path / "laughs.yaml"
    path.write_text("a: &a [x, x]\nb: &b [*a, *a]\nrun: {out_dir: *b}\n")
    code = cli.main(["train", "--config", str(path), "--run.out_dir", str(tmp_path / "run")])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and "anchors and aliases" in err, err


@pytest.mark.parametrize("text", ["[" * 5000 + "]" * 5000, "run:\n" + "".join(f"{' ' * (2 * i)}-\n"
                                                                             for i in range(1, 300))],
                         ids=["flow", "block"])
def test_deep_yaml_is_one_line(tmp_path, text):
    path = tmp_path / "deep.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError, match=f"nested deeper than {MAX_DEPTH} levels") as exc:
        TrainConfig.load(path)
    _one_line(exc)


def test_deep_json_is_one_line(tmp_path):
    path = tmp_path / "deep.json"
    path.write_text('{"run": ' + "[" * 100000 + "]" * 100000 + "}")
    with pytest.raises(ConfigError, match=f"deep.json:1: nested deeper than {MAX_DEPTH} levels") as exc:
        TrainConfig.load(path)
    _one_line(exc)


def test_json_brackets_inside_strings_do_not_count(tmp_path):
    path = tmp_path / "c.json"
    path.write_text(json.dumps({"data": {"text_column": "[" * 100 + '\\"{' * 50}}))
    assert TrainConfig.load(path).data.text_column == "[" * 100 + '\\"{' * 50


def test_huge_config_file_refused(tmp_path):
    path = tmp_path / "big.yaml"
    path.write_text("run:\n  out_dir: " + "x" * (1 << 20) + "\n")
    with pytest.raises(ConfigError, match=r"big.yaml: config file larger than 1,048,576 bytes") as exc:
        TrainConfig.load(path)
    _one_line(exc)


def test_unknown_key_named_in_full():
    with pytest.raises(ConfigError, match=r"^optim\.lr\.x: Key 'lr\.x' not in 'OptimSection'$"):
        TrainConfig().with_overrides(["--optim.lr.x", "1"])


def test_null_is_a_string_field_value_not_none():
    """`null` unsets optional fields only; a required text field keeps the word (a column may be named so)."""
    cfg = TrainConfig().with_overrides(["--data.text_column", "null", "--data.eval_split", "null"])
    assert cfg.data.text_column == "null" and cfg.data.eval_split is None


def test_quotes_on_the_command_line_are_kept():
    assert TrainConfig().with_overrides(["--data.text_column", "'my col'"]).data.text_column == "'my col'"
    assert TrainConfig().with_overrides(["--data.text_column", "12"]).data.text_column == "12"
