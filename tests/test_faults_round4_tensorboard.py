"""Round 4, TensorBoard keeps every logged point across resumes: a run extended twice by `--resume` and
the same run straight hold the same scalars, read back with TensorBoard's own reader (purges applied)."""
from __future__ import annotations

import random

import pytest

from unfoldformer.train import TrainConfig, train

pytest.importorskip("tensorboard")
TINY = ["--data.embeddings", "random", "--data.embedding_dim", "16", "--model.d_model", "16", "--model.n_heads", "2",
        "--model.depth", "1", "--model.ffn_hidden", "16", "--optim.batch_size", "8", "--run.threads", "1",
        "--run.progress", "false", "--run.plots", "false", "--run.log_every", "1", "--optim.warmup", "0",
        "--optim.min_lr_ratio", "1.0"]


def _scalars(folder) -> dict[str, list[tuple[int, float]]]:
    """Every scalar of the run's TensorBoard log as TensorBoard shows it: {tag: [(step, value), ...]}."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    acc = EventAccumulator(str(folder / "tensorboard"), size_guidance={"scalars": 0})
    acc.Reload()
    return {tag: [(e.step, e.value) for e in acc.Scalars(tag)] for tag in acc.Tags()["scalars"]}


def test_resumes_keep_every_tensorboard_point(tmp_path):
    rng = random.Random(0)
    lines = ["text,label"] + [f"{rng.choice(['good', 'bad', 'fine', 'dull'])} film {i},{i % 2}" for i in range(16)]
    (tmp_path / "n.csv").write_text("\n".join(lines) + "\n")

    def config(out, epochs):
        return TrainConfig().with_overrides(["--data.train_file", str(tmp_path / "n.csv"), *TINY,
                                             "--run.out_dir", str(out), "--optim.epochs", str(epochs)])
    train(config(tmp_path / "straight", 3))
    train(config(tmp_path / "resumed", 1))
    train(config(tmp_path / "resumed", 2), resume=True)
    train(config(tmp_path / "resumed", 3), resume=True)
    straight, resumed = _scalars(tmp_path / "straight"), _scalars(tmp_path / "resumed")
    assert straight and sorted(straight) == sorted(resumed)
    for tag in straight:
        assert [s for s, _ in resumed[tag]] == [s for s, _ in straight[tag]], tag      # no point lost or doubled
        assert resumed[tag] == straight[tag], tag      # bit for bit: the constant schedule ignores the epochs
