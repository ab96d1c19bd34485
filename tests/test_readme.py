"""The README's Python quick-start runs as written (with a tiny trained run at runs/sst2)."""
import re

import torch

from conftest import REPO_ROOT, TINY_TRAIN
from unfoldformer.train import TrainConfig, train


def test_readme_quickstart_runs_as_written(sst2_dir, tmp_path, monkeypatch):
    block = re.search(r"## Quick start\n\n```python\n(.*?)```", (REPO_ROOT / "README.md").read_text(), re.S)
    assert block is not None, "README has no Python quick-start block"
    monkeypatch.chdir(tmp_path)
    train(TrainConfig().with_overrides([*TINY_TRAIN, "--data.data_dir", str(sst2_dir), "--model.d_model", "64",
                                        "--run.out_dir", "runs/sst2", "--optim.epochs", "1"]))
    torch.manual_seed(0)
    namespace: dict = {}
    exec(compile(block.group(1), "README.md", "exec"), namespace)    # noqa: S102
    assert namespace["out"].energies.shape == (4, 7) and namespace["predictor"].unfolded
