"""The README's quick start runs as written: its `unfoldformer train` line is a valid config, and its
Python blocks run in order (with a tiny trained run at runs/sst2)."""
import re
import shlex

import torch

from conftest import REPO_ROOT, TINY_TRAIN
from unfoldformer.train import TrainConfig, train


def _quick_start() -> str:
    section = re.search(r"## Quick start\n(.*?)\n## ", (REPO_ROOT / "README.md").read_text(), re.S)
    assert section is not None, "README has no Quick start section"
    return section.group(1)


def test_readme_train_command_is_a_valid_config():
    line = next(l for l in _quick_start().splitlines() if l.startswith("unfoldformer train "))
    cfg = TrainConfig().with_overrides(shlex.split(line)[2:])
    assert (cfg.model.kind, cfg.data.dataset, cfg.run.out_dir) == ("certified", "sst2", "runs/sst2")
    assert cfg.model_config().layer == "joint" and cfg.model_config().tied      # the recommended joint layer
    commands = re.search(r"```bash\n(.*?)```", _quick_start(), re.S).group(1)
    assert "--safeguard" not in commands                                         # its curves never rise unaided


def test_readme_quickstart_runs_as_written(sst2_dir, tmp_path, monkeypatch):
    blocks = re.findall(r"```python\n(.*?)```", _quick_start(), re.S)
    assert len(blocks) == 3, "README's Quick start should have its three Python blocks"
    monkeypatch.chdir(tmp_path)
    train(TrainConfig().with_overrides([*TINY_TRAIN, "--data.data_dir", str(sst2_dir), "--model.d_model", "64",
                                        "--run.out_dir", "runs/sst2", "--optim.epochs", "1"]))
    torch.manual_seed(0)
    namespace: dict = {}
    for block in blocks:
        exec(compile(block, "README.md", "exec"), namespace)    # noqa: S102
        if "CertifiedEncoder" in block:                          # the own-network block: a curve per sample
            assert namespace["out"].energies.shape == (2, 7) and (tmp_path / "my-encoder").is_dir()
    assert namespace["out"].energies.shape == (4, 7) and namespace["predictor"].unfolded
    p = namespace["p"]
    assert p.never_rises is True and len(p.energies) == namespace["predictor"].model.encoder.config.depth + 1


def test_readme_opens_with_the_two_commands_and_ci_runs_the_test_command_verbatim():
    blocks = re.findall(r"```bash\n(.*?)\n```", (REPO_ROOT / "README.md").read_text(), re.S)
    assert blocks[:2] == ['pip install torch==2.13.0 -e ".[pretrained]" && unfoldformer reproduce --quick',
                          'pip install torch==2.13.0 -e ".[dev]" && python -m pytest']
    assert blocks[1] in (REPO_ROOT / ".ci" / "run").read_text().splitlines()


def test_readme_is_a_front_door_of_at_most_250_lines():
    assert len((REPO_ROOT / "README.md").read_text().splitlines()) <= 250
