"""The resource table: shared memory, registers and spills of every Triton kernel configuration
on every supported architecture, compiled without a GPU (``python tools/kernel_resources.py``).

Compiles each kernel module's ``compile_cases()`` (:data:`~.tuning.KERNEL_MODULES`) with
``triton.compile`` for the architectures of :data:`~.tuning.ARCHS` in a process pool, reading
``metadata.shared`` and ptxas's register and spill counts, and writes the table the pruning reads
(:data:`~.tuning.RESOURCES_PATH`) and the marked section of ``docs/benchmarks.md``.

- Incremental: each row keeps a hash of its case (:func:`source_key`: the kernel's source and that
  of the ``@triton.jit`` functions and constexpr globals it uses, without line numbers; and the
  case's types, constexprs, warps, stages and options). A row whose hash is unchanged is not
  compiled again, so an edit elsewhere in a kernel's module recompiles nothing.
- Fewer compiles: a case with ``same_as`` (e.g. fp16, laid out as bf16) takes that row's numbers,
  and :data:`ARCH_SAME_AS` architectures (sm_89: sm_86's limit and PTX rules) take another's;
  ``tests/kernels/test_kernel_resources.py`` compiles samples of both to check.

Compiling runs outside Triton's interpreter (``TRITON_INTERPRET=1`` replaces ``@triton.jit`` at
import time): the command line unsets it before importing the kernels.
"""
from __future__ import annotations

import argparse
import ast
import functools
import hashlib
import importlib
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor
from multiprocessing import get_context
from pathlib import Path

import triton
import triton.language as tl
from triton import knobs
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from triton.runtime.jit import JITFunction

from .tuning import (
    ARCHS,
    KERNEL_MODULES,
    RESOURCES_PATH,
    SHARED_MEMORY_LIMIT,
    CompileCase,
)

# Architectures whose numbers are another's (same shared memory limit and PTX target rules).
ARCH_SAME_AS = {89: 86}
DOCS = Path(__file__).resolve().parents[2] / "docs" / "benchmarks.md"
BEGIN, END = "<!-- kernel_resources: begin -->", "<!-- kernel_resources: end -->"


@functools.cache
def cases(module: str) -> dict[str, CompileCase]:
    """``{row name: CompileCase}`` of ``ppma.kernels.<module>``."""
    return {c.name: c for c in importlib.import_module(f"ppma.kernels.{module}").compile_cases()}


def all_cases() -> dict[str, CompileCase]:
    """Every kernel module's cases, by row name."""
    return {name: case for module in KERNEL_MODULES for name, case in cases(module).items()}


def source_key(fn: JITFunction, _seen: set | None = None) -> str:
    """What the code of the ``@triton.jit`` function ``fn`` depends on, without line numbers
    (Triton's ``cache_key`` has them: any edit above a kernel would change it): its source, then,
    once each, that of every ``@triton.jit`` function it names through its globals (recursively)
    and the value of every constant global it names (``X: tl.constexpr = 2`` is a plain ``int``)."""
    seen = set() if _seen is None else _seen
    seen.add(fn)
    parts = [fn.src]
    for node in ast.walk(ast.parse(fn.src)):
        if isinstance(node, ast.Name):
            value = fn.__globals__.get(node.id)
        elif isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name):
            value = getattr(fn.__globals__.get(node.value.id), node.attr, None)
        else:
            continue
        if isinstance(value, JITFunction) and value not in seen:
            parts.append(source_key(value, seen))
        elif isinstance(value, (tl.constexpr, bool, int, float, str)):  # a global the kernel reads
            parts.append(f"{ast.unparse(node)} = {value!r}")
    return "\n".join(parts)


def case_hash(case: CompileCase) -> str:
    """What a row's numbers depend on: the kernel's code (:func:`source_key`) and the case."""
    text = repr((triton.__version__, source_key(case.kernel), sorted(case.signature.items()),
                 sorted((k, repr(v)) for k, v in case.constexprs.items()), case.num_warps, case.num_stages,
                 sorted(case.options.items())))
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def ptxas_usage(ptx: str, arch: int) -> tuple[int, int]:
    """``(registers, spill-store bytes)`` that ``ptxas -v`` reports for ``ptx`` on ``sm_<arch>``,
    with the options Triton compiles with."""
    gpu = f"sm_{arch}a" if arch >= 90 else f"sm_{arch}"
    with tempfile.TemporaryDirectory() as tmp:
        source = Path(tmp) / "kernel.ptx"
        source.write_text(ptx)
        log = subprocess.run([knobs.nvidia.ptxas.path, "-lineinfo", "-v", "--regAllocOptLevel=2", f"--gpu-name={gpu}",
                              str(source), "-o", str(source.with_suffix(".cubin"))],
                             capture_output=True, text=True, check=True).stderr
    registers = re.findall(r"Used (\d+) registers", log)
    spills = re.findall(r"(\d+) bytes spill stores", log)
    if not registers:
        raise RuntimeError(f"no ptxas register count for sm_{arch}:\n{log}")
    return int(registers[-1]), int(spills[-1]) if spills else 0


def compile_case(case: CompileCase, arch: int) -> dict:
    """``{'shared', 'registers', 'spills'}`` of ``case`` compiled for ``sm_<arch>``."""
    if os.environ.get("TRITON_INTERPRET", "0") == "1":
        raise RuntimeError("compiling needs TRITON_INTERPRET unset before the kernels are imported")
    signature = {**case.signature, **{k: "constexpr" for k in case.constexprs}}
    compiled = triton.compile(ASTSource(fn=case.kernel, signature=signature, constexprs=case.constexprs),
                              target=GPUTarget("cuda", arch, 32),
                              options={"num_warps": case.num_warps, "num_stages": case.num_stages, **case.options})
    registers, spills = ptxas_usage(compiled.asm["ptx"], arch)
    return {"shared": compiled.metadata.shared, "registers": registers, "spills": spills}


def _compile_task(task):
    name, arch = task
    return name, arch, compile_case(all_cases()[name], arch)


def measure(names, archs, jobs: int, on_row=None) -> dict[str, dict]:
    """``{row name: {'sm_<arch>': resources}}`` of the cases ``names`` compiled in ``jobs`` processes;
    ``on_row(table)`` after each row is complete."""
    tasks = [(name, arch) for name in names for arch in archs]
    table: dict[str, dict] = {}
    start = time.time()
    with ProcessPoolExecutor(jobs, mp_context=get_context("fork")) as pool:
        for done, (name, arch, resources) in enumerate(pool.map(_compile_task, tasks, chunksize=1), 1):
            table.setdefault(name, {})[f"sm_{arch}"] = resources
            if on_row is not None and len(table[name]) == len(archs):
                on_row(table)
            if done % 50 == 0:
                print(f"{done}/{len(tasks)} compiled, {time.time() - start:.0f} s", file=sys.stderr)
    return table


def _document(every: dict[str, CompileCase], hashes: dict[str, str], sources: dict[str, dict]) -> dict:
    """The table's file: every row whose source row (itself, or its ``same_as``) is in ``sources``
    (``{name: {'sm_<compiled arch>': ...}}``), sm_89 and the like copied from their architecture."""
    rows = {}
    for name, case in every.items():
        row = sources.get(case.same_as or name)
        if row is not None:
            row = {**row, **{f"sm_{a}": row[f"sm_{b}"] for a, b in ARCH_SAME_AS.items()}}
            rows[name] = {f"sm_{a}": row[f"sm_{a}"] for a in ARCHS}
    return {"triton": triton.__version__, "limits": SHARED_MEMORY_LIMIT,
            "hashes": {name: hashes[name] for name in rows}, "rows": rows}


def regenerate(jobs: int, full: bool = False) -> tuple[dict, list[str]]:
    """Writes the table of every case to :data:`RESOURCES_PATH`: rows whose hash the file has
    kept (all of them recompiled when ``full``), the others compiled (the file is rewritten after
    each row, so an interrupted run keeps what it compiled). Returns ``(the file's document, the
    compiled row names)``."""
    old = json.loads(RESOURCES_PATH.read_text()) if RESOURCES_PATH.exists() and not full else {}
    old_rows, old_hashes = old.get("rows", {}), old.get("hashes", {})
    every = all_cases()
    unknown = {case.same_as for case in every.values() if case.same_as} - set(every)
    if unknown:
        raise ValueError(f"same_as names no compile case: {sorted(unknown)}")
    hashes = {name: case_hash(every[case.same_as or name]) for name, case in every.items()}
    old_by_hash = {old_hashes[name]: row for name, row in old_rows.items() if name in old_hashes}
    kept = {name: old_by_hash[hashes[name]] for name, case in every.items()
            if not case.same_as and hashes[name] in old_by_hash}  # a renamed row too
    stale = [name for name, case in every.items() if not case.same_as and name not in kept]

    def save(measured):
        RESOURCES_PATH.write_text(json.dumps(_document(every, hashes, {**kept, **measured}), indent=1) + "\n")

    measured = measure(stale, [a for a in ARCHS if a not in ARCH_SAME_AS], jobs, on_row=save)
    document = _document(every, hashes, {**kept, **measured})
    RESOURCES_PATH.write_text(json.dumps(document, indent=1) + "\n")
    return document, stale


def markdown(rows: dict[str, dict], every: dict[str, CompileCase]) -> str:
    """The docs table: one line per compiled case (not the ``same_as`` ones), each column's four
    values for sm_80/86/89/90."""
    archs = "/".join(str(a) for a in ARCHS)
    lines = [f"| kernel | variant | configuration | shared bytes ({archs}) | registers | spill bytes | fits |",
             "|---|---|---|---|---|---|---|"]
    for name, row in rows.items():
        if every[name].same_as:
            continue
        kernel, variant, config = name.split(" | ")
        per_arch = [row[f"sm_{a}"] for a in ARCHS]
        fits = "".join("y" if r["shared"] <= SHARED_MEMORY_LIMIT[a] else "n" for r, a in zip(per_arch, ARCHS))
        cells = ["/".join(str(r[key]) for r in per_arch) for key in ("shared", "registers", "spills")]
        lines.append(f"| `{kernel}` | {variant} | {config} | {' | '.join(cells)} | {fits} |")
    return "\n".join(lines)


def write_docs(rows: dict[str, dict], every: dict[str, CompileCase], docs: Path = DOCS) -> None:
    text = docs.read_text()
    if BEGIN not in text or END not in text:
        raise ValueError(f"{docs} has no {BEGIN} ... {END} section")
    head, rest = text.split(BEGIN)
    _, tail = rest.split(END)
    aliases = sorted({(name.split(" | ")[0], name.split(" | ")[1], every[name].same_as.split(" | ")[1])
                      for name in rows if every[name].same_as})
    same = "; ".join(f"`{k.rsplit('.', 1)[-1]}` {v} as {s}" for k, v, s in aliases)
    body = (f"\nTriton {triton.__version__}, written by `python tools/kernel_resources.py`. Limits (bytes of "
            f"shared memory per block): " + ", ".join(f"sm_{a} {v:,}" for a, v in SHARED_MEMORY_LIMIT.items())
            + ". `fits`: y/n for sm_80, sm_86, sm_89, sm_90. "
            + "; ".join(f"sm_{a} takes sm_{b}'s numbers (same limit and PTX rules; a test compiles a sample)"
                        for a, b in ARCH_SAME_AS.items())
            + (f". Rows not compiled, with the numbers of the same layout (in the table the pruning reads, not "
               f"listed here): {same}" if same else "") + ".\n\n" + markdown(rows, every) + "\n")
    docs.write_text(head + BEGIN + body + END + tail)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", type=int, default=os.cpu_count())
    parser.add_argument("--full", action="store_true", help="compile every row again, unchanged or not")
    parser.add_argument("--rows", nargs="+", help="compile only these rows and print them as JSON; write nothing")
    parser.add_argument("--archs", nargs="+", type=int, default=list(ARCHS))
    args = parser.parse_args(argv)
    start = time.time()
    if args.rows:
        unknown = [name for name in args.rows if name not in all_cases()]
        if unknown:
            raise SystemExit(f"no compile case named {unknown}")
        print(json.dumps(measure(args.rows, args.archs, args.jobs)))
        return
    document, compiled = regenerate(args.jobs, args.full)
    write_docs(document["rows"], all_cases())
    by_kernel: dict[str, int] = {}
    for name in compiled:
        by_kernel[name.split(" | ")[0]] = by_kernel.get(name.split(" | ")[0], 0) + 1
    print(f"{len(document['rows'])} rows, {len(compiled)} compiled ({by_kernel or 'none'}) in "
          f"{time.time() - start:.0f} s: {RESOURCES_PATH}, {DOCS}")
