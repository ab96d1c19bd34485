"""Round 4, non-finite parameters: refused at load (pretrained folders, checkpoints) and after a training
step, with the parameter's name."""
from __future__ import annotations

import pytest
import torch

import unfoldformer as uf
from conftest import resign_model_folder
from unfoldformer.errors import UnfoldformerError


@pytest.mark.parametrize("value", [float("nan"), float("inf"), -float("inf")], ids=["nan", "inf", "-inf"])
@pytest.mark.parametrize("kind", ["layer", "joint-encoder"])
def test_a_pretrained_folder_with_a_non_finite_weight_is_refused(tmp_path, value, kind):
    from safetensors.torch import load_file
    if kind == "layer":
        model, cls = uf.CertifiedEncoderLayer(16, 2, 32), uf.CertifiedEncoderLayer
    else:
        model = uf.build_encoder(uf.ModelConfig.preset("certified", d_model=16, n_heads=2, depth=2,
                                                       ffn_hidden=16, learn_steps=True))
        cls = type(model)
    model.save_pretrained(tmp_path / "m")
    tensors = load_file(tmp_path / "m" / "model.safetensors")
    name = sorted(tensors)[-1]
    tensors[name] = tensors[name].clone().reshape(-1).index_fill(0, torch.tensor([0]), value).reshape(
        tensors[name].shape)
    resign_model_folder(tmp_path / "m", tensors)
    with pytest.raises(UnfoldformerError, match=rf"tensor '{name}' holds 1 non-finite value") as info:
        cls.from_pretrained(tmp_path / "m")
    assert "\n" not in str(info.value)


def test_a_checkpoint_state_with_a_nan_is_refused_by_name():
    from unfoldformer.train import TrainConfig
    from unfoldformer.train.checkpoint import CheckpointError, restore_model_state
    layer = uf.CertifiedEncoderLayer(16, 2, 32)
    state = {k: v.clone() for k, v in layer.state_dict().items()}
    name = sorted(state)[0]
    state[name].view(-1)[0] = float("nan")
    with pytest.raises(CheckpointError, match=rf"tensor '{name}' holds 1 non-finite"):
        restore_model_state(layer, state, TrainConfig().with_overrides(["--model.trainable_embeddings", "true"]),
                            "weights.safetensors")


def test_a_learned_ffn_weight_that_overflows_stops_training_by_name(sst2_dir, tmp_path, monkeypatch):
    from unfoldformer.train import TrainConfig, loop, train
    made = loop.make_optimizer

    def poisoned(model, cfg):
        optimizer = made(model, cfg)
        raw = dict(model.named_parameters())
        target = next(p for n, p in raw.items() if n.endswith("ffn_weight_raw"))
        optimizer.register_step_post_hook(lambda *_: target.data.fill_(float("inf")))    # the overflow
        return optimizer
    monkeypatch.setattr(loop, "make_optimizer", poisoned)
    cfg = TrainConfig().with_overrides([
        "--data.data_dir", str(sst2_dir), "--run.out_dir", str(tmp_path / "run"), "--data.embeddings", "random",
        "--data.embedding_dim", "16", "--model.kind", "certified", "--model.d_model", "16", "--model.n_heads",
        "2", "--model.depth", "2", "--model.ffn_hidden", "16", "--model.learn_steps", "true",
        "--optim.batch_size", "16", "--data.max_train_examples", "32", "--optim.epochs", "1", "--run.threads", "1",
        "--run.progress", "false", "--run.tensorboard", "false", "--run.plots", "false"])
    with pytest.raises(loop.TrainingDivergedError, match=r"at step 1: parameter '[\w.]*ffn_weight_raw' is no longer "
                                                         r"finite after the optimiser step") as info:
        train(cfg)
    assert "\n" not in str(info.value)
