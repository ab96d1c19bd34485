"""Round 5, no output over an input (issue 39, item 4): every command and `save_pretrained` refuse, before any
work, an output that is one of their inputs, holds one, or lies in a run's files; `--run.overwrite true` deletes
nothing when one of the old run's files is an input of the new run. Each refusal leaves the inputs byte-identical;
the same command with the output moved elsewhere still works."""
from __future__ import annotations

import csv
import hashlib
import json
import random
import shutil

import pytest
import torch

import unfoldformer as uf
from conftest import FIXTURES, small_config
from unfoldformer.cli import main
from unfoldformer.errors import OutputError
from unfoldformer.lm import LanguageModel
from unfoldformer.rho_study import RhoStudySettings, run_rho_study

TOPICS = {"sports": ["goal", "match", "team", "coach"], "weather": ["rain", "sunny", "storm", "cloud"]}
FILLER = ["the", "a", "today", "very", "we", "saw"]
TINY = ["--data.text_column", "headline", "--data.label_column", "topic", "--data.embeddings", "random",
        "--data.embedding_dim", "16", "--model.d_model", "16", "--model.depth", "1", "--model.n_heads", "2",
        "--model.ffn_hidden", "16", "--optim.batch_size", "8", "--optim.epochs", "1", "--run.progress", "false",
        "--run.threads", "1", "--run.plots", "false", "--run.tensorboard", "false"]
TEXT = "First Citizen:\nBefore we proceed any further, hear me speak.\n\nAll:\nSpeak, speak.\n" * 12
LM_TINY = ["--layers", "1", "--heads", "2", "--width", "16", "--context", "8", "--batch", "4", "--warmup", "0",
           "--iters", "2", "--eval-interval", "2", "--no-progress"]


def write_news(path, n: int = 32, seed: int = 0):
    rng = random.Random(seed)
    with open(path, "w", newline="", encoding="utf-8") as handle:
        writer = csv.writer(handle)
        writer.writerow(("headline", "topic"))
        for i in range(n):
            topic = list(TOPICS)[i % 2]
            writer.writerow((" ".join(rng.choice(TOPICS[topic] + FILLER) for _ in range(6)), topic))
    return path


def digests(*paths) -> dict:
    """sha256 of every file under `paths` (files or folders): what 'byte-identical afterwards' compares."""
    out = {}
    for path in paths:
        for file in ([path] if path.is_file() else sorted(p for p in path.rglob("*") if p.is_file())):
            out[str(file)] = hashlib.sha256(file.read_bytes()).hexdigest()
    return out


def one_line_error(capsys, *fragments) -> str:
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and all(f in err for f in fragments), err
    return err


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """A finished tiny classifier run on a two-topic CSV (data beside the run folder)."""
    folder = tmp_path_factory.mktemp("round5")
    news = write_news(folder / "news.csv")
    run = folder / "run"
    assert main(["train", "--data.train_file", str(news), *TINY, "--run.out_dir", str(run)]) == 0
    return news, run


# ----------------------------------------------------------------------------- the shared guard
def test_guard_refuses_each_kind_of_overlap_and_passes_apart(tmp_path):
    from unfoldformer.contracts import check_output_apart
    data, run = tmp_path / "data.csv", tmp_path / "run"
    data.write_text("x")
    run.mkdir()
    (run / "best.safetensors").write_bytes(b"w")
    with pytest.raises(OutputError, match="is the data file itself"):
        check_output_apart("--output", tmp_path / "sub" / ".." / "data.csv", {"data file": data})
    with pytest.raises(OutputError, match="holds the data file"):
        check_output_apart("--out", tmp_path, {"data file": data}, replaced=True)
    with pytest.raises(OutputError, match="lies in the run folder"):
        check_output_apart("--output", run / "result.json", {}, whole={"run folder": run})
    # apart: beside the data, beside the run, a folder written in place beside an input, inputs not given
    check_output_apart("--output", tmp_path / "result.json", {"data file": data, "none": None},
                       whole={"run folder": run})
    check_output_apart("--out", tmp_path / "report", {"data file": data}, replaced=True)
    check_output_apart("--out", [tmp_path / "a.json"], {"data file": data})


# ----------------------------------------------------------------------------- train --run.overwrite true
def _old_run(out):
    """An earlier run's files in `out` (a checkpoint and metrics): what --run.overwrite true deletes."""
    out.mkdir()
    (out / "checkpoint.pt").write_bytes(b"old checkpoint")
    (out / "metrics.csv").write_text("step,loss\n1,0.5\n")


def test_overwrite_never_deletes_the_config_file_it_reads(tmp_path, capsys):
    news, out = write_news(tmp_path / "news.csv"), tmp_path / "run"
    _old_run(out)
    config = out / "config.json"                                   # the user's config, kept in the run folder
    config.write_text(json.dumps({"data": {"train_file": str(news)}}))
    before = digests(out)
    code = main(["train", "--config", str(config), *TINY, "--run.out_dir", str(out), "--run.overwrite", "true"])
    one_line_error(capsys, "is the config file itself", str(config))
    assert code == 2 and digests(out) == before                    # nothing deleted, not even the checkpoint
    moved = shutil.copy(config, tmp_path / "cfg.json")             # the config elsewhere: the old run is replaced
    assert main(["train", "--config", str(moved), *TINY, "--run.out_dir", str(out), "--run.overwrite", "true"]) == 0
    assert (out / "checkpoint.pt").read_bytes() != b"old checkpoint" and (out / "complete.json").is_file()


@pytest.mark.parametrize("flag", ["--data.train_file", "--data.eval_file"])
def test_overwrite_never_deletes_a_data_file_it_reads(tmp_path, capsys, flag):
    out = tmp_path / "run"
    _old_run(out)
    write_news(out / "metrics.csv", seed=1)                        # a data file under a name a run writes
    news = write_news(tmp_path / "news.csv")
    files = ([flag, str(out / "metrics.csv")] if flag == "--data.train_file"
             else ["--data.train_file", str(news), flag, str(out / "metrics.csv")])
    before = digests(out)
    code = main(["train", *files, *TINY, "--run.out_dir", str(out), "--run.overwrite", "true"])
    one_line_error(capsys, f"is the data.{flag.split('.')[1]} itself", "metrics.csv")
    assert code == 2 and digests(out) == before


# ----------------------------------------------------------------------------- save_pretrained
def test_save_pretrained_refuses_a_training_run_folder_and_saves_beside_it(trained, tmp_path):
    _, finished = trained
    run = shutil.copytree(finished, tmp_path / "run")
    before = digests(run)
    model = uf.UnfoldedTransformer(small_config("certified"))
    with pytest.raises(OutputError, match=r"is the output of `unfoldformer train`"):
        model.save_pretrained(run)
    predictor = uf.load(run)                                       # the very folder it was loaded from
    with pytest.raises(OutputError, match="a model folder goes beside a run"):
        predictor.save_pretrained(run)
    assert digests(run) == before
    saved = predictor.save_pretrained(tmp_path / "beside")         # beside the run: allowed, and loads back
    assert uf.load(saved).predict(["goal match"])[0].probabilities == predictor.predict(["goal match"])[0].probabilities


@pytest.mark.parametrize("marker", ["checkpoint.pt", "state.pt", "train.json", "best.safetensors"])
def test_save_pretrained_refuses_a_run_in_progress(tmp_path, marker):
    """A run without its manifest yet (training, or killed) is still a run: one file only a run writes decides."""
    run = tmp_path / "run"
    run.mkdir()
    (run / marker).write_bytes(b"run file")
    (run / "config.json").write_text("{}")
    with pytest.raises(OutputError, match=f"it holds {marker}"):
        uf.UnfoldedTransformer(small_config("certified")).save_pretrained(run)
    assert sorted(p.name for p in run.iterdir()) == sorted([marker, "config.json"])
    assert (run / "config.json").read_text() == "{}"


def test_save_pretrained_refuses_another_commands_output_but_resaves_a_model_folder(tmp_path):
    report = tmp_path / "probe_report"
    report.mkdir()
    (report / "complete.json").write_text(json.dumps({"command": "probe", "files": {}}))
    model = uf.UnfoldedTransformer(small_config("certified"))
    with pytest.raises(OutputError, match="unfoldformer probe"):
        model.save_pretrained(report)
    assert [p.name for p in report.iterdir()] == ["complete.json"]
    folder = model.save_pretrained(tmp_path / "model")             # a model folder may be saved again
    model.save_pretrained(folder)
    back = uf.UnfoldedTransformer.from_pretrained(folder)
    assert all(torch.equal(back.state_dict()[k], v) for k, v in model.state_dict().items())


def test_lm_run_folder_is_refused_by_save_pretrained_and_lm_train_still_saves_into_it(tmp_path, capsys):
    data = tmp_path / "text.txt"
    data.write_text(TEXT, encoding="utf-8")
    run = tmp_path / "lm"
    assert main(["lm", "train", "--out", str(run), "--data", str(data), *LM_TINY]) == 0
    model = LanguageModel.from_pretrained(run)                     # lm train wrote its model into its run
    before = digests(run)
    with pytest.raises(OutputError, match="it holds state.pt"):
        model.save_pretrained(run)
    assert digests(run) == before
    assert main(["lm", "evaluate", str(run), "--windows", "2"]) == 0


# ----------------------------------------------------------------------------- evaluate, lm train, probe, rho-study
def test_evaluate_output_is_never_the_eval_file(trained, tmp_path, capsys):
    news, run = trained
    held = shutil.copy(write_news(tmp_path / "held.csv", seed=3), tmp_path / "held-out.csv")
    before = digests(run, tmp_path)
    code = main(["evaluate", str(run), "--data.eval_file", str(held), "--output", str(held)])
    one_line_error(capsys, "is the data.eval_file itself")
    assert code == 2 and digests(run, tmp_path) == before
    result = tmp_path / "result.json"                              # beside it: written, with its figure
    assert main(["evaluate", str(run), "--data.eval_file", str(held), "--output", str(result)]) == 0
    assert json.loads(result.read_text())["n"] == 32 and (tmp_path / "result.confusion.png").is_file()
    assert digests(held) == {k: v for k, v in before.items() if k == str(held)}


def test_evaluate_output_is_never_in_a_datasets_folder_it_reads(trained, tmp_path, capsys):
    _, run = trained
    folder = tmp_path / "held"
    folder.mkdir()
    write_news(folder / "test.csv", seed=4)
    before = digests(folder)
    code = main(["evaluate", str(run), "--data.eval_file", str(folder), "--output", str(folder / "result.json")])
    one_line_error(capsys, "lies in the datasets folder")
    assert code == 2 and digests(folder) == before


def test_lm_train_never_writes_over_its_data_file(tmp_path, capsys):
    notes = tmp_path / "notes"
    notes.mkdir()
    data = notes / "README.md"                                     # a text whose name the run writes
    data.write_text(TEXT, encoding="utf-8")
    code = main(["lm", "train", "--out", str(notes), "--data", str(data), *LM_TINY])
    one_line_error(capsys, "is the --data file itself", "README.md")
    assert code == 2 and data.read_text(encoding="utf-8") == TEXT and sorted(notes.iterdir()) == [data]
    assert main(["lm", "train", "--out", str(notes / "run"), "--data", str(data), *LM_TINY]) == 0
    assert data.read_text(encoding="utf-8") == TEXT


def test_lm_train_never_writes_into_a_classifier_run(trained, tmp_path, capsys):
    _, finished = trained
    run = shutil.copytree(finished, tmp_path / "run")
    data = tmp_path / "text.txt"
    data.write_text(TEXT, encoding="utf-8")
    before = digests(run)
    code = main(["lm", "train", "--out", str(run), "--data", str(data), *LM_TINY])
    one_line_error(capsys, "not a language-model run")
    assert code == 2 and digests(run) == before


def _earlier_output(folder, command):
    folder.mkdir()
    (folder / "complete.json").write_text(json.dumps({"command": command, "files": {}}))
    return folder


@pytest.mark.parametrize("where", ["model-inside-out", "out-inside-model"])
def test_probe_output_never_replaces_or_enters_its_model_folder(tmp_path, capsys, where):
    if where == "model-inside-out":                                # an earlier report holding the model
        out = _earlier_output(tmp_path / "report", "probe")
        model, message = out / "model", "holds the --model folder"
    else:
        out, model, message = tmp_path / "model" / "report", tmp_path / "model", "lies in the --model folder"
    model.mkdir(parents=True)
    (model / "config.json").write_text('{"model_type": "bert"}')
    before = digests(model)
    code = main(["probe", "--model", str(model), "--out", str(out), "--samples", "4"])
    one_line_error(capsys, message)
    assert code == 2 and digests(model) == before


@pytest.mark.parametrize("option", ["data_dir", "results_dir", "runs_dir"])
def test_rho_study_output_never_replaces_its_inputs(tmp_path, option, monkeypatch):
    out = _earlier_output(tmp_path / "study", "rho-study")         # the study replaces this folder whole
    inputs = out / "inputs"
    inputs.mkdir()
    (inputs / "kept.json").write_text('{"accuracy": 0.5}')
    monkeypatch.delenv("UNFOLDFORMER_DATA", raising=False)
    settings = RhoStudySettings(quick=True, samples=4, out=str(out), **{option: str(inputs)})
    with pytest.raises(OutputError, match="holds the --"):
        run_rho_study(settings)
    assert (inputs / "kept.json").read_text() == '{"accuracy": 0.5}'
    with pytest.raises(OutputError, match="itself"):
        run_rho_study(RhoStudySettings(quick=True, samples=4, out=str(inputs), **{option: str(inputs)}))


def test_rho_study_command_refuses_its_results_folder_as_output(tmp_path, capsys, monkeypatch):
    monkeypatch.delenv("UNFOLDFORMER_DATA", raising=False)        # the refusal comes before any data is read
    results = _earlier_output(tmp_path / "results", "rho-study")
    code = main(["rho-study", "--quick", "--results", str(results), "--out", str(results)])
    one_line_error(capsys, "is the --results itself")
    assert code == 2 and [p.name for p in results.iterdir()] == ["complete.json"]


def test_fixture_run_copied_is_refused_whole(tmp_path):
    """The v0.2.0 run fixture (an older run with its manifest) counts as a run too."""
    run = shutil.copytree(FIXTURES / "v0.2.0" / "run", tmp_path / "run")
    before = digests(run)
    with pytest.raises(OutputError, match="a model folder goes beside a run"):
        uf.UnfoldedTransformer(small_config("certified")).save_pretrained(run)
    assert digests(run) == before
