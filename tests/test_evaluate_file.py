"""Scoring a new labelled file with a trained run: `evaluate_checkpoint(eval_file=...)` and `unfoldformer evaluate
RUN --data.eval_file F`. Labels are matched by the run's class names (an unseen one is refused naming it and its
row); per-class precision, recall and F1, their macro averages and the confusion matrix are printed, stored in
the JSON output and drawn beside it.

The score references are independent of `train.scores`: explicit loops over the examples, and scikit-learn's
`precision_recall_fscore_support` / `confusion_matrix`. The end-to-end confusion matrix is checked against the
predictions of `uf.load(RUN)` (the inference path, not the evaluation loop) counted by a loop.
"""
from __future__ import annotations

import json

import numpy as np
import pytest
from sklearn.metrics import confusion_matrix as sk_confusion
from sklearn.metrics import precision_recall_fscore_support

import unfoldformer as uf
from test_own_data import TINY, rows, write_csv, write_jsonl
from unfoldformer.cli import main
from unfoldformer.data.files import DataFormatError
from unfoldformer.data.tables import read_labelled_file
from unfoldformer.train import ConfigError, evaluate_checkpoint
from unfoldformer.train.scores import class_scores, confusion_matrix

NAMES = ("food", "sports", "weather")

# Every score is a ratio of two integer counts below 2^53, computed once in float64 (correctly rounded) by both
# the code and sklearn, so per-class values agree exactly; a macro mean of K such ratios may differ by the
# summation order, at most K·2^-53 relative to the mean's terms (≤ 1), far below 1e-12.
MEAN_TOL = 1e-12


def loop_scores(labels, predictions, k):
    """Per-class (precision, recall, f1, support, predicted), each from explicit counts over the examples;
    None where the ratio is 0/0."""
    out = []
    for c in range(k):
        tp = sum(1 for t, p in zip(labels, predictions) if t == c and p == c)
        fp = sum(1 for t, p in zip(labels, predictions) if t != c and p == c)
        fn = sum(1 for t, p in zip(labels, predictions) if t == c and p != c)
        ratio = lambda a, b: a / b if b else None                                   # noqa: E731
        out.append((ratio(tp, tp + fp), ratio(tp, tp + fn), ratio(2 * tp, 2 * tp + fp + fn), tp + fn, tp + fp))
    return out


# ----------------------------------------------------------------------------- the scores (no model)


@pytest.mark.parametrize("k, n, seed, absent, never", [
    (2, 40, 0, None, None), (5, 200, 1, None, None), (7, 300, 2, 3, None), (7, 300, 3, None, 5), (30, 500, 4, 0, 29)])
def test_scores_match_loops_and_sklearn(k, n, seed, absent, never):
    rng = np.random.default_rng(seed)
    labels = rng.integers(0, k, n)                                                   # (N,)
    predictions = np.where(rng.random(n) < 0.6, labels, rng.integers(0, k, n))       # (N,) 60 % right, then random
    if absent is not None:                                                           # a class the data lacks
        labels = np.where(labels == absent, (absent + 1) % k, labels)
    if never is not None:                                                            # a class never predicted
        predictions = np.where(predictions == never, (never + 1) % k, predictions)
    names = [f"class{c}" for c in range(k)]
    scores = class_scores(confusion_matrix(labels, predictions, k), names)

    explicit = [[sum(1 for t, p in zip(labels, predictions) if t == a and p == b) for b in range(k)] for a in range(k)]
    assert scores["confusion"] == explicit == sk_confusion(labels, predictions, labels=range(k)).tolist()
    for row, (p, r, f, support, predicted) in zip(scores["classes"], loop_scores(labels, predictions, k)):
        assert (row["precision"], row["recall"], row["f1"]) == (p or 0.0, r or 0.0, f or 0.0)
        assert (row["support"], row["predicted"]) == (support, predicted)
    sk_p, sk_r, sk_f, sk_s = precision_recall_fscore_support(labels, predictions, labels=range(k), zero_division=0)
    assert [row["precision"] for row in scores["classes"]] == sk_p.tolist()
    assert [row["recall"] for row in scores["classes"]] == sk_r.tolist()
    assert [row["f1"] for row in scores["classes"]] == pytest.approx(sk_f.tolist(), rel=1e-15, abs=0)
    present = sorted(set(labels.tolist()))
    macro = precision_recall_fscore_support(labels, predictions, labels=present, average="macro", zero_division=0)
    assert [scores["macro"][key] for key in ("precision", "recall", "f1")] == pytest.approx(macro[:3], rel=MEAN_TOL)
    assert scores["macro"]["classes"] == len(present) == k - (absent is not None)
    assert scores["accuracy"] == np.mean(labels == predictions) and scores["n"] == n
    assert scores["undefined"]["recall"] == ([f"class{absent}"] if absent is not None else [])
    assert scores["undefined"]["precision"] == ([f"class{never}"] if never is not None else [])


def test_class_never_predicted_reports_zero_precision_and_names_it():
    # class 2 occurs twice but is never predicted: precision 0/0 -> 0 (named), recall 0/2 = 0, F1 0
    scores = class_scores(confusion_matrix([0, 0, 1, 2, 2], [0, 0, 1, 1, 0], 3), NAMES)
    weather = scores["classes"][2]
    assert (weather["precision"], weather["recall"], weather["f1"], weather["predicted"]) == (0.0, 0.0, 0.0, 0)
    assert scores["undefined"] == {"precision": ["weather"], "recall": [], "f1": []}
    # food: tp 2, fp 1 (a weather text), fn 0
    assert scores["classes"][0]["precision"] == 2 / 3 and scores["classes"][0]["recall"] == 1.0
    assert scores["macro"]["classes"] == 3


def test_class_absent_from_the_data_keeps_its_row_outside_the_macro_average():
    # nothing is truly 'weather', but one text is predicted as it: precision 0/1, recall 0/0 -> 0 (named)
    scores = class_scores(confusion_matrix([0, 0, 1, 1], [0, 2, 1, 1], 3), NAMES)
    weather = scores["classes"][2]
    assert (weather["support"], weather["predicted"], weather["precision"], weather["recall"]) == (0, 1, 0.0, 0.0)
    assert scores["undefined"] == {"precision": [], "recall": ["weather"], "f1": []}
    food, sports = scores["classes"][:2]
    assert (food["precision"], food["recall"], sports["precision"], sports["recall"]) == (1.0, 0.5, 1.0, 1.0)
    assert scores["macro"] == {"precision": 1.0, "recall": 0.75, "f1": (2 / 3 + 1.0) / 2, "classes": 2}
    # absent and never predicted: every ratio is 0/0
    unused = class_scores(confusion_matrix([0, 1], [0, 1], 3), NAMES)
    assert unused["undefined"] == {"precision": ["weather"], "recall": ["weather"], "f1": ["weather"]}


def test_one_class_and_all_correct():
    one = class_scores(confusion_matrix([0, 0, 0], [0, 0, 0], 1), ["only"])
    assert one["classes"] == [{"label": "only", "precision": 1.0, "recall": 1.0, "f1": 1.0, "support": 3,
                               "predicted": 3}]
    assert one["confusion"] == [[3]] and one["accuracy"] == 1.0
    labels = list(range(12)) * 3
    many = class_scores(confusion_matrix(labels, labels, 12), [str(c) for c in range(12)])
    assert all(row["precision"] == row["recall"] == row["f1"] == 1.0 for row in many["classes"])
    assert many["confusion"] == np.diag([3] * 12).tolist() and many["macro"]["f1"] == 1.0
    assert many["undefined"] == {"precision": [], "recall": [], "f1": []}


def test_scores_refuse_what_is_not_a_confusion_matrix():
    with pytest.raises(ValueError, match="example 1: class 3 predicted as 0, outside 0 … 2"):
        confusion_matrix([0, 3], [0, 0], 3)
    with pytest.raises(ValueError, match="2 labels but 1 predictions"):
        confusion_matrix([0, 1], [0], 2)
    with pytest.raises(ValueError, match=r"shape \(2, 2\) for 3 label names"):
        class_scores(np.eye(2, dtype=int), NAMES)


def test_table_names_undefined_scores_and_leaves_a_wide_matrix_to_the_json():
    from unfoldformer.cli.evaluate import scores_table
    three = scores_table(class_scores(confusion_matrix([0, 0, 1, 2, 2], [0, 0, 1, 1, 0], 3), NAMES))
    assert "never predicted: precision undefined, shown as 0: weather" in three
    assert three.splitlines()[-1].split() == ["weather", "1", "1", "0"]               # the last row of the matrix
    labels = [c % 25 for c in range(100)]
    wide = scores_table(class_scores(confusion_matrix(labels, labels, 25), [f"c{c}" for c in range(25)]))
    lines = wide.splitlines()
    assert len(lines) == 1 + 25 + 2 + 1 and lines[-1].startswith("confusion matrix: 25 classes, see the JSON")
    assert lines[26].split()[:5] == ["macro", "avg", "1.000", "1.000", "1.000"]


# ----------------------------------------------------------------------------- reading a file by the run's names


def test_file_labels_are_matched_by_the_run_names(tmp_path):
    data = read_labelled_file(write_csv(tmp_path / "e.csv", [("a", "weather"), ("b", "food")]), NAMES,
                              "headline", "topic")
    assert data.labels == [2, 0] and data.label_names == NAMES
    ints = ("0", "1", "7")                                        # a run trained on integer labels 0, 1, 7
    assert read_labelled_file(write_jsonl(tmp_path / "i.jsonl", [("a", 7), ("b", 0)], ("text", "label")),
                              ints).labels == [2, 0]
    assert read_labelled_file(write_csv(tmp_path / "i.csv", [("a", "7"), ("b", "1")], ("text", "label")),
                              ints).labels == [2, 1]
    with pytest.raises(DataFormatError, match=r"u.csv, row 2, column 'topic': label 'music' is not one of the "
                                              r"run's classes \(food, sports, weather\)$"):
        read_labelled_file(write_csv(tmp_path / "u.csv", [("a", "food"), ("b", "music")]), NAMES, "headline", "topic")
    with pytest.raises(DataFormatError, match=r"row 1, column 'label': label '07' is not one of"):
        read_labelled_file(write_csv(tmp_path / "z.csv", [("a", "07"), ("b", "x")], ("text", "label")), ints)


# ----------------------------------------------------------------------------- a trained run scores a new file


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """A 3-class CSV run (1 epoch, 11 steps at lr 1e-2, random 16-d embeddings: it predicts every class, with
    errors, so the confusion matrix has off-diagonal counts) and a new file of 30 unseen headlines."""
    folder = tmp_path_factory.mktemp("evalfile")
    write_csv(folder / "news.csv", rows(96))
    out = folder / "run"
    assert main(["train", "--data.train_file", str(folder / "news.csv"), "--data.text_column", "headline",
                 "--data.label_column", "topic", *TINY, "--optim.lr", "1e-2", "--run.plots", "false",
                 "--run.tensorboard", "false", "--run.out_dir", str(out)]) == 0
    new = rows(30, seed=7)
    return folder, out, new


def test_scores_of_a_new_file_equal_the_predictors_counts(run):
    folder, out, new = run
    path = write_jsonl(folder / "new.jsonl", new, ("sentence", "category"))
    res = evaluate_checkpoint(out, eval_file=path, text_column="sentence", label_column="category",
                              energies=False)
    predicted = [p.label for p in uf.load(out, device="cpu")([text for text, _ in new], energies=False)]
    truth = [NAMES.index(label) for _, label in new]
    counts = [[sum(1 for t, p in zip(truth, predicted) if (t, p) == (a, b)) for b in range(3)] for a in range(3)]
    assert res["confusion"] == counts and res["n"] == 30 and res["split"] is None
    assert len(set(predicted)) == 3 and 0 < res["accuracy"] < 1                     # a matrix worth checking
    assert res["accuracy"] == sum(t == p for t, p in zip(truth, predicted)) / 30
    assert [row["label"] for row in res["classes"]] == list(NAMES) == res["label_names"]
    assert [row["support"] for row in res["classes"]] == [truth.count(c) for c in range(3)]
    record = res["eval_file"]
    assert record["path"] == str(path) and record["bytes"] == path.stat().st_size
    assert (record["text_column"], record["label_column"]) == ("sentence", "category")


def test_cli_prints_the_table_writes_json_and_figure(run, capsys):
    folder, out, new = run
    path = write_csv(folder / "subset.csv", [r for r in new if r[1] != "food"])     # the run's columns, no 'food'
    capsys.readouterr()
    assert main(["evaluate", str(out), "--data.eval_file", str(path), "--no-energies", "--output",
                 str(folder / "scores.json")]) == 0
    captured = capsys.readouterr()
    printed, saved = json.loads(captured.out), json.loads((folder / "scores.json").read_text())
    assert printed == saved and saved["n"] == 20 and saved["eval_file"]["path"] == str(path)
    assert saved["classes"][0]["support"] == 0 and saved["undefined"]["recall"] == ["food"]
    assert saved["macro"]["classes"] == 2
    assert saved["macro"]["recall"] == pytest.approx(np.mean([row["recall"] for row in saved["classes"][1:]]),
                                                     rel=MEAN_TOL)
    lines = captured.err.splitlines()                                  # the progress bar's lines, then the table
    table = lines[next(i for i, line in enumerate(lines) if line.startswith("class ")):]
    assert table[0].split() == ["class", "precision", "recall", "f1", "support", "predicted"]
    for name, line in zip(NAMES, table[1:4]):
        row = saved["classes"][NAMES.index(name)]
        assert line.split() == [name, f"{row['precision']:.3f}", f"{row['recall']:.3f}", f"{row['f1']:.3f}",
                                str(row["support"]), str(row["predicted"])]
    assert table[4].startswith("macro avg") and "over the 2 classes present" in table[4]
    assert "absent from the data: recall undefined, shown as 0: food" in captured.err
    assert table[-5].startswith("confusion matrix (rows: true class") and table[-4].split() == list(NAMES)
    assert [line.split()[0] for line in table[-3:]] == list(NAMES)
    assert [[int(v) for v in line.split()[1:]] for line in table[-3:]] == saved["confusion"]
    figure = folder / "scores.confusion.png"
    import matplotlib.image
    height, width, _ = matplotlib.image.imread(figure).shape
    assert width > height > 100


def test_unknown_label_is_refused_in_one_line(run, capsys):
    folder, out, _ = run
    path = write_csv(folder / "bad.csv", [("goal match", "sports"), ("pasta", "food"), ("jazz", "music")])
    capsys.readouterr()
    assert main(["evaluate", str(out), "--data.eval_file", str(path), "--output", str(folder / "bad.json")]) == 2
    err = capsys.readouterr().err
    assert err == (f"unfoldformer evaluate: error: {path}, row 3, column 'topic': label 'music' is not one of the "
                   "run's classes (food, sports, weather)\n")
    assert not (folder / "bad.json").exists() and not (folder / "bad.confusion.png").exists()


@pytest.mark.parametrize("args, message", [
    (["--split", "eval", "--data.eval_file", "F"], "--split and --data.eval_file exclude each other"),
    (["--data.text_column", "t"], "--data.text_column and --data.label_column choose the columns of --data.eval_file"),
    (["--data.eval_file", "/nonexistent/e.csv"], "/nonexistent/e.csv: no such file or folder"),
    (["--data.eval_file", ""], "--data.eval_file is empty; give a path"),
])
def test_file_options_are_checked_before_any_work(run, capsys, args, message):
    _, out, _ = run
    assert main(["evaluate", str(out), *args]) == 2
    err = capsys.readouterr().err
    assert err.startswith("unfoldformer evaluate: error: ") and message in err and err.count("\n") == 1


def test_python_entry_point_refuses_columns_without_a_file(run):
    _, out, _ = run
    with pytest.raises(ConfigError, match="text_column and label_column choose the columns of an eval_file"):
        evaluate_checkpoint(out, label_column="topic")
