"""Your own data: files of every format train the same run, label names travel to evaluate / predict / the API,
every data error is one line naming file, row and column, the held-out split is seeded, a run can be watched
(metrics.csv per-step rows, figures, TensorBoard) and extended."""
from __future__ import annotations

import csv
import json
import math
import random

import numpy as np
import pytest
import torch

import unfoldformer as uf
from unfoldformer.cli import main
from unfoldformer.data.files import DataFormatError
from unfoldformer.data.tables import held_out_rows, load_labelled_files, read_table
from unfoldformer.train import ConfigError, TrainConfig, train

TOPICS = {"sports": ["goal", "match", "team", "coach", "league", "score"],
          "weather": ["rain", "sunny", "storm", "cloud", "wind", "snow"],
          "food": ["pasta", "bread", "cheese", "soup", "spice", "salad"]}
FILLER = ["the", "a", "today", "very", "we", "saw", "some", "and"]
TINY = ["--data.embeddings", "random", "--data.embedding_dim", "16", "--model.d_model", "16", "--model.depth", "2",
        "--model.n_heads", "2", "--model.ffn_hidden", "32", "--optim.batch_size", "8", "--optim.epochs", "1",
        "--run.progress", "false", "--run.log_every", "2"]


def rows(n: int = 48, seed: int = 0) -> list[tuple[str, str]]:
    """`n` headlines of three topics: half their words from the topic, so the classes are learnable."""
    rng = random.Random(seed)
    out = []
    for i in range(n):
        topic = list(TOPICS)[i % 3]
        words = [rng.choice(TOPICS[topic]) if rng.random() < 0.6 else rng.choice(FILLER) for _ in range(8)]
        out.append((" ".join(words), topic))
    return out


def write_csv(path, data, header=("headline", "topic"), delimiter=","):
    with open(path, "w", newline="", encoding="utf-8") as handle:
        writer = csv.writer(handle, delimiter=delimiter)
        writer.writerow(header)
        writer.writerows(data)
    return path


def write_jsonl(path, data, columns=("headline", "topic")):
    path.write_text("".join(json.dumps(dict(zip(columns, r))) + "\n" for r in data), encoding="utf-8")
    return path


def tiny_config(train_file, out, *extra) -> TrainConfig:
    args = ["--data.train_file", str(train_file), "--data.text_column", "headline", "--data.label_column", "topic",
            *TINY, "--run.out_dir", str(out), *extra]
    return TrainConfig().with_overrides(args)


def same_run(a, b) -> None:
    """Two run folders hold the same run: equal final weights and equal metrics (times and run ids aside)."""
    sa, sb = (json.loads((f / "summary.json").read_text()) for f in (a, b))
    assert sa["rank_weights_sha256"] == sb["rank_weights_sha256"]
    strip = lambda f: [{k: v for k, v in json.loads(line).items()                            # noqa: E731
                        if k not in ("run_id", "train_time_s", "tokens_per_s")}
                       for line in (f / "metrics.jsonl").read_text().splitlines()]
    assert strip(a) == strip(b)


@pytest.fixture(scope="module")
def csv_run(tmp_path_factory):
    """A 3-class CSV with its own column names, trained through the command line (1 epoch, 6 steps)."""
    folder = tmp_path_factory.mktemp("own")
    write_csv(folder / "news.csv", rows())
    out = folder / "run"
    rc = main(["train", "--data.train_file", str(folder / "news.csv"), "--data.text_column", "headline",
               "--data.label_column", "topic", *TINY, "--run.log_every", "1", "--run.out_dir", str(out)])
    assert rc == 0
    return folder, out


# ----------------------------------------------------------------------------- the journey


def test_csv_run_keeps_label_names_and_classes(csv_run):
    _, out = csv_run
    config = json.loads((out / "config.json").read_text())
    assert config["data"]["dataset"] == "files" and config["model"]["n_classes"] == 3
    assert config["resolved"]["label_names"] == ["food", "sports", "weather"]
    assert json.loads((out / "best.json").read_text())["label_names"] == ["food", "sports", "weather"]
    assert config["resolved"]["train_examples"] + config["resolved"]["eval_examples"] == 48


def test_evaluate_and_predict_by_label_name_cli(csv_run, capsys):
    folder, out = csv_run
    capsys.readouterr()
    assert main(["evaluate", str(out), "--device", "cpu", "--output", str(folder / "eval.json")]) == 0
    result = json.loads((folder / "eval.json").read_text())
    assert result["label_names"] == ["food", "sports", "weather"] and result["split"] == "eval"
    assert result["n"] == 5                                        # round(0.1 · 48) rows held out
    capsys.readouterr()
    assert main(["predict", str(out), "--text", "rain storm wind snow", "--text", "pasta bread", "--json"]) == 0
    preds = json.loads(capsys.readouterr().out)
    for p in preds:
        assert p["label_name"] == ["food", "sports", "weather"][p["label"]]
        assert p["label"] == max(range(3), key=lambda c: p["probabilities"][c])
    assert main(["predict", str(out), "--text", "rain storm wind snow"]) == 0
    text = capsys.readouterr().out
    assert text.startswith("classes: food, sports, weather") and "E/n:" in text


def test_api_predicts_by_label_name_with_per_token_energies(csv_run):
    _, out = csv_run
    predictor = uf.load(out, device="cpu")
    assert predictor.label_names == ("food", "sports", "weather")
    preds = predictor(["goal match team coach", "a", "soup and salad today"])
    for p in preds:
        assert p.label_name == predictor.label_names[p.label]
        # E/n is the curve divided by the real tokens; both are float64, so the division is exact to 1 ulp
        assert p.energies_per_token == pytest.approx([e / p.tokens for e in p.energies], rel=1e-15, abs=0)
    assert [p.tokens for p in preds] == [4, 1, 4]


def test_metrics_csv_has_per_step_rows_figures_and_tensorboard(csv_run):
    _, out = csv_run
    with open(out / "metrics.csv", encoding="utf-8") as handle:
        table = list(csv.DictReader(handle))
    steps = [r for r in table if r["row"] == "step"]
    evals = [r for r in table if r["row"] == "eval"]
    assert [int(r["step"]) for r in steps] == [1, 2, 3, 4, 5, 6] and len(evals) == 1
    for r in steps:
        assert float(r["grad_norm"]) > 0 and float(r["lr"]) > 0
        assert 0 <= float(r["never_rising_share"]) <= 1
        assert math.isfinite(float(r["energy_per_token_last"]))
    # The logged epoch loss (what the bar shows at the epoch's end) is the mean over the epoch's examples: with
    # one row per step, the size-weighted mean of the rows. The batch sizes in step order depend only on the
    # number of examples (43 = 48 - 5 held out) and the seed. Error: each row is value/n in float64 (2⁻⁵³),
    # times n back (2⁻⁵³), summed over 6 terms (6 · 2⁻⁵³): below 1e-15 relative; 1e-12 is a safe bound.
    from unfoldformer.data.batching import BucketBatchSampler
    sizes = [len(b) for b in BucketBatchSampler(np.zeros(43), 8, 0, 50).batches(0)]
    assert sorted(sizes) == [3, 8, 8, 8, 8, 8]
    weighted = sum(float(r["loss"]) * n for r, n in zip(steps, sizes)) / sum(sizes)
    assert float(evals[0]["train_loss"]) == pytest.approx(weighted, rel=1e-12, abs=0)
    unweighted = sum(float(r["loss"]) for r in steps) / len(steps)
    assert abs(unweighted - weighted) > 1e-9          # the check above can tell the two means apart
    for name in ("loss.png", "accuracy.png", "energy.png"):
        assert (out / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    pytest.importorskip("tensorboard")
    events = list((out / "tensorboard").glob("events.out.tfevents.*"))
    assert len(events) == 1 and events[0].stat().st_size > 0


def test_plot_command_rewrites_the_figures(csv_run, capsys):
    _, out = csv_run
    (out / "loss.png").unlink()
    assert main(["plot", str(out)]) == 0
    assert (out / "loss.png").is_file() and str(out / "loss.png") in capsys.readouterr().out


# ----------------------------------------------------------------------------- formats give the same run


def test_jsonl_parquet_and_datasets_folder_give_the_same_run(tmp_path):
    data = rows()
    runs = {}
    sources = {"csv": write_csv(tmp_path / "n.csv", data), "jsonl": write_jsonl(tmp_path / "n.jsonl", data),
               "tsv": write_csv(tmp_path / "n.tsv", data, delimiter="\t")}
    try:
        import pyarrow as pa
        import pyarrow.parquet as pq
        pq.write_table(pa.table({"headline": [r[0] for r in data], "topic": [r[1] for r in data]}),
                       tmp_path / "n.parquet")
        sources["parquet"] = tmp_path / "n.parquet"
    except ImportError:
        pass
    try:
        import datasets
        datasets.Dataset.from_dict({"headline": [r[0] for r in data], "topic": [r[1] for r in data]}).save_to_disk(
            str(tmp_path / "n_ds"))
        sources["datasets"] = tmp_path / "n_ds"
    except ImportError:
        pass
    for name, path in sources.items():
        runs[name] = tmp_path / f"run_{name}"
        train(tiny_config(path, runs[name], "--run.tensorboard", "false", "--run.plots", "false"))
    for name in runs:
        same_run(runs["csv"], runs[name])
    assert len(runs) >= 3


def test_datasets_class_label_column_reads_its_names(tmp_path):
    datasets = pytest.importorskip("datasets")
    features = datasets.Features({"text": datasets.Value("string"),
                                  "label": datasets.ClassLabel(names=["neg", "neu", "pos"])})
    datasets.Dataset.from_dict({"text": ["bad", "fine", "good", "awful"], "label": [0, 1, 2, 0]},
                               features=features).save_to_disk(str(tmp_path / "ds"))
    texts, labels = read_table(tmp_path / "ds")
    assert texts == ["bad", "fine", "good", "awful"] and labels == ["neg", "neu", "pos", "neg"]


def test_integer_labels_in_csv_and_json_are_the_same_classes(tmp_path):
    data = [("one", 10), ("two", 2), ("three", 2), ("four", 10), ("five", 1)]
    write_csv(tmp_path / "a.csv", data, header=("text", "label"))
    write_jsonl(tmp_path / "a.jsonl", data, columns=("text", "label"))
    (tmp_path / "b.json").write_text(json.dumps([{"text": t, "label": float(y)} for t, y in data]))
    got = [load_labelled_files(tmp_path / f, tmp_path / "a.jsonl")["train"] for f in ("a.csv", "a.jsonl", "b.json")]
    for split in got:
        assert split.label_names == ("1", "2", "10")                  # numeric order, not "1" < "10" < "2"
        assert split.labels == [2, 1, 1, 2, 0]


def test_held_out_split_is_seeded_and_disjoint(tmp_path):
    write_csv(tmp_path / "n.csv", rows(40), header=("text", "label"))
    a = load_labelled_files(tmp_path / "n.csv", split_seed=3, eval_fraction=0.25)
    b = load_labelled_files(tmp_path / "n.csv", split_seed=3, eval_fraction=0.25)
    c = load_labelled_files(tmp_path / "n.csv", split_seed=4, eval_fraction=0.25)
    assert a == b and a["eval"].texts != c["eval"].texts
    assert len(a["eval"].texts) == 10 and len(a["train"].texts) == 30
    assert sorted(a["train"].texts + a["eval"].texts) == sorted(t for t, _ in rows(40))
    assert list(held_out_rows(10, 0.01, 0)) != [] and len(held_out_rows(10, 0.99, 0)) == 9


# ----------------------------------------------------------------------------- data errors


def _bytes(path, data: bytes):
    path.write_bytes(data)
    return path


DATA_ERRORS = [
    ("missing_text_column.csv", b"title,topic\nhello,a\nbye,b\n", r"missing_text_column.csv, row 1, column 'headline'"
                                                                 r": no such column \(columns: title, topic"),
    ("missing_label.jsonl", b'{"headline": "x", "topic": "a"}\n{"headline": "y"}\n',
     r"missing_label.jsonl, row 2, column 'topic': no such column"),
    ("empty.csv", b"", r"empty.csv: the file is empty"),
    ("header_only.csv", b"headline,topic\n", r"header_only.csv: the file is empty \(no data rows\)"),
    ("one_class.csv", b"headline,topic\na,x\nb,x\nc,x\n", r"one_class.csv, column 'topic': every row has the label "
                                                          r"'x'; a classifier needs at least 2 classes"),
    ("unlabelled.csv", b"headline,topic\na,x\nb,\nc,y\n", r"unlabelled.csv, row 2, column 'topic': no label"),
    ("unlabelled.jsonl", b'{"headline": "a", "topic": "x"}\n{"headline": "b", "topic": null}\n',
     r"unlabelled.jsonl, row 2, column 'topic': no label"),
    ("no_text.tsv", b"headline\ttopic\na\tx\n \ty\n", r"no_text.tsv, row 2, column 'headline': no text"),
    ("bytes.csv", b"headline,topic\na,x\nb\xff\xfe,y\n", r"bytes.csv, line 3: unreadable bytes \(not valid UTF-8"),
    ("bad_json.jsonl", b'{"headline": "a", "topic": "x"}\n{"headline": \n', r"bad_json.jsonl, row 2 \(line 2\): "
                                                                             r"not valid JSON"),
    ("mixed.jsonl", b'{"headline": "a", "topic": 1}\n{"headline": "b", "topic": "x"}\n',
     r"mixed.jsonl, row 2, column 'topic': label 'x' is a str, but row 1's is a int"),
    ("fields.csv", b"headline,topic\na,x,extra\n", r"fields.csv, row 1: 3 fields, but the header has 2"),
    ("notes.txt", b"hello\n", r"notes.txt: unknown file type '.txt'"),
    ("broken.parquet", b"PAR1 not really", r"broken.parquet: not a readable Parquet file"),
]


@pytest.mark.parametrize("name,content,message", DATA_ERRORS, ids=[c[0] for c in DATA_ERRORS])
def test_data_errors_name_file_row_and_column(tmp_path, name, content, message):
    if name.endswith(".parquet"):
        pytest.importorskip("pyarrow")
    path = _bytes(tmp_path / name, content)
    with pytest.raises(DataFormatError, match=message) as info:
        load_labelled_files(path, text_column="headline", label_column="topic")
    assert "\n" not in str(info.value)


def test_eval_label_missing_from_training_file(tmp_path):
    write_csv(tmp_path / "t.csv", [("a", "x"), ("b", "y")])
    write_csv(tmp_path / "e.csv", [("c", "x"), ("d", "z")])
    with pytest.raises(DataFormatError, match=r"e.csv, row 2, column 'topic': label 'z' does not occur in the "
                                              r"training file"):
        load_labelled_files(tmp_path / "t.csv", tmp_path / "e.csv", text_column="headline", label_column="topic")


def test_data_error_stops_train_before_training(tmp_path, capsys):
    _bytes(tmp_path / "u.csv", b"headline,topic\na,x\nb,\n")
    rc = main(["train", "--data.train_file", str(tmp_path / "u.csv"), "--data.text_column", "headline",
               "--data.label_column", "topic", *TINY, "--run.out_dir", str(tmp_path / "r")])
    err = capsys.readouterr().err.strip()
    assert rc == 2 and err.count("\n") == 0
    assert err.startswith("unfoldformer train: error: ") and "u.csv, row 2, column 'topic': no label" in err
    assert not (tmp_path / "r" / "checkpoint.pt").exists()


def test_n_classes_must_agree_with_the_data(tmp_path):
    write_csv(tmp_path / "n.csv", rows(12))
    with pytest.raises(ConfigError, match=r"model.n_classes=2, but .*n.csv has 3 classes \(food, sports, weather\)"):
        train(tiny_config(tmp_path / "n.csv", tmp_path / "r", "--model.n_classes", "2"))
    with pytest.raises(ConfigError, match=r"model.n_classes=3, but sst2 has 2 classes"):
        TrainConfig().replace(model__n_classes=3).validate(check_data=False)
    with pytest.raises(ConfigError, match=r"data.train_file and data.dataset='imdb' exclude each other"):
        TrainConfig().replace(data__dataset="imdb", data__train_file="x.csv").validate(check_data=False)


# ----------------------------------------------------------------------------- resume-extend and print-config


def test_resume_extends_a_finished_run_like_a_straight_run(tmp_path):
    """With a constant learning rate (no warm-up, min_lr_ratio 1) the schedule does not depend on the number
    of epochs, so 1 epoch extended to 2 must equal 2 epochs straight, bit for bit (weights and metrics)."""
    write_csv(tmp_path / "n.csv", rows(24))
    flat = ["--optim.warmup", "0", "--optim.min_lr_ratio", "1.0", "--run.tensorboard", "false", "--run.plots", "false"]
    straight = tiny_config(tmp_path / "n.csv", tmp_path / "straight", *flat, "--optim.epochs", "2")
    train(straight)
    short = tiny_config(tmp_path / "n.csv", tmp_path / "extended", *flat)
    assert train(short)["steps"] == 3
    rc = main(["train", "--run.out_dir", str(tmp_path / "extended"), "--resume", "--optim.epochs", "2"])
    assert rc == 0
    same_run(tmp_path / "straight", tmp_path / "extended")
    with open(tmp_path / "extended" / "metrics.csv", encoding="utf-8") as handle:
        assert [int(r["step"]) for r in csv.DictReader(handle) if r["row"] == "step"] == [2, 4, 6]
    with pytest.raises(ConfigError, match="can only be extended"):
        train(tiny_config(tmp_path / "n.csv", tmp_path / "extended", *flat, "--optim.epochs", "1"), resume=True)


def test_print_config_shows_resolved_model_fields(capsys):
    assert main(["train", "--print-config", "--model.kind", "certified-alternating-untied", "--device", "cpu"]) == 0
    printed = json.loads(capsys.readouterr().out)
    model = printed["model"]
    assert None not in model.values() and model["n_classes"] == 2 and model["depth"] >= 1
    assert model["d_model"] == TrainConfig().replace(model__kind="certified-alternating-untied").model_config().d_model
    assert printed["run"]["device"] == "cpu"


# ----------------------------------------------------------------------------- per-token energies


def test_energies_per_token_divide_by_real_tokens():
    from unfoldformer.config import ModelConfig
    from unfoldformer.model import UnfoldedTransformer
    torch.manual_seed(0)
    model = UnfoldedTransformer(ModelConfig.preset("certified-alternating", d_model=8, n_heads=2, depth=2,
                                                   ffn_hidden=16))
    x = torch.randn(3, 5, 8)                                       # (B, n, d)
    pad = torch.zeros(3, 5, dtype=torch.bool)
    pad[1, 1:] = True                                              # n = 1 (all but one padding)
    pad[2, 3:] = True
    out = model(x, pad, return_energies=True)
    per = out.energies_per_token(pad)                              # (B, depth + 1)
    n = torch.tensor([5.0, 1.0, 3.0], dtype=torch.float64)
    assert per.dtype == torch.float64 and torch.equal(per, out.energies / n[:, None])   # same float64 division
    unpadded = model(x, None, return_energies=True)
    assert torch.equal(unpadded.energies_per_token(None), unpadded.energies / 5.0)
    assert model(x, pad).energies_per_token(pad) is None


def test_metrics_log_without_tensorboard_writes_the_csv(tmp_path, monkeypatch):
    """`tensorboard` absent: one note, no TensorBoard folder, metrics.csv still rewritten then appended."""
    import sys

    from unfoldformer.train.watch import COLUMNS, MetricsLog
    monkeypatch.setitem(sys.modules, "torch.utils.tensorboard", None)      # import now raises ImportError
    notes = []
    log = MetricsLog(tmp_path, tensorboard=True, start_step=0, note=notes.append)
    log.rewrite([{"step": 2, "loss": 1.5}], [{"step": 2, "eval_accuracy": 0.5}])
    log.add({"step": 4, "loss": 1.25, "lr": 1e-3}, "step")
    log.close()
    lines = (tmp_path / "metrics.csv").read_text().splitlines()
    assert lines[0] == ",".join(COLUMNS) and [line.split(",")[:2] for line in lines[1:]] == [
        ["step", "2"], ["eval", "2"], ["step", "4"]]
    assert len(notes) == 1 and "TensorBoard is not installed" in notes[0] and not (tmp_path / "tensorboard").exists()


def test_file_paths_are_stored_absolute(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    cfg = TrainConfig().with_overrides(["--data.train_file", "n.csv", "--data.eval_file", "~/e.csv"])
    assert cfg.data.dataset == "files" and cfg.data.train_file == str(tmp_path / "n.csv")
    assert cfg.data.eval_file == str(__import__("pathlib").Path.home() / "e.csv")
    assert TrainConfig.from_dict(cfg.to_dict()).to_dict() == cfg.to_dict()
