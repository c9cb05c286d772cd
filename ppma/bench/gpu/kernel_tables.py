"""The kernel tables: the ``kernels/bench`` scripts of a source checkout at their full shapes with
few repeats (quick: their reduced shapes, one repeat), each in its own process and time limit.

The scripts are not installed with the package (``kernels/bench`` is not a package): without a
checkout, the section says so.
"""
from __future__ import annotations

import contextlib
import importlib.util
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import torch

import ppma.kernels


@dataclass(frozen=True)
class Bench:
    """One script of ``kernels/bench`` and its arguments (besides ``--device``) in each mode
    (``quick`` None: full mode only)."""

    script: str
    full: tuple[str, ...]
    quick: tuple[str, ...] | None

    def args(self, quick: bool) -> tuple[str, ...]:
        if quick and self.quick is None:
            raise ValueError(f"kernels/bench/{self.script} {' '.join(self.full)} runs in full mode only")
        return self.quick if quick else self.full

    def label(self, quick: bool) -> str:
        return " ".join([f"kernels/bench/{self.script}", *self.args(quick)])


def warm_command(bench: Bench, device: torch.device) -> list[str]:
    """``bench`` in full mode with one timed run (``--repeat 1``): what the compiling section runs
    so that the script's kernels are compiled before the kernel tables time them."""
    args = list(bench.full)
    args[args.index("--repeat") + 1] = "1"
    return [sys.executable, str(bench_dir() / bench.script), "--device", device.type, *args]


# quick: two scripts, their reduced shapes, fp32, one repeat, the PyTorch columns only (the
# Triton interpreter's times say nothing, and the kernel tests cover it): the reference and one
# other form, whose error column the test reads.
QUICK = ("--quick", "--repeat", "1", "--dtypes", "fp32", "--impls", "torch")
BENCHES = (
    Bench("polyline_scan.py", ("--repeat", "5", "--dtypes", "bf16"), (*QUICK, "mask")),
    Bench("polyline_attention.py", ("--repeat", "5"), (*QUICK, "flex")),
    Bench("polyline_attention.py", ("--repeat", "5", "--kind", "criss_cross"), None),
    Bench("polyline_decays.py", ("--repeat", "5", "--dtypes", "bf16"), None),
    Bench("depthwise_conv.py", ("--repeat", "5", "--dtypes", "bf16"), None),
    Bench("selective_scan.py", ("--repeat", "5"), None),
    Bench("polyline_linear_attention.py", ("--repeat", "3", "--op", "--backward"), None),
)


def bench_dir() -> Path:
    """``kernels/bench`` beside the imported ``ppma.kernels`` (present in a source checkout)."""
    return Path(ppma.kernels.__file__).resolve().parent / "bench"


def load_bench(script: str):
    """The benchmark script ``script`` of :func:`bench_dir` (not an installed module), imported."""
    path = bench_dir() / script
    spec = importlib.util.spec_from_file_location(f"bench_{path.stem}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@dataclass(frozen=True)
class BenchResult:
    """What one script printed: ``stdout`` (its tables), the end of ``stderr``, its exit status
    (None when it was stopped at its time limit) and its seconds."""

    command: str
    stdout: str
    stderr_tail: str
    returncode: int | None
    seconds: float


def kill_group(process: subprocess.Popen) -> None:
    """Kill the script and whatever it started (its compile workers)."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGKILL)


def run_bench(bench: Bench, device: torch.device, quick: bool, seconds: float) -> BenchResult:
    """Run ``bench`` on ``device`` for at most ``seconds``; the script's process group is killed
    at the limit, and what it printed until then is kept."""
    script = bench_dir() / bench.script
    args = ["--device", device.type, *bench.args(quick)]
    shown = " ".join([f"kernels/bench/{bench.script}", *args])
    if not script.is_file():
        raise FileNotFoundError(f"{script} not found: the kernel tables need a source checkout of ppma "
                                "(kernels/bench is not installed)")
    start = time.monotonic()
    process = subprocess.Popen([sys.executable, str(script), *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                               env=dict(os.environ, PYTHONUNBUFFERED="1"), start_new_session=True)
    try:
        stdout, stderr = process.communicate(timeout=max(seconds, 0.1))
        returncode = process.returncode
    except subprocess.TimeoutExpired:
        kill_group(process)
        stdout, stderr = process.communicate()  # what it printed before the limit
        returncode = None
    except BaseException:  # the section's own time limit, or an interrupt: leave no process behind
        kill_group(process)
        process.wait()
        raise
    tail = "\n".join(stderr.decode(errors="replace").strip().splitlines()[-15:])
    return BenchResult(shown, stdout.decode(errors="replace"), tail, returncode, time.monotonic() - start)
