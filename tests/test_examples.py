"""The examples run as a user runs them (a subprocess, tiny sizes)."""
import math
import os
import subprocess
import sys

from conftest import REPO_ROOT


def test_custom_model_example_trains_and_prints_its_energy_curve():
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT / "src"), "OMP_NUM_THREADS": "1"}
    args = ["--steps", "4", "--d-model", "8", "--heads", "2", "--layers", "3", "--length", "6"]
    done = subprocess.run([sys.executable, str(REPO_ROOT / "examples" / "custom_model.py"), *args], env=env,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    lines = [line for line in done.stdout.splitlines() if line.startswith("step")]
    assert [int(line.split()[1]) for line in lines] == [1, 2, 3, 4]
    for line in lines:
        curve = [float(v) for v in line.split("per layer:")[1].split()]
        assert len(curve) == 3 + 1 and all(math.isfinite(v) for v in curve)   # E/n at Y⁽⁰⁾ … Y⁽³⁾
