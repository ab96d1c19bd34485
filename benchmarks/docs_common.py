"""Helpers shared by the generated documentation tables (`make_docs.py`, `docs_speed.py`)."""
from __future__ import annotations

import json
from pathlib import Path

__all__ = ["load", "md", "threads_said"]


def md(head: list[str], rows: list[list[str]]) -> str:
    """A Markdown table of at most 8 columns."""
    assert len(head) <= 8, head
    return "\n".join(["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
                     + ["| " + " | ".join(r) + " |" for r in rows]) + "\n"


def load(results: Path, rel: str) -> dict:
    """The JSON file `rel` under the results folder."""
    return json.loads((results / rel).read_text())


def threads_said(raw: dict, where: str) -> str:
    """'N thread(s)' from a speed file, or a sentence that the file does not record it."""
    t = raw.get("threads", (raw.get("setting") or {}).get("threads"))
    if t is None:
        return f"thread count not recorded in `{where}`"
    return f"{t} thread" + ("s" if t != 1 else "")
