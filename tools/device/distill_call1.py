"""Device call 1: build the corpus from the carried texts (checked against the local build's sha256),
smoke-test the distillation pipeline on CUDA with a random-weight teacher of MiniLM's shape, and time
student + teacher steps at several batch sizes, alone and two processes at once."""
import hashlib
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import torch

W = Path(os.environ.get("W", "/tmp/w"))
DEVICE = os.environ.get("DEVICE", "cuda")
SMALL = os.environ.get("SMALL") == "1"
HERE = Path(__file__).resolve().parent
print("torch", torch.__version__, torch.cuda.get_device_name(0) if torch.cuda.is_available() else "cpu", flush=True)

import unfoldformer.distill.loop as L  # noqa: E402
import unfoldformer.distill.student as S  # noqa: E402
import unfoldformer.distill.teacher as T  # noqa: E402
from unfoldformer.distill.config import DistillConfig  # noqa: E402
from unfoldformer.distill.corpus import Corpus, build_corpus  # noqa: E402

expected = json.loads((HERE / "expected.json").read_text())
FAKE = W / "fake"


def patch(folder: Path) -> None:
    def teacher_folder(spec="minilm"):
        return folder
    T.teacher_folder = teacher_folder
    S.teacher_folder = teacher_folder
    L.dataset_files = lambda name, data_dir=None: expected["files"][name]


def key() -> dict:
    return {"sources": ["sst2", "imdb"], "max_length": 128, "seed": 0, "files": expected["files"]}


def stage_corpus(out: Path, corpus: Corpus) -> None:
    out.mkdir(parents=True, exist_ok=True)
    corpus.save(out / "corpus.npz")
    (out / "corpus.json").write_text(json.dumps({"key": key(), **corpus.info}))


def build() -> Corpus:
    if (W / "corpus.npz").exists():
        return Corpus.load(W / "corpus.npz", json.loads((W / "corpus_info.json").read_text()))
    t0 = time.time()
    texts = json.loads((W / "texts.json").read_text())
    if SMALL:
        texts = texts[:3000]
    corpus = build_corpus(texts, T.WordPieces(W / "teacher"), 128, 0)
    digest = hashlib.sha256(corpus.ids.tobytes() + corpus.lengths.tobytes()).hexdigest()
    print("corpus sha256 matches the local build:", digest == expected["sha256"], corpus.info,
          f"{time.time() - t0:.1f} s", flush=True)
    corpus.save(W / "corpus.npz")
    (W / "corpus_info.json").write_text(json.dumps(corpus.info))
    return corpus


def fake_teacher() -> None:
    if (FAKE / "model.safetensors").exists():
        return
    from transformers import BertConfig, BertModel
    torch.manual_seed(0)
    model = BertModel(BertConfig.from_json_file(str(W / "teacher" / "config.json")))
    model.save_pretrained(str(FAKE))
    (FAKE / "tokenizer.json").write_bytes((W / "teacher" / "tokenizer.json").read_bytes())


def smoke(corpus: Corpus) -> None:
    t0 = time.time()
    for name, tied in (("smoke-tied", True), ("smoke-untied", False)):
        out = W / "runs" / name
        stage_corpus(out, corpus)
        cfg = dict(out=str(out), tied=tied, steps=20, limit=2000, holdout=64, batch_size=16,
                   checkpoint_every=10, eval_every=10, log_every=5, device=DEVICE)
        print(name, L.distill(DistillConfig(**cfg)), flush=True)
        if tied:
            print(name, "resumed", L.distill(DistillConfig(**{**cfg, "steps": 30}), resume=True), flush=True)
            model = S.DistilledEncoder.from_pretrained(str(out / "model")).to(DEVICE)
            vec = model.encode(["a fine film", "a dull one", "x"])
            print("encode", tuple(vec.shape), vec.norm(dim=-1).tolist(), flush=True)
            ids, mask = model.word_pieces.encode(["a fine film", "a dull and long one " * 10], 128)
            _, enc = model(ids.to(DEVICE), mask.to(DEVICE), return_energies=True)
            print("layer_before", enc.layer_before.dtype, enc.layer_before.tolist(), flush=True)
            print("layer_after ", enc.layer_after.tolist(), flush=True)
            print("descended everywhere:", bool((enc.layer_after <= enc.layer_before).all()), flush=True)
    print(f"smoke done in {time.time() - t0:.1f} s", flush=True)


def bench_one(tied: bool, batch: int, seconds: float) -> None:
    """Steps of the real loop's work (teacher forward, student forward + backward, AdamW) for `seconds`."""
    corpus = Corpus.load(W / "corpus.npz", json.loads((W / "corpus_info.json").read_text()))
    teacher = T.Teacher("minilm", DEVICE)
    cfg = DistillConfig(out=str(W / "runs" / "unused"), tied=tied, batch_size=batch, device=DEVICE)
    student = L.build_student(cfg, teacher).to(DEVICE).train()
    opt = L._optimizer(student, cfg)
    from unfoldformer.data.batching import BucketBatchSampler
    sampler = iter(BucketBatchSampler(corpus.lengths[:-512], batch, 0))
    done, windows, t0 = 0, 0, None
    while True:
        rows = next(sampler)
        ids, mask = corpus.batch(rows, teacher.word_pieces)
        ids, mask = ids.to(DEVICE), mask.to(DEVICE)
        target = teacher.states(ids, mask)
        loss, _, _ = L.distill_loss(student(ids, mask), target, mask, "mse", 1.0)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(student.parameters(), 1.0)
        opt.step()
        loss.item()
        done += 1
        if done == 3:
            t0, windows = time.time(), 0
        elif t0 is not None:
            windows += len(rows)
            if time.time() - t0 > seconds:
                break
    dt = time.time() - t0
    print(f"bench tied={tied} batch={batch}: {1000 * dt / (done - 3):.1f} ms/step, {windows / dt:.0f} windows/s, "
          f"max memory {torch.cuda.max_memory_allocated() / 2**30 if DEVICE == 'cuda' else 0:.2f} GiB", flush=True)


if __name__ == "__main__":
    if len(sys.argv) > 1:                                  # bench child: tied batch seconds
        patch(FAKE)
        bench_one(sys.argv[1] == "1", int(sys.argv[2]), float(sys.argv[3]))
        sys.exit(0)
    corpus = build()
    fake_teacher()
    patch(FAKE)
    smoke(corpus)
    secs = "2" if SMALL else "8"
    child = [sys.executable, __file__]
    for tied in ("1", "0"):
        for batch in ("32", "64", "128") if not SMALL else ("8",):
            subprocess.run([*child, tied, batch, secs], check=True)
    print("two at once (tied 32 + untied 32):", flush=True)
    procs = [subprocess.Popen([*child, t, "32" if not SMALL else "8", secs]) for t in ("1", "0")]
    print([p.wait() for p in procs])
    print("two at once (tied 64 + untied 64):", flush=True)
    procs = [subprocess.Popen([*child, t, "64" if not SMALL else "8", secs]) for t in ("1", "0")]
    print([p.wait() for p in procs])
