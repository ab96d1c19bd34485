"""benchmarks/gpu_check.py's CPU fallback runs end to end (so the device script cannot rot)."""
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))
import gpu_check  # noqa: E402
from unfoldformer.softmax import PRECISION_TARGET  # noqa: E402


def test_gpu_check_tiny_on_cpu(tmp_path, capsys):
    out = tmp_path / "check.json"
    assert gpu_check.main(["--device", "cpu", "--tiny", "--json", str(out)]) == 0
    res = json.loads(out.read_text())
    assert res["pass_kind"] == "cpu-flash"
    # Every check is a float32 computation whose logits' first-order error is kept ≤ PRECISION_TARGET
    # (`softmax.logit_error_bound`; the passes escalate to float64 above it), so each weight, and every
    # weighted average, sum or gradient of them, is within that relative bound of float64 (to first order).
    assert len(res["correctness"]) == 14
    assert all(0 <= v <= PRECISION_TARGET for v in res["correctness"].values()), res["correctness"]
    assert all(t > 0 for t in res["times_s"].values()) and len(res["times_s"]) == 6
    assert "| benchmark |" in capsys.readouterr().out
