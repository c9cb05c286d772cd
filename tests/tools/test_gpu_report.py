"""tools/gpu_report.py: the report end to end in its quick CPU mode, and the pieces that can fail
(relative errors, tolerances, the profiler summary, the time budget, the bench subprocesses,
the official model files)."""
import math
import re
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from torch.autograd import DeviceType

from ppma.bench.gpu import kernel_tables, warm_up
from ppma.bench.gpu.budget import Budget, Deadline, SectionTimeout, time_limit
from ppma.bench.gpu.correctness import Errors, Row, Run, compare, relative_error
from ppma.bench.gpu.gpu_report import QUICK_PRESETS, main
from ppma.bench.gpu.official import official_models
from ppma.bench.gpu.step_profile import (
    count_syncs,
    host_operators,
    host_phases,
    python_functions,
    runtime_calls,
    summarize,
)
from ppma.kernels.common.timing import median_seconds

ROOT = Path(__file__).resolve().parents[2]
SECTIONS = ("Compiling", "Correctness", "Kernel tables", "Whole models", "Backbones at large sizes", "Where the time goes",
            "Time per section")


def table(text: str, heading: str) -> list[list[str]]:
    """The cells of the first table after ``heading`` (a heading, or a table's header row's
    start): header and separator rows dropped."""
    lines = text.split(heading, 1)[1].split("\n#", 1)[0].splitlines()
    start = 0 if heading.startswith("|") else next(i for i, line in enumerate(lines) if line.startswith("|"))
    rows = []
    for line in lines[start + 2:]:
        if not line.startswith("|"):
            break
        rows.append([c.strip() for c in line.strip("|").split("|")])
    return rows


def test_quick_report_on_the_cpu_end_to_end(tmp_path):
    out = tmp_path / "report.md"
    start = time.monotonic()
    done = subprocess.run([sys.executable, str(ROOT / "tools" / "gpu_report.py"), "--quick", "--device", "cpu",
                           "--output", str(out), "--budget", "1200"], capture_output=True, text=True, cwd=ROOT, timeout=600, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    text = out.read_text()
    print(f"quick report: {time.monotonic() - start:.0f} s\n{text}")
    for title in SECTIONS:
        assert f"\n## {title}\n" in text, title
    assert re.search(r"^- command: `.*python tools/gpu_report.py --quick --device cpu --output ", text, re.MULTILINE)
    assert re.search(r"^- versions: Python [\d.]+, torch \S+, Triton ", text, re.MULTILINE)
    presets = QUICK_PRESETS
    assert "failed" not in text
    assert [(r[0], r[1], r[3]) for r in table(text, "## Compiling")] == [(p, "fp32", "done") for p in presets]

    rows = table(text, "## Correctness")
    assert [(r[0], r[1].split()[0]) for r in rows] == [(p, c) for p in presets for c in ("fp32", "bf16", "fp16", "fp32")]
    for preset, case, out_err, dx_err, param, own, ok in rows:
        errors = [float(out_err), float(dx_err), float(param.split()[0])]
        errors += [float(v) for v in own.split(" / ")] if own else []
        assert all(math.isfinite(e) and e >= 0 for e in errors), (preset, case)
        assert ok == "yes", (preset, case, out_err, dx_err, param, own)
    assert f"{len(rows)} of {len(rows)} cases within tolerance" in text

    speed = table(text, "## Whole models")
    assert [(r[0], r[1]) for r in speed] == [(p, b) for p in presets for b in ("auto", "torch")]
    assert all(float(v) > 0 and math.isfinite(float(v)) for r in speed for v in r[2:])
    backbones = table(text, "## Backbones at large sizes")
    assert [(r[0], r[1], r[2]) for r in backbones] == [
        (f"{p} features", b, s) for p in presets for b in ("auto", "torch") for s in ("32", "48")]
    assert all(float(r[3]) > 0 and float(r[4]) >= 0 for r in backbones)

    profiles = re.findall(r"^### (\w+) \((training step, batch 2|inference, batch 2)\): ([\d.]+) ms, host ([\d.]+) ms, "
                          r"(\d+) aten operator calls, ([\d.]+) ms", text, re.MULTILINE)
    assert [p[:2] for p in profiles] == [(p, what) for what in ("training step, batch 2", "inference, batch 2")
                                         for p in presets]
    for preset, what, *numbers in profiles:
        assert all(float(v) > 0 for v in numbers), (preset, what)
        top = table(text, f"### {preset} ({what})")
        assert 1 <= len(top) <= 12 and all(r[0].startswith("`aten::") and int(r[1]) >= 1 for r in top)
        assert [float(r[2]) for r in top] == sorted((float(r[2]) for r in top), reverse=True)
        section = text.split(f"### {preset} ({what})", 1)[1].split("\n### ", 1)[0]
        phases = re.search(r"^Host ms of the profiled step by part: forward ([\d.]+), backward ([\d.]+), "
                           r"optimizer ([\d.]+)\.$", section, re.MULTILINE)
        assert (phases is not None) == what.startswith("training"), section[:300]
        assert phases is None or all(float(v) > 0 for v in phases.groups())
        operators = table(section, "| host operator |")
        assert 1 <= len(operators) <= 12 and all(float(r[2]) >= 0 for r in operators)
        functions = table(section, "| Python function |")
        assert 1 <= len(functions) <= 12 and all(float(r[3]) >= float(r[2]) >= 0 for r in functions)
        assert [float(r[2]) for r in functions] == sorted((float(r[2]) for r in functions), reverse=True)

    kernels = text.split("## Kernel tables", 1)[1].split("\n## ", 1)[0]
    commands = re.findall(r"^### `kernels/bench/(\S+) --device cpu .*`\n\n\d+ s, exit 0\.$", kernels, re.MULTILINE)
    assert commands == [b.script for b in kernel_tables.BENCHES if b.quick is not None] == [
        "polyline_scan.py", "polyline_attention.py"], kernels
    errors = re.findall(r"^\| .* \| (torch|mask|flex) \| [\d.e+-]+ \|.* \| ([\d.e+-]+) \|$", kernels, re.MULTILINE)
    assert len(errors) >= 2 * len(commands) and {impl for impl, _ in errors} == {"torch", "mask", "flex"}, kernels
    assert all(float(e) <= 1e-5 for _, e in errors), errors  # against the fp32 reference, in the same run
    assert all(r[3] == "complete" for r in table(text, "## Time per section"))


def test_chosen_sections_and_presets(tmp_path):
    """--sections and --presets: a short lease measures what it needs (here the whole models and
    the step profile of one preset); the budget goes to those sections alone."""
    out = main(["--quick", "--device", "cpu", "--output", str(tmp_path / "r.md"), "--sections", "models", "profile",
                "--presets", "test_ppma"])
    text = out.read_text()
    assert [r[0] for r in table(text, "## Time per section")] == ["whole models", "where the time goes"]
    assert "## Compiling" not in text and "## Correctness" not in text
    assert {r[0] for r in table(text, "## Whole models")} == {"test_ppma"}
    assert "test_vmamba" not in text.split("## Whole models")[1]
    with pytest.raises(SystemExit, match="--presets no_such: not a preset"):
        main(["--quick", "--device", "cpu", "--output", str(tmp_path / "s.md"), "--presets", "no_such"])


def test_a_section_out_of_time_says_so_and_the_report_is_written(tmp_path, capsys):
    out = main(["--quick", "--device", "cpu", "--output", str(tmp_path / "r.md"), "--budget", "0.3"])
    text = out.read_text()
    status = {r[0]: r[3] for r in table(text, "## Time per section")}
    assert list(status) == ["compiling", "correctness", "kernel tables", "whole models", "backbones at large sizes",
                            "where the time goes"]
    assert all(s.startswith("stopped at its time limit") for t, s in status.items() if t != "compiling"), status
    # compiling may end within its share, having started no worker
    assert status["compiling"].startswith("stopped at its time limit") or all(
        r[3] in ("not started", "killed at the section's limit") for r in table(text, "## Compiling")), text
    # what a section was doing, or had not begun, when its limit came
    assert re.search(r"^- (not run \(stopped at its time limit .*\): .*test_|stopped at its time limit \(0 s\) during )"
                     r"|^\| test_\w+ \| fp32 \| 0 \| not started \|$", text, re.MULTILINE), text


def test_relative_error():
    expected = torch.tensor([1.0, -2.0, 4.0])
    assert relative_error(torch.tensor([1.0, -2.0, 3.0]), expected) == 0.25
    assert relative_error(expected.clone(), expected) == 0.0
    assert relative_error(torch.zeros(3), torch.zeros(3)) == 0.0
    assert relative_error(torch.ones(3), torch.zeros(3)) == math.inf
    assert math.isnan(relative_error(torch.tensor([1.0, float("nan"), 4.0]), expected))
    assert math.isnan(relative_error(expected, torch.tensor([1.0, float("inf"), 4.0])))
    assert relative_error(torch.tensor([1.0, -2.0, 3.0], dtype=torch.bfloat16), expected) == 0.25  # in fp32
    with pytest.raises(ValueError, match=r"shapes differ, \(3,\) vs \(1, 3\)"):
        relative_error(expected, expected[None])


def run(out, dx, **grads):
    return Run(torch.tensor(out), torch.tensor(dx), {k: torch.tensor(v) for k, v in grads.items()})


def test_compare_names_the_worst_parameter_gradient_and_the_missing_ones():
    reference = run([1.0, 2.0], [4.0], a=[1.0, 1.0], b=[10.0], c=[2.0])
    errors = compare(run([1.0, 2.5], [4.0], a=[1.0, 1.5], b=[10.0], d=[1.0]), reference)
    assert (errors.out, errors.dx, errors.dparam, errors.dparam_name) == (0.25, 0.0, 0.5, "a")
    assert errors.finite and errors.missing == ("c", "d")
    nan = compare(run([1.0, 2.0], [4.0], a=[1.0, float("nan")], b=[10.0], c=[2.0]), reference)
    assert nan.dparam_name == "a" and math.isnan(nan.dparam) and not nan.finite


def errors(out=0.0, dx=0.0, dparam=0.0, finite=True, missing=()):
    return Errors(out, dx, dparam, "w", finite, missing)


def test_tolerances():
    assert Row("m", "fp32", errors(5e-5, 5e-5, 5e-4)).ok
    assert not Row("m", "fp32", errors(out=2e-4)).ok
    assert not Row("m", "fp32", errors(dparam=2e-3)).ok
    assert not Row("m", "fp32", errors(missing=("w",))).ok
    assert not Row("m", "fp32", errors(finite=False)).ok
    own = errors(0.01, 0.03, 0.4)  # the torch backend's own bf16 error
    assert Row("m", "bf16", errors(0.02, 0.05, 0.7), own).ok
    assert Row("m", "bf16", errors(0.009, 0.0, 0.0), errors()).ok  # the floor: 1e-2
    assert not Row("m", "bf16", errors(0.03, 0.05, 0.7), own).ok
    assert not Row("m", "bf16", errors(0.02, 0.05, 0.9), own).ok
    assert not Row("m", "bf16", errors(0.02, 0.05, 0.7, finite=False), own).ok


def event(key, count, device_us=0.0, cpu_us=0.0, device=DeviceType.CUDA, annotation=False):
    return SimpleNamespace(key=key, count=count, self_device_time_total=device_us, self_cpu_time_total=cpu_us,
                           cpu_time_total=cpu_us, device_type=device, is_user_annotation=annotation)


def test_profiler_summary():
    """The device's rows are its activities; the optimizer's range on the device's timeline (its
    kernels' time again, 8.8 of the 55.2 ms that the H100 run of 2026-11-27 summed) is not one."""
    events = [event("gemm", 4, 3000.0), event("scan_bwd", 2, 9000.0), event("copy", 10, 1000.0),
              event("Optimizer.step#AdamW.step", 2, 9500.0, annotation=True),
              event("aten::mm", 4, cpu_us=500.0, device=DeviceType.CPU),
              event("aten::add", 6, cpu_us=700.0, device=DeviceType.CPU),
              event("Optimizer.step#AdamW.step", 1, cpu_us=900.0, device=DeviceType.CPU)]
    cuda = summarize(events, steps=2, device_type="cuda", top=2)
    assert (cuda.launches, cuda.kernel_ms) == (8.0, 6.5)
    assert [(k.name, k.calls, k.ms) for k in cuda.top] == [("scan_bwd", 1.0, 4.5), ("gemm", 2.0, 1.5)]
    cpu = summarize(events, steps=1, device_type="cpu")
    assert [(k.name, k.calls) for k in cpu.top] == [("aten::add", 6), ("aten::mm", 4)]
    assert (cpu.launches, cpu.kernel_ms) == (10, 1.2)
    empty = summarize([], steps=1, device_type="cuda")
    assert (empty.launches, empty.kernel_ms, empty.top) == (0, 0, [])
    with pytest.raises(ValueError, match="steps must be >= 1"):
        summarize(events, steps=0, device_type="cuda")
    with pytest.raises(ValueError, match="'cuda' or 'cpu'"):
        summarize(events, steps=1, device_type="mps")


def test_runtime_calls_are_the_host_side_cuda_calls():
    events = [event("cudaLaunchKernel", 800, cpu_us=4000.0, device=DeviceType.CPU),
              event("cuLaunchKernelEx", 40, cpu_us=600.0, device=DeviceType.CPU),
              event("cudaStreamSynchronize", 2, cpu_us=9000.0, device=DeviceType.CPU),
              event("aten::mm", 4, cpu_us=99000.0, device=DeviceType.CPU), event("cutlass_gemm", 4, 3000.0)]
    calls = runtime_calls(events, steps=2, top=2)
    assert [(k.name, k.calls, k.ms) for k in calls] == [("cudaStreamSynchronize", 1, 4.5), ("cudaLaunchKernel", 400, 2.0)]


def test_host_operators_are_the_host_rows_but_the_runtime_calls():
    events = [event("cudaLaunchKernel", 800, cpu_us=4000.0, device=DeviceType.CPU),
              event("aten::mm", 4, cpu_us=900.0, device=DeviceType.CPU),
              event("ppma_rotary_qk", 2, cpu_us=3000.0, device=DeviceType.CPU),
              event("autograd::engine::evaluate_function: MmBackward0", 4, cpu_us=200.0, device=DeviceType.CPU),
              event("cutlass_gemm", 4, 3000.0)]
    rows = host_operators(events, steps=2, top=2)
    assert [(k.name, k.calls, k.ms) for k in rows] == [("ppma_rotary_qk", 1, 1.5), ("aten::mm", 2, 0.45)]


def test_host_phases_are_a_training_steps_ranges_in_order():
    events = [event("step: backward", 1, cpu_us=9000.0, device=DeviceType.CPU),
              event("step: backward", 1, 4000.0, annotation=True),  # its range on the device's timeline
              event("step: forward", 1, cpu_us=5000.0, device=DeviceType.CPU),
              event("step: optimizer", 1, cpu_us=1000.0, device=DeviceType.CPU),
              event("aten::mm", 4, cpu_us=900.0, device=DeviceType.CPU)]
    assert [(k.name, k.ms) for k in host_phases(events, steps=1)] == [
        ("step: forward", 5.0), ("step: backward", 9.0), ("step: optimizer", 1.0)]
    assert host_phases(events[-1:], steps=1) == []


def _busy(n):
    total = 0
    for i in range(n):
        total += i * i
    return total


def test_python_functions_rank_a_step_by_self_time():
    def step():
        for _ in range(3):
            _busy(20_000)
        _busy(10)

    rows = python_functions(step, torch.device("cpu"), top=3)
    first = rows[0]
    assert first.name.endswith(f"test_gpu_report.py:{_busy.__code__.co_firstlineno}(_busy)"), rows
    assert first.name.startswith("tests/tools/") and first.calls == 4
    assert first.cumulative_ms >= first.self_ms > 0
    assert [r.self_ms for r in rows] == sorted((r.self_ms for r in rows), reverse=True)


def test_host_time_returns_before_the_queued_work_and_counts_no_syncs_off_cuda():
    runs = []
    assert median_seconds(lambda: runs.append(time.perf_counter()), torch.device("cpu"), 0, 3, wait=False) >= 0
    assert len(runs) == 3
    assert count_syncs(lambda: runs.append(0), torch.device("cpu")) == (None, "")
    assert len(runs) == 3  # nothing to count off CUDA: the step is not run


@pytest.mark.skipif(not torch.cuda.is_available(), reason="torch's sync debug mode is CUDA's")
def test_count_syncs_finds_a_host_read_of_a_cuda_tensor():
    x = torch.ones(3, device="cuda")
    assert count_syncs(lambda: (x * 2).sum().item(), torch.device("cuda"))[0] >= 1
    assert count_syncs(lambda: x * 2, torch.device("cuda")) == (0, "")
    assert torch.cuda.get_sync_debug_mode() == 0


class Clock:
    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now


def test_budget_shares_the_time_left():
    clock = Clock()
    budget = Budget(100.0, {"a": 2.0, "b": 1.0, "c": 1.0}, clock)
    assert budget.share("a") == 50.0
    clock.now = 20.0  # a used 20 of its 50 s: b and c share the 80 left
    assert budget.share("b") == 40.0
    clock.now = 90.0
    assert budget.share("c") == 10.0
    with pytest.raises(ValueError, match="'a' is not one of"):
        budget.share("a")
    deadline = Deadline(5.0, clock)
    clock.now = 93.0
    assert deadline.left() == 2.0
    clock.now = 99.0
    assert deadline.left() == 0.0
    with pytest.raises(ValueError, match="positive"):
        Budget(0.0, {"a": 1.0})
    with pytest.raises(ValueError, match="weights must be positive"):
        Budget(1.0, {"a": 0.0})


def test_time_limit_stops_the_block():
    start = time.monotonic()
    with pytest.raises(SectionTimeout, match="time limit of 0 s"), time_limit(0.2):
        while True:
            sum(range(1000))
    assert time.monotonic() - start < 5
    with time_limit(5.0):  # a block that ends in time leaves no timer behind
        pass
    time.sleep(0.05)
    with pytest.raises(SectionTimeout, match="no time left"), time_limit(0.0):
        pass


def test_a_bench_script_stopped_at_its_limit_keeps_its_output(tmp_path, monkeypatch):
    (tmp_path / "slow.py").write_text(textwrap.dedent("""\
        import sys, time
        print("| row | 1.5 |", " ".join(sys.argv[1:]), flush=True)
        time.sleep(60)
    """))
    (tmp_path / "fails.py").write_text("import sys\nprint('partial')\nsys.exit('broken input')\n")
    monkeypatch.setattr(kernel_tables, "bench_dir", lambda: tmp_path)
    bench = kernel_tables.Bench("slow.py", ("--full",), ("--quick",))
    start = time.monotonic()
    result = kernel_tables.run_bench(bench, torch.device("cpu"), True, 1.5)
    assert time.monotonic() - start < 20
    assert result.returncode is None and result.stdout == "| row | 1.5 | --device cpu --quick\n"
    assert result.command == "kernels/bench/slow.py --device cpu --quick"
    failed = kernel_tables.run_bench(kernel_tables.Bench("fails.py", (), ()), torch.device("cpu"), False, 30)
    assert (failed.returncode, failed.stdout, failed.stderr_tail) == (1, "partial\n", "broken input")
    with pytest.raises(FileNotFoundError, match="missing.py not found: the kernel tables need a source checkout"):
        kernel_tables.run_bench(kernel_tables.Bench("missing.py", (), ()), torch.device("cpu"), True, 1)


def test_warm_up_tasks_put_the_shared_kernels_first():
    tasks = warm_up.tasks(("a", "b"), ("t",), ("s.py --x",), quick=False)
    pairs = [(t.name, t.case) for t in tasks]
    assert pairs[:7] == [("a", "fp32"), ("b", "fp32"), ("a", "bf16"), ("b", "bf16"), ("a", "fp16"), ("b", "fp16"),
                         ("s.py --x", "script")]
    assert len(set(pairs)) == len(pairs) == 2 * 6 + 4 + 1  # the tiny presets' six cases, t's four, the script
    assert {c for p, c in pairs if p == "t"} == {"fp32", "bf16", "fp16", "odd"}
    assert [(t.name, t.case) for t in warm_up.tasks(("a",), ("t",), ("s.py",), quick=True)] == [("a", "fp32")]
    bench = kernel_tables.BENCHES[0]
    command = kernel_tables.warm_command(bench, torch.device("cuda"))
    assert command[1].endswith(f"kernels/bench/{bench.script}") and command[2:4] == ["--device", "cuda"]
    assert command[command.index("--repeat") + 1] == "1" and len(command) == 4 + len(bench.full)


def test_warm_up_workers_report_failures_and_are_killed_at_the_limit():
    """A worker that fails gives its error's last line; at the limit the workers still running are
    killed (none is left behind) and say so, and those never started say that."""
    tasks = [warm_up.WarmTask("no_such_preset", "fp32"), warm_up.WarmTask("test_ppma", "speed"),
             warm_up.WarmTask("test_ppma", "fp16")]
    args = ["--device", "cpu", "--size", "32", "32", "--infer-batch", "1", "--train-batch", "1"]
    results = warm_up.warm_up(tasks[:1], lambda task: warm_up.worker_command(task, args), 120, 1)
    assert [(r.name, r.case) for r in results] == [("no_such_preset", "fp32")]
    assert results[0].status.startswith("failed: ") and "no_such_preset" in results[0].status
    start = time.monotonic()
    results = warm_up.warm_up(tasks[1:], lambda task: warm_up.worker_command(task, args), 0.5, 1)
    assert time.monotonic() - start < 10
    assert [(r.name, r.case, r.status) for r in results] == [("test_ppma", "speed", "killed at the section's limit"),
                                                             ("test_ppma", "fp16", "not started")]


def test_warm_up_kills_every_worker_before_waiting(monkeypatch):
    """The section's timer may fire while the workers are reaped: every worker's group is killed
    before the first wait, so none is left running to load the GPU under later sections."""
    killed, real_kill = [], warm_up.kill_group

    def kill(process):
        killed.append(process)
        real_kill(process)

    def wait_interrupted(self, timeout=None):
        assert len(killed) == 2, "a wait before every worker was killed"
        raise SectionTimeout("the section's timer")

    monkeypatch.setattr(warm_up, "kill_group", kill)
    tasks = [warm_up.WarmTask("test_ppma", "speed"), warm_up.WarmTask("test_ppma", "fp16")]
    with monkeypatch.context() as patched, pytest.raises(SectionTimeout):
        patched.setattr(warm_up.subprocess.Popen, "wait", wait_interrupted)
        warm_up.warm_up(tasks, lambda task: [sys.executable, "-c", "import time; time.sleep(60)"], 0.5, 2)
    assert [p.wait(timeout=10) for p in killed] == [-9, -9]  # killed, not finished


def test_warm_up_worker_runs_each_case(monkeypatch):
    """The worker's cases run the passes of the sections they warm (here on the CPU, 32 x 32)."""
    for case in warm_up.CASES:
        warm_up.main(["test_ppma", case, "--device", "cpu", "--size", "32", "40", "--infer-batch", "1",
                      "--train-batch", "1", "--backbone-sizes", "32"])


def test_official_model_files_are_imported_by_path(tmp_path):
    ppma_dir, mlla_dir = tmp_path / "PPMA", tmp_path / "MLLA"
    (ppma_dir / "classification" / "models").mkdir(parents=True)
    (mlla_dir / "models").mkdir(parents=True)
    (ppma_dir / "classification" / "models" / "PPMA.py").write_text(textwrap.dedent("""\
        import torch
        def PPMAViT_T(args):
            return torch.nn.Linear(2, 3)
        class Backbone_PPMAViT(torch.nn.Identity):
            def __init__(self, out_indices, **kwargs):
                super().__init__()
                self.out_indices, self.kwargs = out_indices, kwargs
    """))
    (mlla_dir / "models" / "mlla.py").write_text("import torch\nMLLA = lambda **kw: torch.nn.Conv2d(1, kw['embed_dim'], 1)\n")
    models = {m.label: m for m in official_models(ppma_dir, mlla_dir)}
    assert {k: (m.beside, m.backbone) for k, m in models.items()} == {
        "official PPMA-T": ("ppma_tiny", False), "official PPMA-T backbone": ("ppma_tiny", True),
        "official MLLA-T": ("mila_tiny", False)}
    assert models["official PPMA-T"].build().out_features == 3
    backbone = models["official PPMA-T backbone"].build()
    assert backbone.out_indices == (0, 1, 2, 3) and backbone.kwargs["depths"] == [2, 2, 8, 2]
    assert models["official MLLA-T"].build().out_channels == 64
    assert official_models(None, None) == []
    with pytest.raises(FileNotFoundError, match=r"no models/mlla.py there"):
        official_models(None, ppma_dir)
    with pytest.raises(SystemExit, match="gpu_report: .*no classification/models/PPMA.py there"):
        main(["--quick", "--device", "cpu", "--official-ppma", str(mlla_dir), "--output", str(tmp_path / "r.md")])
