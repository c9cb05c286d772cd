"""The GPU report: one command that measures the package on a device and writes one Markdown file.

    python tools/gpu_report.py [--quick] [--device cuda|cpu] [--output REPORT.md]
                               [--official-ppma DIR] [--official-mlla DIR] [--budget SECONDS]
                               [--sections NAME ...] [--presets PRESET ...]

Sections, run in this order, each within its share of ``--budget`` (default 330 s, meant to keep
the whole run, imports included, within 6 minutes on an H100): a section that runs out of time
stops, keeps what it measured and says what it did not run.

0. **Compiling** (:mod:`.warm_up`): the later sections' passes, once each in parallel worker
   processes, so that Triton's on-disk cache holds their kernels before anything is timed.
1. **Correctness** (:mod:`.correctness`): ``auto`` against ``torch`` on (full mode) every tiny
   preset, then every ``test_*`` preset.
2. **Kernel tables** (:mod:`.kernel_tables`): the ``kernels/bench`` scripts.
3. **Whole models** (:mod:`.throughput`): inference (bs128) and training (bs64) images/s and peak
   memory of every tiny preset on ``auto`` and ``torch``; 4. their **backbones at large sizes**,
   1024 and 1280, bs1. The official PPMA-T / MLLA-T (``--official-ppma`` / ``--official-mlla``)
   beside them.
5. **Where the time goes** (:mod:`.step_profile`): one training step per preset under the profiler,
   then one inference call per preset.

``--sections`` runs some of them (sharing the budget by their weights), ``--presets`` some presets:
on a fresh GPU the kernels' first compile alone can outlast the default budget (docs/gpu.md).

``--quick`` (the CPU test): two ``test_*`` presets at 32x32, batch 2 (one fp32 worker each),
backbones at 32 and 48, one timed run, two of the scripts at their reduced shapes. docs/gpu.md
says how to read it.
"""
from __future__ import annotations

import argparse
import datetime
import gc
import math
import os
import platform
import shlex
import subprocess
import sys
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path

import torch

from .budget import Budget, Deadline, SectionTimeout
from .correctness import Row, check_preset
from .kernel_tables import BENCHES, Bench, BenchResult, run_bench, warm_command
from .official import Official, official_models
from .step_profile import StepProfile, profile_step
from .throughput import (
    BackboneRow,
    Repeats,
    SpeedRow,
    backbone_speed,
    inference_step,
    model_speed,
    training_step,
)
from .warm_up import WarmResult, WarmTask, parallel_processes, tasks, warm_up, worker_command

TINY_PRESETS = ("ppma_tiny", "vmamba_tiny", "vim_tiny", "mila_tiny", "ppma_linear_tiny")
# quick mode (a test in the default run, on two CPU cores): the test presets with the most kernels
# behind them (polyline attention and scan; cross scan and selective scan)
QUICK_PRESETS = ("test_ppma", "test_vmamba")
DEFAULT_BUDGET_S = 330.0
TOP_KERNELS = 12
CLEANUP_S = 5.0  # the compiling section's workers stop this long before its timer


def package_test_presets() -> tuple[str, ...]:
    """Every ``test_*`` preset of the package."""
    from ppma.models.family import package_models

    return tuple(p for p in package_models() if p.startswith("test_"))


@dataclass(frozen=True)
class Settings:
    """What the report measures, and how much (:func:`settings`)."""

    quick: bool
    device: torch.device
    correctness_presets: tuple[str, ...]
    presets: tuple[str, ...]  # whole models and profiles
    infer_batch: int
    train_batch: int
    backbone_sizes: tuple[int, ...]
    repeats: Repeats
    max_side: int | None  # quick: inputs no larger than this
    benches: tuple[Bench, ...]
    officials: tuple[Official, ...] = ()

    def input_size(self, name: str) -> tuple[int, int]:
        """The input ``(H, W)`` for preset ``name``: its default, at most ``max_side`` a side."""
        import timm

        import ppma.models  # noqa: F401  (registers the presets)

        return tuple(min(n, self.max_side or n) for n in timm.get_pretrained_cfg(name).input_size[1:])


def settings(quick: bool, device: torch.device, officials: tuple[Official, ...] = ()) -> Settings:
    """Full mode: every tiny and ``test_*`` preset at the issue's sizes; quick mode: two ``test_*``
    presets at 32x32, backbones at 32 and 48, no warm-up and one timed run, two kernel scripts."""
    if quick:
        return Settings(True, device, QUICK_PRESETS, QUICK_PRESETS, 2, 2, (32, 48), Repeats(0, 1), 32,
                        tuple(b for b in BENCHES if b.quick is not None), officials)
    return Settings(False, device, TINY_PRESETS + package_test_presets(), TINY_PRESETS, 128, 64, (1024, 1280),
                    Repeats(2, 5), None, BENCHES, officials)


@dataclass(frozen=True)
class Failure:
    """An item of a section that raised: what it was and the error."""

    item: str
    error: str


@dataclass
class Section:
    """One section's results (rows of its own types, or :class:`Failure`), its time limit, the
    seconds it used, how it ended and the items it did not reach."""

    title: str
    rows: list = field(default_factory=list)
    limit_s: float = 0.0
    used_s: float = 0.0
    status: str = "complete"
    running: str = ""  # the item under way (the one a time limit stopped)
    not_run: list[str] = field(default_factory=list)


def describe(error: BaseException) -> str:
    """One line naming the error (its first line only)."""
    text = str(error).strip().splitlines()
    return f"{type(error).__name__}: {text[0][:300] if text else ''}"


def release_memory(device: torch.device) -> None:
    """Free what the last item left (models, activations) before the next."""
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()


def run_items(section: Section, items: list[tuple[str, Callable[[], object]]], deadline: Deadline,
              device: torch.device) -> None:
    """Run ``items`` (label, call) in turn; a call returns a row or an iterable of rows. An item
    that raises becomes a :class:`Failure`; items not reached before ``deadline`` are listed in
    ``section.not_run`` (also when the section's time limit stops it)."""
    pending = [label for label, _ in items]
    section.not_run = pending
    for label, call in items:
        if deadline.left() <= 0:
            return
        pending.remove(label)
        section.running = label
        print(f"[{section.title}] {label}", flush=True)
        try:
            result = call()
            for row in (result if isinstance(result, (list, tuple)) or hasattr(result, "__next__") else [result]):
                section.rows.append(row)
        except Exception as err:  # noqa: BLE001 - one item's failure is a result: report it and go on
            section.rows.append(Failure(label, describe(err)))
            print(f"[{section.title}] {label}: {describe(err)}", file=sys.stderr, flush=True)
        finally:
            release_memory(device)
    section.running = ""


def compiling_items(s: Settings, deadline: Deadline) -> list:
    others = tuple(p for p in s.correctness_presets if p not in s.presets)
    scripts = {b.label(False): b for b in s.benches}
    work = tasks(s.presets, others, tuple(scripts), s.quick)

    def command(task: WarmTask) -> list[str]:
        if task.case == "script":
            return warm_command(scripts[task.name], s.device)
        return worker_command(task, ["--device", s.device.type, "--size", *map(str, s.input_size(task.name)),
                                     "--infer-batch", str(s.infer_batch), "--train-batch", str(s.train_batch),
                                     "--backbone-sizes", *map(str, s.backbone_sizes)])

    processes = parallel_processes(s.device, len(work))
    label = f"{len(work)} worker processes, {processes} at a time"
    # the workers stop CLEANUP_S before the section's timer, time to kill and reap them all (a
    # process with a CUDA context can take a second to exit) and return their rows
    return [(label, lambda: warm_up(work, command, deadline.left() - CLEANUP_S, processes))]


def correctness_items(s: Settings, deadline: Deadline) -> list:
    return [(name, lambda name=name: check_preset(name, s.device, s.input_size(name))) for name in s.correctness_presets]


def kernel_table_items(s: Settings, deadline: Deadline) -> list:
    shares = Budget(max(deadline.left(), 1e-3), {str(i): 1.0 for i in range(len(s.benches))})
    return [(b.label(s.quick),
             lambda i=i, b=b: run_bench(b, s.device, s.quick, shares.share(str(i)))) for i, b in enumerate(s.benches)]


def timm_builder(name: str, **kwargs) -> Callable[[], torch.nn.Module]:
    def build():
        import timm

        import ppma.models  # noqa: F401  (registers the presets)

        return timm.create_model(name, **kwargs)
    return build


def beside(presets: tuple[str, ...], officials: tuple[Official, ...], backbone: bool):
    """``(label, build, backend, preset)`` per model: each preset on ``auto`` then ``torch``, an
    official model (backend ``'-'``) before the preset it compares with."""
    kwargs = {"features_only": True} if backbone else {}
    for name in presets:
        for official in officials:
            if official.beside == name and official.backbone == backbone:
                yield official.label, official.build, "-", name
        for backend in ("auto", "torch"):
            yield name + (" features" if backbone else ""), timm_builder(name, **kwargs), backend, name


def model_items(s: Settings, deadline: Deadline) -> list:
    return [(f"{label} [{backend}]", lambda label=label, build=build, backend=backend, name=name: model_speed(
        label, build, backend, s.device, s.input_size(name), s.infer_batch, s.train_batch, s.repeats))
        for label, build, backend, name in beside(s.presets, s.officials, backbone=False)]


def backbone_items(s: Settings, deadline: Deadline) -> list:
    return [(f"{label} [{backend}] {size}", lambda label=label, build=build, backend=backend, size=size:
             backbone_speed(label, build, backend, s.device, size, s.repeats))
            for label, build, backend, _ in beside(s.presets, s.officials, backbone=True) for size in s.backbone_sizes]


def profile_items(s: Settings, deadline: Deadline) -> list:
    """Per model on ``auto`` (and per official one): its training step, then, after every model's
    step, its inference call (is it bound by the host too?)."""
    def run(label: str, build: Callable[[], torch.nn.Module], name: str, training: bool) -> StepProfile:
        torch.manual_seed(0)
        model = build().to(s.device)
        size = s.input_size(name)
        step = (training_step(model.train(), torch.randn(s.train_batch, 3, *size, device=s.device)) if training
                else inference_step(model.eval(), torch.randn(s.infer_batch, 3, *size, device=s.device)))
        return profile_step(label, step, s.device, s.repeats.warmup, s.repeats.timed, TOP_KERNELS)

    models = [(label, build, name) for label, build, backend, name in beside(s.presets, s.officials, backbone=False)
              if backend != "torch"]
    passes = ((True, f"training step, batch {s.train_batch}"), (False, f"inference, batch {s.infer_batch}"))
    items = [(f"{label} ({what})", build, name, training) for training, what in passes for label, build, name in models]
    return [(item, lambda item=item, build=build, name=name, training=training: run(item, build, name, training))
            for item, build, name, training in items]


# --- the Markdown -------------------------------------------------------------------------------


def fmt_error(value: float) -> str:
    return f"{value:.1e}" if math.isfinite(value) and value != 0 else str(value)


def fmt_number(value: float) -> str:
    return f"{value:.0f}" if abs(value) >= 100 else f"{value:.3g}"


def render_compiling(section: Section, s: Settings) -> list[str]:
    rows = [r for r in section.rows if isinstance(r, WarmResult)]
    lines = [("Each worker process runs one case of one preset once on `auto` (ppma/bench/gpu/warm_up.py: the passes "
              "the sections below check and time), or one kernel script with one timed run, so that Triton's "
              "on-disk cache holds their kernels: compiled in parallel, one process a CPU core, instead of one "
              "after another in the sections."), "",
             "| preset or script | case | s | status |", "|---|---|---:|---|"]
    lines += [f"| {r.name} | {r.case} | {r.seconds:.0f} | {r.status} |" for r in rows]
    return lines + ["", f"{sum(r.status == 'done' for r in rows)} of {len(rows)} workers done."]


def render_correctness(section: Section, s: Settings) -> list[str]:
    lines = ["Relative errors `max|auto - torch| / max|torch|` of the output, the input gradient and the worst",
             "parameter gradient. fp32 runs with TF32 off. Under autocast both backends are compared with `torch`",
             "in fp32; *torch's own* is the `torch` backend's error in that dtype. Tolerances: docs/gpu.md.", "",
             "| preset | case | output | input grad | worst param grad | torch's own (out / dx / param) | within tolerance |",
             "|---|---|---:|---:|---|---|---|"]
    rows = [r for r in section.rows if isinstance(r, Row)]
    for row in rows:
        e = row.errors
        param = f"{fmt_error(e.dparam)} `{e.dparam_name}`" if e.dparam_name else fmt_error(e.dparam)
        own = "" if row.baseline is None else " / ".join(
            fmt_error(v) for v in (row.baseline.out, row.baseline.dx, row.baseline.dparam))
        verdict = "yes" if row.ok else "**no**" + ("" if e.finite else " (not finite)") + (
            f" (gradients in one run only: {', '.join(e.missing)})" if e.missing else "")
        lines.append(f"| {row.preset} | {row.case} | {fmt_error(e.out)} | {fmt_error(e.dx)} | {param} | {own} | {verdict} |")
    return lines + ["", f"{sum(r.ok for r in rows)} of {len(rows)} cases within tolerance."]


def render_kernel_tables(section: Section, s: Settings) -> list[str]:
    lines = ["The `kernels/bench` scripts, each in its own process; their columns: docs/benchmarks.md."]
    for result in section.rows:
        if not isinstance(result, BenchResult):
            continue
        status = f"exit {result.returncode}" if result.returncode is not None else "**stopped at its time limit**"
        lines += ["", f"### `{result.command}`", "", f"{result.seconds:.0f} s, {status}.", ""]
        for line in result.stdout.splitlines():
            if line.startswith("# "):  # its comment lines as text
                line = line[2:] + "  "
            elif line.startswith("## "):  # its headings under the script's
                line = "##" + line
            lines.append(line)
        if result.returncode not in (0, None) and result.stderr_tail:
            lines += ["", "```text", result.stderr_tail, "```"]
    return lines


def render_models(section: Section, s: Settings) -> list[str]:
    shape = "32x32" if s.quick else "224x224"
    lines = [(f"bf16 autocast, {shape}; inference at batch {s.infer_batch} (`inference_mode`), training (AdamW) at "
              f"batch {s.train_batch}. Peak MiB: allocated beyond the weights, the input and the optimizer state. "
              "Backend `-`: an official model."), "",
             "| model | backend | inference img/s | inference peak MiB | training img/s | training peak MiB |",
             "|---|---|---:|---:|---:|---:|"]
    return lines + [f"| {r.model} | {r.backend} | {fmt_number(r.infer_img_s)} | {fmt_number(r.infer_peak_mib)} | "
                    f"{fmt_number(r.train_img_s)} | {fmt_number(r.train_peak_mib)} |"
                    for r in section.rows if isinstance(r, SpeedRow)]


def render_backbones(section: Section, s: Settings) -> list[str]:
    lines = [("bf16 autocast inference of each preset's `features_only` backbone (the official one: its four "
              f"stage outputs) on one image of {' and of '.join(f'{n}x{n}' for n in s.backbone_sizes)}."), "",
             "| backbone | backend | size | ms | peak MiB beyond the weights |", "|---|---|---:|---:|---:|"]
    return lines + [f"| {r.model} | {r.backend} | {r.size} | {fmt_number(r.ms)} | {fmt_number(r.peak_mib)} |"
                    for r in section.rows if isinstance(r, BackboneRow)]


def render_profiles(section: Section, s: Settings) -> list[str]:
    unit = "kernel" if s.device.type == "cuda" else "aten operator"
    lines = [(f"One bf16 training step (batch {s.train_batch}) per model on `auto`, then one bf16 inference call "
              f"(batch {s.infer_batch}) per model: the call's median wall time "
              "unprofiled; the host's time (`host`: from the call, the device idle, until the step returns, "
              "not waiting for the device: near the step's time where the launches bound it) and the "
              "synchronizing calls of one step (`torch.cuda.set_sync_debug_mode`); then one step under "
              f"`torch.profiler`: the host's milliseconds in a training step's forward (the loss included), "
              f"backward and update, {unit} calls per step, their summed self time and the top {TOP_KERNELS} by "
              "self time, the CUDA runtime calls by host time (the profiled step ends with one "
              "`cudaDeviceSynchronize` of the report's own) and the step's other host operators by self "
              "host time (aten operators, autograd's nodes, the ops' autograd functions `ppma_<name>`: "
              "their own code, Python included); and the Python functions of one more step by self time "
              "(`cProfile`, the calling thread only: a CUDA backward runs in autograd's device thread, one "
              "`run_backward` call there).")]
    for p in section.rows:
        if not isinstance(p, StepProfile):
            continue
        m, h = p.summary, p.host
        syncs = "" if h.syncs is None else f", {h.syncs} synchronizing calls" + (f" ({h.first_sync})" if h.syncs else "")
        lines += ["", (f"### {p.model}: {fmt_number(p.step_ms)} ms, host {fmt_number(h.ms)} ms{syncs}, "
                       f"{m.launches:.0f} {unit} calls, {fmt_number(m.kernel_ms)} ms of {unit} time"), ""]
        if h.phases:
            lines += ["Host ms of the profiled step by part: " + ", ".join(
                f"{k.name.removeprefix('step: ')} {fmt_number(k.ms)}" for k in h.phases) + ".", ""]
        lines += [f"| {unit} | calls | ms | share |", "|---|---:|---:|---:|"]
        lines += [f"| `{_cell(k.name)}` | {k.calls:.0f} | {k.ms:.3g} | "
                  f"{100 * k.ms / m.kernel_ms if m.kernel_ms > 0 else 0.0:.1f}% |" for k in m.top]
        if h.runtime:
            lines += _host_table("runtime call", "host ms", h.runtime)
        lines += _host_table("host operator", "self host ms", h.operators)
        lines += ["", "| Python function | calls | self ms | cumulative ms |", "|---|---:|---:|---:|"]
        lines += [f"| `{_cell(f.name)}` | {f.calls} | {f.self_ms:.3g} | {f.cumulative_ms:.3g} |" for f in h.python]
    return lines


def _host_table(what: str, unit: str, rows) -> list[str]:
    """A blank line and the table of ``rows`` (:class:`KernelTime`: name, calls, ms)."""
    return ["", f"| {what} | calls | {unit} |", "|---|---:|---:|",
            *(f"| `{_cell(k.name)}` | {k.calls:.0f} | {k.ms:.3g} |" for k in rows)]


def _cell(name: str) -> str:
    """A kernel's name for a table cell: at most 100 characters, no ``|``."""
    return (name if len(name) <= 100 else name[:97] + "...").replace("|", "/")


@dataclass(frozen=True)
class SectionKind:
    """A section: its weight in the budget, its items (``(settings, its deadline) -> [(label, call)]``)
    and its Markdown (``(section, settings) -> lines``)."""

    weight: float
    items: Callable[[Settings, Deadline], list]
    render: Callable[[Section, Settings], list[str]]


SECTIONS = {
    "compiling": SectionKind(2.5, compiling_items, render_compiling),
    "correctness": SectionKind(3.5, correctness_items, render_correctness),
    "kernel tables": SectionKind(3.0, kernel_table_items, render_kernel_tables),
    "whole models": SectionKind(2.5, model_items, render_models),
    "backbones at large sizes": SectionKind(1.0, backbone_items, render_backbones),
    "where the time goes": SectionKind(1.5, profile_items, render_profiles),
}
# --sections' names for them, in the same order
SECTION_NAMES = dict(zip(("compiling", "correctness", "kernels", "models", "backbones", "profile"), SECTIONS))


def environment(s: Settings, command: str) -> list[str]:
    """The header: date, command, device, versions, and the backend each op selects."""
    import timm

    import ppma
    from ppma.kernels.common.runtime import interpreted, triton_installed
    from ppma.ops.registry import ENV_VAR, backend_report

    if s.device.type == "cuda":
        props = torch.cuda.get_device_properties(s.device)
        device = f"{props.name}, sm_{props.major}{props.minor}, {props.total_memory / 2**30:.1f} GiB"
    else:
        device = f"CPU ({platform.processor() or platform.machine()}), {torch.get_num_threads()} torch threads"
    if triton_installed():
        import triton

        triton_version = triton.__version__ + (" (interpreter: TRITON_INTERPRET=1)" if interpreted() else "")
    else:
        triton_version = "not installed"
    lines = [f"- date: {datetime.datetime.now(datetime.UTC):%Y-%m-%d %H:%M} UTC",
             f"- command: `{command}`",
             f"- device: {device}",
             (f"- versions: Python {platform.python_version()}, torch {torch.__version__}, Triton {triton_version}, "
              f"timm {timm.__version__}, ppma {ppma.__version__}{git_commit()}"),
             f"- mode: {'quick' if s.quick else 'full'}", "",
             (f"The backend each op selects on this device with `{ENV_VAR}` as the report found it "
              f"({os.environ.get(ENV_VAR, 'unset: auto')}):"), "",
             "| op | selected | triton |", "|---|---|---|"]
    return lines + [f"| {op} | {row['selected']} | {row.get('triton', '')} |"
                    for op, row in backend_report(s.device).items()]


def git_commit() -> str:
    """`` at <commit>`` of the source checkout the package runs from, or ``''``."""
    root = Path(__file__).resolve().parents[3]
    try:
        out = subprocess.run(["git", "-C", str(root), "rev-parse", "--short", "HEAD"], capture_output=True,
                             text=True, timeout=10, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return ""
    return f" at {out.stdout.strip()}" if out.returncode == 0 else ""


def render(s: Settings, command: str, sections: list[Section], seconds: float) -> str:
    """The whole report."""
    lines = ["# ppma GPU report", "", *environment(s, command)]
    for section in sections:
        lines += ["", f"## {section.title.capitalize()}", "", *SECTIONS[section.title].render(section, s)]
        notes = [f"- **{f.item}** failed: `{f.error}`" for f in section.rows if isinstance(f, Failure)]
        if section.not_run:
            notes.append(f"- not run ({section.status}): {', '.join(section.not_run)}")
        elif section.status != "complete":
            notes.append(f"- {section.status}")
        if notes:
            lines += ["", *notes]
    lines += ["", "## Time per section", "", "| section | limit s | used s | status |", "|---|---:|---:|---|"]
    lines += [f"| {x.title} | {x.limit_s:.0f} | {x.used_s:.0f} | {x.status} |" for x in sections]
    return "\n".join(lines + ["", f"Whole run: {seconds:.0f} s."]) + "\n"


# --- running it ---------------------------------------------------------------------------------


def run_sections(s: Settings, budget_s: float, titles: tuple[str, ...] = tuple(SECTIONS)) -> list[Section]:
    """The sections ``titles`` of :data:`SECTIONS` (default all), in its order, each within its
    share of ``budget_s`` seconds."""
    chosen = {title: kind for title, kind in SECTIONS.items() if title in titles}
    budget = Budget(budget_s, {title: kind.weight for title, kind in chosen.items()})
    sections = []
    for title, kind in chosen.items():
        section = Section(title)
        sections.append(section)
        start = time.monotonic()
        try:
            with budget.section(title) as deadline:
                section.limit_s = deadline.seconds
                run_items(section, kind.items(s, deadline), deadline, s.device)
            if section.not_run:
                section.status = f"stopped at its time limit ({section.limit_s:.0f} s)"
        except SectionTimeout:
            section.status = f"stopped at its time limit ({section.limit_s:.0f} s)" + (
                f" during {section.running}" if section.running else "")
        except Exception as err:  # noqa: BLE001 - a broken section is reported, the others still run
            section.status = f"failed: {describe(err)}"
            traceback.print_exc()
        finally:
            section.used_s = time.monotonic() - start
            release_memory(s.device)
        print(f"[{title}] {section.status}, {section.used_s:.0f} s", flush=True)
    return sections


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="tools/gpu_report.py", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="test presets, small sizes, one timed run (CPU test)")
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--output", default="gpu_report.md", help="the Markdown file to write")
    parser.add_argument("--official-ppma", metavar="DIR", help="a copy of github.com/zhongchenzhao/PPMA")
    parser.add_argument("--official-mlla", metavar="DIR", help="a copy of github.com/LeapLabTHU/MLLA")
    parser.add_argument("--budget", type=float, default=DEFAULT_BUDGET_S, metavar="SECONDS",
                        help=f"time for all sections together (default {DEFAULT_BUDGET_S:.0f})")
    parser.add_argument("--sections", nargs="+", choices=tuple(SECTION_NAMES), default=tuple(SECTION_NAMES),
                        help="the sections to run (default all), sharing the budget by their weights")
    parser.add_argument("--presets", nargs="+", metavar="PRESET",
                        help="only these of the mode's presets (default all; officials beside those kept)")
    args = parser.parse_args(argv)
    if args.device == "cuda" and not torch.cuda.is_available():
        parser.error("--device cuda: torch sees no CUDA device (torch.cuda.is_available() is False)")
    if not args.budget > 0:
        parser.error(f"--budget must be positive, got {args.budget}")
    return args


def command_line(argv: list[str]) -> str:
    """The command as typed, with the environment variables that change what it measures."""
    env = [f"{k}={os.environ[k]}" for k in ("TRITON_INTERPRET", "PPMA_BACKEND", "CUDA_VISIBLE_DEVICES") if k in os.environ]
    return shlex.join([*env, "python", "tools/gpu_report.py", *argv])


def main(argv: list[str] | None = None) -> Path:
    """Measure, write the report to ``--output`` and return its path."""
    argv = sys.argv[1:] if argv is None else list(argv)
    args = parse_args(argv)
    start = time.monotonic()
    device = torch.device(args.device)
    try:
        officials = tuple(official_models(args.official_ppma, args.official_mlla))
    except FileNotFoundError as err:
        raise SystemExit(f"gpu_report: {err}") from None
    s = settings(args.quick, device, officials)
    if args.presets:
        unknown = sorted(set(args.presets) - set(s.correctness_presets))
        if unknown:
            raise SystemExit(f"gpu_report: --presets {' '.join(unknown)}: not a preset of this mode "
                             f"({', '.join(s.correctness_presets)})")
        s = replace(s, correctness_presets=tuple(p for p in s.correctness_presets if p in args.presets),
                    presets=tuple(p for p in s.presets if p in args.presets))
    sections = run_sections(s, args.budget, tuple(SECTION_NAMES[name] for name in args.sections))
    output = Path(args.output)
    output.write_text(render(s, command_line(argv), sections, time.monotonic() - start))
    print(f"wrote {output}", flush=True)
    return output


if __name__ == "__main__":
    main()
