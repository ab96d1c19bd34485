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


# The blocks that replaced hand-pasted tables: where each lives, and one change to its source file that must
# show in the block (relative to a copy of the repository's layout: benchmarks/results/..., src/unfoldformer/zoo/...).
def _scale(key, factor):
    def change(raw):
        path, leaf = key[:-1], key[-1]
        node = raw
        for k in path:
            node = node[k]
        node[leaf] = [v * factor for v in node[leaf]] if isinstance(node[leaf], list) else node[leaf] * factor
    return change


def _set(key, value):
    def change(raw):
        node = raw
        for k in key[:-1]:
            node = node[k]
        node[key[-1]] = value
    return change


NEW_BLOCKS = {
    "energy-speed": ("docs/results/speed.md", "benchmarks/results/speed/energy_speed.json",
                     _set(("a", "speedup"), 10.0)),
    "rho-step": ("docs/results/rho.md", "benchmarks/results/speed/rho_speed.json",
                 _scale(("results", "64", "1", "anchored/forward", "exp", "time_s"), 2.0)),
    "rho-cost": ("docs/results/rho.md", "benchmarks/results/speed/train_speed_rho.json",
                 _scale(("step_times_s", "64", "certified-tied:log"), 2.0)),
    "peers-reduced": ("docs/results/peers.md", "benchmarks/results/sst2-crate-seed0-reduced.json",
                      _set(("accuracy",), 0.5)),
    "peers-imdb-seeds": ("docs/results/peers.md", "benchmarks/results/peers/imdb-crate-seed1-reduced.json",
                         _set(("accuracy",), 0.5)),
    "peers-full": ("docs/results/peers.md", "benchmarks/results/sst2-energy-transformer-seed1.json",
                   _set(("accuracy",), 0.5)),
    "layer-health": ("docs/results/fit-study.md", "benchmarks/results/study/health/imdb-reduced.json",
                     _set(("runs", 0, "logit_std"), 0.123)),
    "zoo": ("docs/guides/custom-model.md", "src/unfoldformer/zoo/sst2-certified/card.json",
            _set(("subset", "correct"), 1)),
    "accuracy-targets": ("docs/results/accuracy.md", "benchmarks/results/speed/train_speed.json",
                         _scale(("step_times_s", "64", "certified-tied"), 10.0)),
    "train-speed": ("docs/results/speed.md", "benchmarks/results/speed/train_speed_2threads.json",
                    _scale(("step_times_s", "64", "certified-tied"), 2.0)),
    "energy-peak": ("docs/results/speed.md", "benchmarks/results/speed/energy_speed_peak.json",
                    _scale(("e", "per_threads", "1", "fused (float64)"), 2.0)),
    "rho-busy": ("docs/results/rho.md", "benchmarks/results/speed/rho_speed_busy.json",
                 _scale(("results", "4096", "2", "anchored/forward", "log", "time_s"), 2.0)),
    "rho-threads": ("docs/results/rho.md", "benchmarks/results/speed/rho_speed.json",
                    _scale(("results", "64", "2", "anchored/forward", "lp", "time_s"), 2.0)),
    "inference-speed-1thread": ("docs/results/speed.md", "benchmarks/results/speed/inference_speed_1thread.json",
                                _scale(("wall_times_s", "64", "certified-tied"), 2.0)),
    "inference-speed-2threads": ("docs/results/speed.md", "benchmarks/results/speed/inference_speed_2threads.json",
                                 _scale(("wall_times_s", "256", "certified-joint"), 2.0)),
    "numerics": ("docs/theory.md", "benchmarks/results/numerics/numerics_check.json", _set(("fused", "energy"), 0.5)),
    "inference-energies": ("docs/results/speed.md", "benchmarks/results/speed/inference_speed_2threads.json",
                           _scale(("wall_times_s", "1024", "certified-joint + energies"), 2.0)),
    "probe": ("docs/results/reproduction.md", "benchmarks/results/probe/minilm-sst2.json",
              _set(("per_layer", 0, "share_decreased"), 0.5)),
    "reproduction": ("docs/results/reproduction.md", "benchmarks/results/reproduce/results.json",
                     _set(("energy_curves", "imdb", "curves", "certified/trained", "accuracy"), 0.5)),
    "rho-spread": ("docs/results/rho.md", "benchmarks/results/rho_study/results.json",
                   _set(("datasets", "imdb", "sources", "random-joint", "log", "dynamics", "model", "spread_retained"),
                        [0.5] * 13)),
    "profiles": ("docs/results/speed.md", "benchmarks/results/speed/profile_misses.json",
                 _scale(("cases", "lp-4096", "variants", "lp", "1", "wall_ms"), 2.0)),
    "compile": ("docs/results/speed.md", "benchmarks/results/speed/compile_speed_joint_1thread.json",
                _scale(("results", "64", "forward", "median_s", "eager"), 2.0)),
    "shared-machine": ("docs/results/speed.md", "benchmarks/results/speed/shared_machine.json",
                       _scale(("cells", 0, "median_s"), 2.0)),
    "shared-machine-orders": ("docs/results/speed.md", "benchmarks/results/speed/shared_machine_variants.json",
                              _scale(("cells", 0, "median_s"), 2.0)),
    "shared-machine-alternate": ("docs/results/speed.md", "benchmarks/results/speed/shared_machine_alternate.json",
                                 _scale((0, "median_s", "1"), 2.0)),
    # read from the test that asserts the rates, not from a result file (test_counterexample_table_...)
    "counterexamples": ("docs/theory.md", "tests/test_steps.py", None),
}
#: the blocks whose source is a result file (JSON)
JSON_BLOCKS = sorted(name for name, (_, source, _) in NEW_BLOCKS.items() if source.endswith(".json"))
#: speed blocks and the files whose `threads` they must state
SPEED_FILES = {"energy-speed": "benchmarks/results/speed/energy_speed.json",
               "rho-cost": "benchmarks/results/speed/train_speed_rho.json",
               "peers-reduced": "benchmarks/results/speed/train_speed_peers_3.json",
               "accuracy-targets": "benchmarks/results/speed/train_speed.json",
               "inference-speed-1thread": "benchmarks/results/speed/inference_speed_1thread.json",
               "inference-speed-2threads": "benchmarks/results/speed/inference_speed_2threads.json",
               "compile": "benchmarks/results/speed/compile_speed_joint_2threads.json"}


def _committed_block(rel: str, name: str) -> str:
    text = (REPO_ROOT / rel).read_text(encoding="utf-8")
    start = text.index(f"<!-- generated: {name} (python benchmarks/make_docs.py) -->\n")
    start = text.index("\n", start) + 1
    return text[start:text.index(f"<!-- end: {name} -->", start)]


def _copy_repo(tmp_path):
    """The result files and the zoo's cards in the repository's layout under tmp_path; returns the results folder."""
    shutil.copytree(make_docs.RESULTS, tmp_path / "benchmarks" / "results")
    shutil.copytree(REPO_ROOT / "src" / "unfoldformer" / "zoo", tmp_path / "src" / "unfoldformer" / "zoo",
                    ignore=shutil.ignore_patterns("*.safetensors", "__pycache__"))
    return tmp_path / "benchmarks" / "results"


@pytest.mark.parametrize("name", sorted(NEW_BLOCKS))
def test_each_new_block_equals_what_make_docs_writes_from_the_committed_files(name):
    rel = NEW_BLOCKS[name][0]
    assert rel in make_docs.FILES
    assert _committed_block(rel, name) == make_docs.BLOCKS[name](make_docs.RESULTS).rstrip("\n") + "\n", \
        f"{name} in {rel} differs from its result file: run python benchmarks/make_docs.py"


@pytest.mark.parametrize("name", sorted(NEW_BLOCKS))
def test_a_hand_edit_of_a_new_block_is_caught(name):
    rel = NEW_BLOCKS[name][0]
    text = (REPO_ROOT / rel).read_text(encoding="utf-8")
    block = _committed_block(rel, name)
    digit = next(i for i, c in enumerate(block) if c.isdigit() and i > block.index("|"))   # a digit in the table
    edited = block[:digit] + str((int(block[digit]) + 1) % 10) + block[digit + 1:]
    hand_edited = text.replace(block, edited, 1)
    assert hand_edited != text
    assert make_docs.regenerate(hand_edited) == text        # the equality test above fails on the edited file


@pytest.mark.parametrize("name", JSON_BLOCKS)
def test_a_changed_source_file_changes_the_new_block(tmp_path, name):
    _, source, change = NEW_BLOCKS[name]
    results = _copy_repo(tmp_path)
    path = tmp_path / source
    raw = json.loads(path.read_text())
    change(raw)
    path.write_text(json.dumps(raw))
    assert make_docs.BLOCKS[name](results) != make_docs.BLOCKS[name](make_docs.RESULTS)


@pytest.mark.parametrize("name", sorted(SPEED_FILES))
def test_speed_blocks_state_the_thread_count_of_their_file(tmp_path, name):
    results = _copy_repo(tmp_path)
    path = tmp_path / SPEED_FILES[name]
    raw = json.loads(path.read_text())
    assert f"{raw['threads']} thread" in make_docs.BLOCKS[name](make_docs.RESULTS)
    raw["threads"] = 3
    path.write_text(json.dumps(raw))
    assert "3 threads" in make_docs.BLOCKS[name](results)
    del raw["threads"]
    path.write_text(json.dumps(raw))
    assert "thread count not recorded" in make_docs.BLOCKS[name](results)


def test_rho_step_reads_both_formats_of_rho_speed(tmp_path):
    """`rho_speed.py` writes {n: {threads: ...}} at several thread counts (wall time): one table per count; files
    written before it alternated thread counts hold {n: ...} at one count (CPU thread time): one table."""
    results = _copy_repo(tmp_path)
    path = results / "speed" / "rho_speed.json"
    raw = json.loads(path.read_text())
    assert raw["setting"]["threads"] == [1, 2]
    out = make_docs.rho_step(results)
    assert "1 thread, median wall time" in out and "2 threads, median wall time" in out
    assert out.count("| step |") == 2
    raw["setting"]["threads"] = 1
    raw["results"] = {n: v["1"] for n, v in raw["results"].items()}
    path.write_text(json.dumps(raw))
    out = make_docs.rho_step(results)
    assert "1 thread, median CPU thread time" in out and out.count("| step |") == 1


def test_energy_speed_shows_the_joint_overhead_at_two_threads_from_its_own_file(tmp_path):
    results = _copy_repo(tmp_path)
    path = results / "speed" / "energy_speed_joint_2threads.json"
    raw = json.loads(path.read_text())
    assert raw["c_joint"]["clock"] == "wall" and raw["c_joint"]["threads"] == 2
    raw["c_joint"]["overhead"] = 0.5
    path.write_text(json.dumps(raw))
    block = make_docs.BLOCKS["energy-speed"](results)
    assert "| +50 % | ≤ +15 % | no |" in block
    path.unlink()
    assert "at 2 threads" not in make_docs.BLOCKS["energy-speed"](results)


def test_counterexample_table_follows_the_rates_and_bands_of_its_test(tmp_path, monkeypatch):
    """The §3.6 table is read from tests/test_steps.py's COUNTEREXAMPLES: a changed measured rate or band there
    changes the table (so the docs and the asserted band cannot disagree)."""
    import docs_reports
    source = (REPO_ROOT / "tests" / "test_steps.py").read_text(encoding="utf-8")
    assert '(_indefinite_metric, 0.860, (0.60, 0.98))' in source
    before = docs_reports.counterexamples(make_docs.RESULTS)
    assert "| indefinite metric | 86.0 % | 60.0 – 98.0 % |" in before
    (tmp_path / "tests").mkdir()
    (tmp_path / "tests" / "test_steps.py").write_text(
        source.replace("(_indefinite_metric, 0.860, (0.60, 0.98))", "(_indefinite_metric, 0.861, (0.61, 0.98))"))
    monkeypatch.setattr(docs_reports, "ROOT", tmp_path)
    assert "| indefinite metric | 86.1 % | 61.0 – 98.0 % |" in docs_reports.counterexamples(make_docs.RESULTS)
