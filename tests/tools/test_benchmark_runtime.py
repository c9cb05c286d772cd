"""tools/benchmark.py --runtime: the ms/img table of the runtimes (eager here: the ONNX and compiled
runs take minutes, docs/deploy.md has their table)."""
import re
import subprocess
import sys
from pathlib import Path

TOOL = Path(__file__).resolve().parents[2] / "tools" / "benchmark.py"


def test_runtime_table_has_a_row_per_model_and_case():
    result = subprocess.run([sys.executable, TOOL, "--runtime", "eager", "--models", "test_mila",
                             "--iters", "1", "--repeats", "1", "--warmup", "0"], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr[-3000:]
    rows = re.findall(r"^\| test_mila \| (.+?) \| ([0-9.]+) \|$", result.stdout, re.M)
    assert [case for case, _ in rows] == ["224 bs1", "224 bs8", "backbone 512 bs1"], result.stdout
    assert all(float(ms) > 0 for _, ms in rows)


def test_runtime_and_model_exclude_each_other():
    result = subprocess.run([sys.executable, TOOL, "--runtime", "eager", "--model", "test_mila"],
                            capture_output=True, text=True)
    assert result.returncode == 2 and "give one of CONFIG, --model or --runtime" in result.stderr
