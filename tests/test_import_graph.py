"""The house's floors: no import cycle, no import from a lower floor to a higher one, and prediction
without the training code.

Every `import` and `from … import` of every module under `src/unfoldformer` is read with `ast`,
at module level and inside functions alike (a function-level import that hides a cycle is still an
edge), relative and absolute. `FLOORS` is the one map of the layers; docs/concepts/conventions.md
draws it.
"""
import ast
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "src" / "unfoldformer"

#: Module (or package: every module under it) -> floor. The longest matching name decides.
FLOORS = {
    # 1, the core: energies, steps, layers, tolerances, contracts; imports nothing above it.
    **dict.fromkeys(["rho", "energy", "kernels", "softmax", "steps", "joint", "layers", "rotated", "metrics",
                     "positions", "descent", "contracts", "errors", "utils", "bases", "blockpool", "released",
                     "version", "names", "causal", "threads"], 1),
    # 2, models and their inputs: configs, encoders, classifier, the mixin, the recipe, the data.
    **dict.fromkeys(["config", "config_files", "model", "encoder", "baselines", "peers", "classifier", "pretrained",
                     "recipe", "data", "decoder", "gpt"], 2),
    # 3, persistence and prediction: the one folder format, loading, the zoo, the Hub front door.
    **dict.fromkeys(["persist", "inference", "zoo", "hub"], 3),
    # 4, applications: training, the reproduction, the probes and studies, run folders, figures.
    **dict.fromkeys(["train", "paper", "probe", "rho_study", "runs", "plots", "lm", "distill"], 4),
    # 5, the command line.
    **dict.fromkeys(["cli", "__main__"], 5),
}
#: The package itself (`unfoldformer/__init__.py`, the public API) gathers floors 1-3.
PACKAGE_FLOOR = 3


def _modules() -> dict[str, tuple[Path, bool]]:
    """Dotted module name -> (file, is a package)."""
    out = {}
    for path in PACKAGE.rglob("*.py"):
        parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
        package = parts[-1] == "__init__"
        out[".".join(parts[:-1] if package else parts)] = (path, package)
    return out


MODULES = _modules()


def _owner(name: str) -> str | None:
    """The module of ours that `name` (a module, or a name inside one) lives in; None for other libraries."""
    while name and name not in MODULES:
        name = name.rpartition(".")[0]
    return name or None


def imports_of(module: str) -> dict[str, int]:
    """The modules of ours that `module` imports -> the line of the first such import."""
    path, package = MODULES[module]
    here = module.split(".") if package else module.split(".")[:-1]
    found: dict[str, int] = {}
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        targets = []
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = ".".join(here[:len(here) - node.level + 1] + ([node.module] if node.module else [])) \
                if node.level else (node.module or "")
            # `from pkg import name`: the submodule pkg.name if there is one, else pkg itself
            targets = [f"{base}.{alias.name}" if f"{base}.{alias.name}" in MODULES else base for alias in node.names]
        for target in targets:
            owner = _owner(target) if target.split(".")[0] == "unfoldformer" else None
            if owner is not None and owner != module:
                found.setdefault(owner, node.lineno)
    return found


GRAPH = {module: imports_of(module) for module in MODULES}


def floor(module: str) -> int | None:
    """The floor of `module` (None if the map has none for it)."""
    if module == "unfoldformer":
        return PACKAGE_FLOOR
    name = module.removeprefix("unfoldformer.")
    while name and name not in FLOORS:
        name = name.rpartition(".")[0]
    return FLOORS.get(name) if name else None


def test_the_parser_sees_relative_absolute_and_function_level_imports():
    """The reader itself, on the package's own files: edges it must find (each kind of import)."""
    assert "unfoldformer.persist.folder" in GRAPH["unfoldformer.persist"]            # `from . import folder`
    assert "unfoldformer.errors" in GRAPH["unfoldformer.persist.folder"]             # `from ..errors import …`
    assert "unfoldformer.config_files" in GRAPH["unfoldformer.recipe"]               # inside a function
    assert "unfoldformer.cli" in GRAPH["unfoldformer.__main__"]


def test_every_module_has_a_floor():
    assert floor("unfoldformer.persist.folder") == 3 and floor("unfoldformer.train.loop") == 4
    assert floor("unfoldformer.not_in_the_map") is None
    missing = sorted(m for m in MODULES if floor(m) is None)
    assert not missing, f"modules without a floor (add them to FLOORS): {missing}"


def _upward() -> list[str]:
    """Every import from a lower floor to a higher one, named."""
    return [f"{m} (floor {floor(m)}) imports {t} (floor {floor(t)}) at line {line}"
            for m, targets in sorted(GRAPH.items()) for t, line in sorted(targets.items()) if floor(t) > floor(m)]


def test_no_import_points_up_a_floor():
    upward = _upward()
    assert not upward, "imports from a lower floor to a higher one:\n" + "\n".join(upward)


def test_an_upward_import_is_named(monkeypatch):
    """The check can fail: the model importing the persistence layer is reported with both floors."""
    monkeypatch.setitem(GRAPH, "unfoldformer.model", {**GRAPH["unfoldformer.model"], "unfoldformer.persist.folder": 7})
    assert _upward() == ["unfoldformer.model (floor 2) imports unfoldformer.persist.folder (floor 3) at line 7"]


def _a_cycle() -> list[str] | None:
    """One import cycle (its modules in order, the first repeated at the end), or None."""
    state: dict[str, int] = {}                          # 1: on the current path, 2: done
    path: list[str] = []

    def visit(module: str) -> list[str] | None:
        state[module] = 1
        path.append(module)
        for target in sorted(GRAPH[module]):
            if state.get(target) == 1:
                return path[path.index(target):] + [target]
            if target not in state and (cycle := visit(target)):
                return cycle
        state[module] = 2
        path.pop()
        return None

    for module in sorted(GRAPH):
        if module not in state and (cycle := visit(module)):
            return cycle
    return None


def test_no_import_cycle():
    cycle = _a_cycle()
    assert cycle is None, "import cycle: " + " -> ".join(cycle)


def test_the_cycle_finder_finds_a_planted_cycle(monkeypatch):
    """The check can fail: an edge back from the core to the model closes a cycle, and it is named."""
    monkeypatch.setitem(GRAPH, "unfoldformer.energy", {**GRAPH["unfoldformer.energy"], "unfoldformer.model": 1})
    cycle = _a_cycle()
    assert cycle is not None and cycle[0] == cycle[-1]
    assert "unfoldformer.energy" in cycle and "unfoldformer.model" in cycle
    assert all(b in GRAPH[a] for a, b in zip(cycle, cycle[1:]))


_PREDICT = """
import json, sys
import unfoldformer as uf
{call}
print(json.dumps(sorted(m for m in sys.modules if m == "unfoldformer.train" or m.startswith("unfoldformer.train.")
                        or m in ("unfoldformer.runs", "unfoldformer.plots"))))
"""


@pytest.mark.parametrize("call", [
    'uf.load("sst2-certified").predict(["a gripping, beautiful film"])',
    'model = uf.UnfoldedTransformer(uf.ModelConfig.preset("certified", d_model=8, n_heads=2, depth=2))\n'
    'uf.UnfoldedTransformer.from_pretrained(model.save_pretrained(sys.argv[1]))\n'
    'uf.from_pretrained(uf.load("sst2-certified").save_pretrained(sys.argv[2]))',
], ids=["load-a-zoo-model", "save-and-from-pretrained"])
def test_prediction_imports_nothing_of_training(call, tmp_path):
    """`uf.load`, `from_pretrained` and `save_pretrained` in a fresh interpreter leave no module of `train/` (nor
    the run-folder and figure applications) in `sys.modules`."""
    env = {**os.environ, "PYTHONPATH": str(PACKAGE.parent) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    done = subprocess.run([sys.executable, "-c", _PREDICT.format(call=call), str(tmp_path / "a"), str(tmp_path / "b")],
                          capture_output=True, text=True, env=env, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert json.loads(done.stdout.strip().splitlines()[-1]) == []
