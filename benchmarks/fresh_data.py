"""Seeded data of the fresh-task suite (`fresh_tasks.py`): digits as patch tokens, a keyword-topic CSV, ListOps.

Every generator is a pure function of its seed, so a table row can be rebuilt from its stated settings."""
from __future__ import annotations

import csv
import io
import random

import torch

__all__ = ["digits_patches", "keyword_rows", "keyword_csv", "listops_example", "listops_tokens"]

#: The keyword task's topics, their keywords, and the neutral words every text is padded with.
TOPICS = {
    "sports": ["goal", "match", "coach", "league", "striker", "referee", "tournament", "score"],
    "weather": ["rain", "storm", "forecast", "sunny", "humidity", "thunder", "snowfall", "breeze"],
    "cooking": ["recipe", "oven", "simmer", "garlic", "flour", "bake", "skillet", "spices"],
}
FILLER = ("the a this that we they it was is on in at for with about after before today yesterday "
          "really quite some many people said think new old good long short very just still then").split()


def digits_patches(patch: int = 2) -> tuple[torch.Tensor, torch.Tensor]:
    """sklearn's 8 × 8 digits as (64 / patch²) tokens of patch × patch pixels in [0, 1], row-major patches:
    x (1797, 16, 4) for patch 2, labels (1797,)."""
    from sklearn.datasets import load_digits
    digits = load_digits()
    side = 8 // patch
    x = torch.tensor(digits.images, dtype=torch.float32) / 16.0                  # (N, 8, 8)
    x = x.reshape(-1, side, patch, side, patch).permute(0, 1, 3, 2, 4)          # (N, side, side, p, p)
    return x.reshape(-1, side * side, patch * patch), torch.tensor(digits.target)   # (N, n, p²), (N,)


def keyword_rows(n_rows: int = 240, seed: int = 0) -> list[tuple[str, str]]:
    """(text, topic) rows: 3–8 filler words and 2–3 keywords of the row's topic at random places;
    topics balanced (row i has topic i mod 3), order shuffled."""
    rng = random.Random(seed)
    topics = list(TOPICS)
    rows = []
    for i in range(n_rows):
        topic = topics[i % len(topics)]
        words = [rng.choice(FILLER) for _ in range(rng.randint(3, 8))]
        for _ in range(rng.randint(2, 3)):
            words.insert(rng.randrange(len(words) + 1), rng.choice(TOPICS[topic]))
        rows.append((" ".join(words), topic))
    rng.shuffle(rows)
    return rows


def keyword_csv(n_rows: int = 240, seed: int = 0) -> str:
    """`keyword_rows` as CSV text with the header `text,label`."""
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(["text", "label"])
    writer.writerows(keyword_rows(n_rows, seed))
    return out.getvalue()


#: ListOps operators (LRA's rules): MAX, MIN, MED (median, rounded down), SM (sum modulo 10).
LISTOPS_OPS = ("MAX", "MIN", "MED", "SM")


def _listops_value(op: str, args: list[int]) -> int:
    if op == "MAX":
        return max(args)
    if op == "MIN":
        return min(args)
    if op == "MED":
        return sorted(args)[(len(args) - 1) // 2]
    return sum(args) % 10


def listops_example(rng: random.Random, max_depth: int, max_args: int, max_length: int) -> tuple[list[str], int]:
    """One nested expression as tokens ("[MAX", digits, "]") and its value 0–9, at most `max_length` tokens:
    each argument is a sub-expression with probability 0.25 while depth remains (LRA's generator), else a digit."""
    def build(depth: int) -> tuple[list[str], int]:
        op = rng.choice(LISTOPS_OPS)
        tokens, args = ["[" + op], []
        for _ in range(rng.randint(2, max_args)):
            if depth < max_depth and rng.random() < 0.25:
                sub, value = build(depth + 1)
            else:
                value = rng.randint(0, 9)
                sub = [str(value)]
            tokens += sub
            args.append(value)
        return tokens + ["]"], _listops_value(op, args)

    while True:
        tokens, value = build(1)
        if len(tokens) <= max_length:
            return tokens, value


#: ListOps vocabulary: padding 0, digits, the four opening operators, the closing bracket.
LISTOPS_VOCAB = ["<pad>"] + [str(k) for k in range(10)] + ["[" + op for op in LISTOPS_OPS] + ["]"]


def listops_tokens(n: int, seed: int, max_depth: int = 10, max_args: int = 10,
                   max_length: int = 512) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """`n` examples as ids (n, L) (L = the longest), padding mask (n, L) (True = padding), labels (n,)."""
    rng = random.Random(seed)
    index = {t: i for i, t in enumerate(LISTOPS_VOCAB)}
    examples = [listops_example(rng, max_depth, max_args, max_length) for _ in range(n)]
    L = max(len(t) for t, _ in examples)
    ids = torch.zeros(n, L, dtype=torch.long)
    for row, (tokens, _) in enumerate(examples):
        ids[row, :len(tokens)] = torch.tensor([index[t] for t in tokens])
    lengths = torch.tensor([len(t) for t, _ in examples])
    pad = torch.arange(L)[None, :] >= lengths[:, None]                             # (n, L)
    return ids, pad, torch.tensor([v for _, v in examples])
