"""The committed tables of README.md and docs/results/ equal the ones `benchmarks/make_docs.py` writes
from the committed result files, so they cannot drift from them."""
import json
import shutil
import sys

import pytest

from conftest import REPO_ROOT

sys.path.insert(0, str(REPO_ROOT / "benchmarks"))
make_docs = pytest.importorskip("make_docs")


def test_committed_tables_equal_the_regenerated_ones():
    stale = [rel for rel in make_docs.FILES
             if make_docs.regenerate((REPO_ROOT / rel).read_text(encoding="utf-8")) != (REPO_ROOT / rel).read_text(
                 encoding="utf-8")]
    assert not stale, f"stale generated tables in {stale}: run python benchmarks/make_docs.py"


def test_every_block_is_used_and_every_table_is_at_most_eight_columns():
    texts = "".join((REPO_ROOT / rel).read_text(encoding="utf-8") for rel in make_docs.FILES)
    used = {m["name"] for m in make_docs.BEGIN.finditer(texts)}
    assert used == set(make_docs.BLOCKS)
    for name, block in make_docs.BLOCKS.items():
        for line in block(make_docs.RESULTS).splitlines():
            if line.startswith("|---"):
                assert line.count("|") - 1 <= 8, name
            assert "not run" not in line, name


def test_a_changed_result_file_changes_the_tables(tmp_path):
    results = tmp_path / "results"
    shutil.copytree(make_docs.RESULTS, results)
    cell = results / "sst2-standard-seed0.json"
    record = json.loads(cell.read_text())
    record["accuracy"] = 0.5
    cell.write_text(json.dumps(record))
    readme = (REPO_ROOT / "README.md").read_text(encoding="utf-8")
    changed = make_docs.regenerate(readme, results)
    assert changed != readme
    old = make_docs.regenerate(readme)
    # the standard row's mean over its three seeds moves: (0.5 + seeds 1, 2) / 3
    seeds = [json.loads((make_docs.RESULTS / f"sst2-standard-seed{s}.json").read_text())["accuracy"] for s in (1, 2)]
    assert f"{100 * (0.5 + sum(seeds)) / 3:.1f} ±" in changed and f"{100 * (0.5 + sum(seeds)) / 3:.1f} ±" not in old
