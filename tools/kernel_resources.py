"""Shared memory, registers and spills of every Triton kernel configuration on every supported
architecture, without a GPU.

    python tools/kernel_resources.py [--jobs N]
    python tools/kernel_resources.py --rows NAME [NAME ...] --archs 90   # print, write nothing

Compiles each kernel module's ``compile_cases()`` (``KERNEL_MODULES``; the cases of every
configuration its autotuner may choose) with ``triton.compile`` for sm_80, sm_86, sm_89 and sm_90
in a process pool, reading ``metadata.shared`` and ptxas's register and spill counts. Writes the
table the pruning reads (``kernels/common/resources.json``) and the marked section of
``docs/benchmarks.md``. ``--rows``: compile only the named rows (``'<kernel> | <variant> |
<config>'``) and print their resources as JSON.
"""
from __future__ import annotations

import argparse
import functools
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

os.environ.pop("TRITON_INTERPRET", None)  # the interpreter replaces @triton.jit at import time

import triton
from triton import knobs
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

from ppma.kernels.common.tuning import (
    ARCHS,
    KERNEL_MODULES,
    RESOURCES_PATH,
    SHARED_MEMORY_LIMIT,
)

DOCS = Path(__file__).resolve().parents[1] / "docs" / "benchmarks.md"
BEGIN, END = "<!-- kernel_resources: begin -->", "<!-- kernel_resources: end -->"


@functools.cache
def cases(module: str) -> dict:
    """``{row name: CompileCase}`` of ``ppma.kernels.<module>``."""
    return {c.name: c for c in importlib.import_module(f"ppma.kernels.{module}").compile_cases()}


def all_rows() -> dict[str, str]:
    """``{row name: module}`` of every kernel module."""
    return {name: module for module in KERNEL_MODULES for name in cases(module)}


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


def compile_case(case, arch: int) -> dict:
    """``{'shared', 'registers', 'spills'}`` of a ``CompileCase`` compiled for ``sm_<arch>``."""
    signature = {**case.signature, **{k: "constexpr" for k in case.constexprs}}
    compiled = triton.compile(ASTSource(fn=case.kernel, signature=signature, constexprs=case.constexprs),
                              target=GPUTarget("cuda", arch, 32),
                              options={"num_warps": case.num_warps, "num_stages": case.num_stages, **case.options})
    registers, spills = ptxas_usage(compiled.asm["ptx"], arch)
    return {"shared": compiled.metadata.shared, "registers": registers, "spills": spills}


def _compile_task(task):
    module, name, arch = task
    return name, arch, compile_case(cases(module)[name], arch)


def measure(rows: dict[str, str], archs, jobs: int) -> dict[str, dict]:
    """``{row name: {'sm_<arch>': resources}}`` for ``rows`` (name -> module), ``jobs`` processes."""
    tasks = [(module, name, arch) for name, module in rows.items() for arch in archs]
    table: dict[str, dict] = {name: {} for name in rows}
    start = time.time()
    with ProcessPoolExecutor(jobs, mp_context=get_context("fork")) as pool:
        for done, (name, arch, resources) in enumerate(pool.map(_compile_task, tasks, chunksize=1), 1):
            table[name][f"sm_{arch}"] = resources
            if done % 50 == 0:
                print(f"{done}/{len(tasks)} compiled, {time.time() - start:.0f} s", file=sys.stderr)
    return table


def markdown(table: dict[str, dict]) -> str:
    """The docs table: one row per case, each column's four values for sm_80/86/89/90."""
    archs = "/".join(str(a) for a in ARCHS)
    lines = [f"| kernel | variant | configuration | shared bytes ({archs}) | registers | spill bytes | fits |",
             "|---|---|---|---|---|---|---|"]
    for name, row in table.items():
        kernel, variant, config = name.split(" | ")
        per_arch = [row[f"sm_{a}"] for a in ARCHS]
        fits = "".join("y" if r["shared"] <= SHARED_MEMORY_LIMIT[a] else "n" for r, a in zip(per_arch, ARCHS))
        cells = ["/".join(str(r[key]) for r in per_arch) for key in ("shared", "registers", "spills")]
        lines.append(f"| `{kernel}` | {variant} | {config} | {' | '.join(cells)} | {fits} |")
    return "\n".join(lines)


def write_docs(table: dict[str, dict]) -> None:
    text = DOCS.read_text()
    head, rest = text.split(BEGIN)
    _, tail = rest.split(END)
    body = (f"\nTriton {triton.__version__}, written by `python tools/kernel_resources.py`. Limits (bytes of "
            f"shared memory per block): " + ", ".join(f"sm_{a} {v:,}" for a, v in SHARED_MEMORY_LIMIT.items())
            + ". `fits`: y/n for sm_80, sm_86, sm_89, sm_90.\n\n" + markdown(table) + "\n")
    DOCS.write_text(head + BEGIN + body + END + tail)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", type=int, default=os.cpu_count())
    parser.add_argument("--rows", nargs="+", help="compile only these rows and print them as JSON")
    parser.add_argument("--archs", nargs="+", type=int, default=list(ARCHS))
    args = parser.parse_args(argv)
    rows = all_rows()
    if args.rows:
        unknown = [name for name in args.rows if name not in rows]
        if unknown:
            raise SystemExit(f"no compile case named {unknown}")
        print(json.dumps(measure({name: rows[name] for name in args.rows}, args.archs, args.jobs)))
        return
    table = measure(rows, args.archs, args.jobs)
    RESOURCES_PATH.write_text(json.dumps({"triton": triton.__version__, "limits": SHARED_MEMORY_LIMIT,
                                          "rows": table}, indent=1) + "\n")
    write_docs(table)
    print(f"{len(table)} cases x {len(args.archs)} architectures: {RESOURCES_PATH}, {DOCS}")


if __name__ == "__main__":
    main()
