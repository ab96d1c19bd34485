"""Linear probes of frozen sentence embeddings: MiniLM, distilled certified encoders, random layers, bag of pieces.

    python benchmarks/pretrained.py --models teacher bag-of-pieces
    python benchmarks/pretrained.py --models random-tied random-untied
    python benchmarks/pretrained.py --models distilled-tied=runs/distill/model     # NAME=FOLDER of a student
    python benchmarks/pretrained.py --table                                         # results/pretrained/probes.md

Each model embeds every text as the mean of its output token states over the real tokens (the
teacher's [CLS] ... [SEP] word pieces, at most 128 of them: longer reviews are truncated), L2-normalised.
A logistic regression (scikit-learn, standardised features, lbfgs, its inverse regularisation C chosen
from 0.001, 0.01, 0.1, 1, 10 by 5-fold cross-validation on the training subset alone) is fitted on a
seeded training subset and scored on an evaluation set:
- `sst2`: 2,000 SST-2 training sentences -> the whole SST-2 dev split (872);
- `imdb`: 1,000 IMDB training reviews -> a fixed subset of 1,000 IMDB test reviews (positive / negative);
- `imdb-stars`: the same reviews, 8 classes = the star ratings 1-4 and 7-10 of the file names.
Subsets: `data.batching.seeded_subset(n, k, seed=0)`, stream 1 for training rows and 2 for test rows.
Models: `teacher` (all-MiniLM-L6-v2 as sentence-transformers pools it), `random-tied` / `random-untied`
(the distilled student's architecture, certified joint, depth 6, with its seed-0 random layers and identity
readout), `bag-of-pieces` (the mean of the word-piece table rows of the pieces, no position, no layer),
and any saved `DistilledEncoder` as NAME=FOLDER.
Results: benchmarks/results/pretrained/probes-<model>.json, written whole. Embeddings are cached as
`<cache>/pretrained-probes/<model>-<part>.npy` (the package cache folder; a saved student's entry also
keys on its weights' sha256), so a probe can be refitted without embedding again.
"""
from __future__ import annotations

import argparse
import io
import json
import re
import sys
import tarfile
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "src"))

from unfoldformer.config import ModelConfig  # noqa: E402
from unfoldformer.data import load_imdb, load_sst2  # noqa: E402
from unfoldformer.data.batching import seeded_subset  # noqa: E402
from unfoldformer.data.files import find_data_file  # noqa: E402
from unfoldformer.distill import DistilledEncoder, Teacher, mean_pool  # noqa: E402
from unfoldformer.utils import write_json  # noqa: E402

RESULTS = HERE / "results" / "pretrained"
MAX_LENGTH, SST2_TRAIN, IMDB_TRAIN, IMDB_TEST = 128, 2000, 1000, 1000
_NAME = re.compile(r"^(\d+)_(\d+)\.txt$")


def imdb_ratings(split: str) -> list[int]:
    """Star ratings of IMDB `split`'s reviews in `load_imdb`'s order (neg then pos, each by id), from file names."""
    found: dict[str, dict[int, int]] = {"neg": {}, "pos": {}}
    with tarfile.open(find_data_file("aclImdb_v1.tar.gz"), "r:gz") as tar:
        for info in tar:
            parts = info.name.removeprefix("./").removeprefix("aclImdb/").split("/")
            if len(parts) == 3 and parts[0] == split and parts[1] in found and _NAME.match(parts[2]):
                review_id, rating = map(int, _NAME.match(parts[2]).groups())
                found[parts[1]][review_id] = rating
    return [found[f][i] for f in ("neg", "pos") for i in sorted(found[f])]


def tasks() -> dict:
    """{task: (train texts, train labels, test texts, test labels)} (module doc)."""
    sst_train, sst_dev = load_sst2("train"), load_sst2("dev")
    rows = seeded_subset(len(sst_train), SST2_TRAIN, 0, 1)
    out = {"sst2": ([sst_train[i].text for i in rows], [sst_train[i].label for i in rows],
                    [e.text for e in sst_dev], [e.label for e in sst_dev])}
    imdb_train, imdb_test = load_imdb("train"), load_imdb("test")
    stars_train, stars_test = imdb_ratings("train"), imdb_ratings("test")
    assert len(stars_train) == len(imdb_train) and len(stars_test) == len(imdb_test)
    tr, te = seeded_subset(len(imdb_train), IMDB_TRAIN, 0, 1), seeded_subset(len(imdb_test), IMDB_TEST, 0, 2)
    texts_tr, texts_te = [imdb_train[i].text for i in tr], [imdb_test[i].text for i in te]
    out["imdb"] = (texts_tr, [imdb_train[i].label for i in tr], texts_te, [imdb_test[i].label for i in te])
    out["imdb-stars"] = (texts_tr, [stars_train[i] for i in tr], texts_te, [stars_test[i] for i in te])
    return out


def embedder(name: str, teacher: Teacher):
    """texts -> (N, d) float array, for model `name` (module doc)."""
    if name == "teacher":
        return lambda texts: teacher.encode(texts, MAX_LENGTH).numpy()
    if name == "bag-of-pieces":
        table = teacher.model.embeddings.word_embeddings.weight.detach()

        def bag(texts):
            ids, mask = teacher.word_pieces.encode(texts, MAX_LENGTH)
            inner = mask.clone()
            inner[:, 0] = True                                                   # no [CLS]
            inner[torch.arange(len(texts)), (~mask).sum(1) - 1] = True           # no [SEP]
            return F.normalize(mean_pool(F.embedding(ids, table), inner), dim=-1).numpy()
        return lambda texts: np.concatenate([bag(texts[i:i + 256]) for i in range(0, len(texts), 256)])
    if name in ("random-tied", "random-untied"):
        torch.manual_seed(0)
        cfg = ModelConfig.preset("certified", d_model=384, n_heads=12, ffn_hidden=1536, depth=6,
                                 tied=name == "random-tied")
        student = DistilledEncoder(cfg, readout="identity", max_length=MAX_LENGTH).eval()
        return lambda texts: student.encode(texts).numpy()
    label, _, folder = name.partition("=")
    student = DistilledEncoder.from_pretrained(folder).eval()
    return lambda texts: student.encode(texts).numpy()


CS = (0.001, 0.01, 0.1, 1.0, 10.0)
PROBE = f"StandardScaler + LogisticRegressionCV(Cs={list(CS)}, 5-fold on the training subset, lbfgs, max_iter=2000)"


def probe(train_x, train_y, test_x, test_y) -> tuple[float, float]:
    """(test accuracy, the C chosen) of the cross-validated logistic regression."""
    from sklearn.linear_model import LogisticRegressionCV
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import StandardScaler
    model = make_pipeline(StandardScaler(), LogisticRegressionCV(Cs=list(CS), cv=5, max_iter=2000))
    model.fit(train_x, train_y)
    return float(model.score(test_x, test_y)), float(model[-1].C_[0])


def _cache_key(name: str) -> str:
    label, _, folder = name.partition("=")
    if not folder:
        return label
    from unfoldformer.utils import file_sha256
    return f"{label}-{file_sha256(Path(folder) / 'model.safetensors')[:16]}"


def run(name: str, teacher: Teacher, data: dict) -> dict:
    embed, started = embedder(name, teacher), time.time()
    from unfoldformer.data.files import cache_dir
    from unfoldformer.utils import atomic_write_bytes
    folder = cache_dir() / "pretrained-probes"
    folder.mkdir(parents=True, exist_ok=True)
    parts = {"sst2": ("sst2-train", "sst2-dev"), "imdb": ("imdb-train", "imdb-test"),
             "imdb-stars": ("imdb-train", "imdb-test")}

    def features(part: str, texts: list[str]) -> np.ndarray:
        path = folder / f"{_cache_key(name)}-{part}.npy"
        if path.is_file():
            return np.load(path)
        x = embed(texts)
        buffer = io.BytesIO()
        np.save(buffer, x)
        atomic_write_bytes(path, buffer.getvalue())
        return x

    result = {"model": name.partition("=")[0], "source": name.partition("=")[2] or None, "max_length": MAX_LENGTH,
              "subsets": {"sst2_train": SST2_TRAIN, "imdb_train": IMDB_TRAIN, "imdb_test": IMDB_TEST, "seed": 0},
              "probe": PROBE, "accuracy": {}, "C": {}}
    with torch.no_grad():
        for task, (tr_x, tr_y, te_x, te_y) in data.items():
            xs = [features(part, texts) for part, texts in zip(parts[task], (tr_x, te_x))]
            accuracy, c = probe(xs[0], tr_y, xs[1], te_y)
            result["accuracy"][task], result["C"][task] = round(accuracy, 4), c
            print(f"{name}: {task} {accuracy:.4f} (C = {c:g})", flush=True)
    result["wall_s"] = round(time.time() - started, 1)
    write_json(RESULTS / f"probes-{result['model']}.json", result)
    return result


def table() -> str:
    rows = ["| model | SST-2 dev | IMDB test (1,000) | IMDB stars, 8 classes | s |", "|---|---|---|---|---|"]
    for path in sorted(RESULTS.glob("probes-*.json")):
        r = json.loads(path.read_text())
        a = r["accuracy"]
        rows.append(f"| {r['model']} | {100 * a['sst2']:.1f} | {100 * a['imdb']:.1f} | "
                    f"{100 * a['imdb-stars']:.1f} | {r['wall_s']:.0f} |")
    return "\n".join(rows) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=[])
    parser.add_argument("--table", action="store_true", help="write results/pretrained/probes.md from the results")
    args = parser.parse_args()
    if args.models:
        teacher, data = Teacher(), tasks()
        for name in args.models:
            run(name, teacher, data)
    if args.table:
        from unfoldformer.utils import atomic_write_text
        text = table()
        atomic_write_text(RESULTS / "probes.md", text)
        print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
