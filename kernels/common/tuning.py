"""Launch configurations of the Triton kernels: autotuning over a small set, and the facts that
say which configuration fits which GPU.

- Every kernel launches through :func:`autotune` (``triton.autotune``'s arguments plus a
  ``variant`` function). Under Triton's CPU interpreter only the first configuration runs, so the
  tests stay fast; on a GPU the first call with a new key times every configuration that fits and
  keeps the fastest (docs/autotuning.md). The key gets every constexpr the launcher passes, so a
  choice made for one variant (dtype, 2-D/3-D, ...) is never reused for another.
- A *variant* is what the launcher fixes: the kernel's dtypes and launch constexprs, named by the
  kernel's ``variant(args)`` (``args``: argument name -> Triton type such as ``'*fp16'`` for a
  pointer, the value for a constexpr). The configuration is what the autotuner varies.
- :data:`SHARED_MEMORY_LIMIT`: the most shared memory one program may use, per architecture.
  :mod:`.resources` (``tools/kernel_resources.py``) compiles every kernel module's ``compile_cases()``
  for every architecture in :data:`ARCHS` and writes :data:`RESOURCES_PATH`; :func:`fitting_configs` reads
  it to prune, before timing, the configurations that do not fit the running GPU.
"""
from __future__ import annotations

import functools
import inspect
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import torch
import triton
from triton.runtime.jit import JITFunction

# Opt-in shared memory per thread block (bytes), by compute capability (major * 10 + minor).
SHARED_MEMORY_LIMIT = {80: 166_912, 86: 101_376, 89: 101_376, 90: 232_448}
ARCHS = tuple(SHARED_MEMORY_LIMIT)
RESOURCES_PATH = Path(__file__).with_name("resources.json")
# The modules (below ``ppma.kernels``) whose kernels the table covers: each has ``compile_cases()``.
KERNEL_MODULES = ("polyline_attention.vanilla", "polyline_attention.decays", "polyline_attention.line",
                  "polyline_attention.whole_line", "polyline_decays.projection", "rotary_qk.rotate",
                  "selective_scan.scan",
                  "polyline_scan.decay_scan", "polyline_scan.plane_scan", "polyline_linear_attention.tiled",
                  "depthwise_conv.conv")

TRITON_TYPES = {torch.float32: "fp32", torch.float16: "fp16", torch.bfloat16: "bf16", torch.float64: "fp64"}


@dataclass(frozen=True)
class CompileCase:
    """One compilation of ``kernel`` (the ``@triton.jit`` function, not its autotuner).

    ``signature``: every non-constexpr argument's Triton type (``'*bf16'``, ``'i32'``, ...);
    ``constexprs``: every constexpr argument's value; ``name``: what the resource table calls it,
    ``'<kernel> | <variant> | <config>'`` (:func:`cases_of` builds it); ``same_as``: the name of a
    case with the same layout (fp16 as bf16) whose numbers this row takes, uncompiled.
    """

    name: str
    kernel: Any
    signature: dict[str, str]
    constexprs: dict[str, Any]
    num_warps: int = 4
    num_stages: int = 2
    options: dict[str, Any] = field(default_factory=dict)
    same_as: str | None = None


@dataclass(frozen=True)
class Tuning:
    """What :func:`autotune` attaches to a kernel (as ``.tuning``): its table name, every
    configuration (also under the interpreter, which runs the first), its variant function and
    whether launches keep the configurations that spill least (:func:`least_spilling`)."""

    kernel_id: str
    configs: tuple[triton.Config, ...]
    variant: Callable[[dict[str, Any]], str]
    spill_free: bool = False


def kernel_id(fn) -> str:
    """``'<package>.<module>.<function>'`` below ``kernels``, e.g. ``'polyline_attention.vanilla._fwd_kernel'``."""
    module = fn.fn.__module__.split("kernels.", 1)[-1]
    return f"{module}.{fn.fn.__name__}"


def config_label(config: triton.Config) -> str:
    """``'BLOCK_M=32 BLOCK_N=32 w4 s1'``: a configuration's tuned constexprs, warps and stages."""
    tuned = " ".join(f"{k}={v}" for k, v in sorted(config.kwargs.items()))
    return f"{tuned} w{config.num_warps} s{config.num_stages}".strip()


def row_name(kernel: str, variant: str, config: triton.Config) -> str:
    return f"{kernel} | {variant} | {config_label(config)}"


def _parameters(fn, constexpr: bool) -> list[str]:
    """The names of the constexpr (or the other) parameters of the ``@triton.jit`` function ``fn``."""
    params = inspect.signature(fn.fn).parameters.values()
    return [p.name for p in params if ("constexpr" in str(p.annotation)) == constexpr]


def _default_variant(constexprs: tuple[str, ...], args: dict[str, Any]) -> str:
    """``'fp16 fp16 fp32 IS_3D=True ...'``: every pointer's type, then the launch constexprs."""
    pointers = [a[1:] for a in args.values() if isinstance(a, str) and a.startswith("*")]
    return " ".join(pointers + [f"{k}={args[k]}" for k in constexprs if k in args])


def autotune(configs: list[triton.Config], key: list[str], variant: Callable[[dict[str, Any]], str] | None = None,
             prune: Callable | None = None, spill_free: bool = False, **kwargs):
    """``triton.autotune(configs, key, **kwargs)`` that prunes, before timing, the configurations
    whose shared memory does not fit the GPU (:func:`fitting_configs`); under the interpreter,
    ``configs[0]`` alone. ``variant``: names the launch's variant from its arguments (module doc;
    by default every pointer's type and every launch constexpr). ``prune``: the kernel's own
    ``early_config_prune`` (e.g. by registers at the launch's tile), applied first (so a table
    without the launch's rows keeps the first configuration it leaves). ``spill_free``: then keep
    the configurations that spill the fewest register bytes on the GPU (:func:`least_spilling`)."""

    def decorate(fn):
        tuned_names = {name for config in configs for name in config.kwargs}
        launch_constexprs = tuple(n for n in _parameters(fn, constexpr=True) if n not in tuned_names)
        tuning = Tuning(kernel_id(fn), tuple(configs), variant or functools.partial(_default_variant, launch_constexprs),
                        spill_free)
        if not isinstance(fn, JITFunction):  # Triton interprets it (decided by @triton.jit)
            tuned = triton.autotune(configs=list(configs[:1]), key=key, **kwargs)(fn)
        else:
            early_prune = functools.partial(launch_prune, tuning, prune)
            tuned = triton.autotune(configs=list(configs), key=[*key, *launch_constexprs],
                                    prune_configs_by={"early_config_prune": early_prune}, **kwargs)(fn)
        tuned.tuning = tuning
        return tuned

    return decorate


def launch_types(args: dict[str, Any]) -> dict[str, Any]:
    """Launch arguments as a variant function sees them: tensors -> ``'*<triton type>'``."""
    return {name: f"*{TRITON_TYPES[a.dtype]}" if isinstance(a, torch.Tensor) else a for name, a in args.items()}


def launch_context(nargs: dict[str, Any], kwargs: dict[str, Any]) -> tuple[dict[str, Any], tuple[int, int]]:
    """What an ``early_config_prune`` needs of a launch: its arguments as a variant function sees
    them (:func:`launch_types`) and the compute capability of its tensors' GPU."""
    args = {**nargs, **kwargs}
    device = next(a.device for a in args.values() if isinstance(a, torch.Tensor))
    return launch_types(args), torch.cuda.get_device_capability(device)


def launch_prune(tuning: Tuning, prune: Callable | None, configs, nargs, **launch):
    """The ``early_config_prune`` of :func:`autotune`: the kernel's own ``prune``, then (for a
    ``spill_free`` kernel) :func:`least_spilling`, then the configurations that fit the launch's GPU."""
    types, capability = launch_context(nargs, launch)
    variant = tuning.variant(types)
    if prune is not None:
        configs = prune(configs, nargs, **launch)
    if tuning.spill_free:
        configs = least_spilling(tuning, variant, configs, capability)
    return fitting_configs(tuning, variant, configs, capability)


@functools.cache
def resource_table() -> dict[str, dict[str, dict]]:
    """``{row name: {'sm_80': {'shared': bytes, 'registers': n, 'spills': bytes}, ...}}`` from
    :data:`RESOURCES_PATH` (empty when the file is missing)."""
    if not RESOURCES_PATH.exists():
        return {}
    return json.loads(RESOURCES_PATH.read_text())["rows"]


def table_rows(kernel_id: str, variant: str, configs) -> list[dict | None]:
    """The resource table's row of each of ``configs`` for ``variant`` (None where it has none)."""
    table = resource_table()
    return [table.get(row_name(kernel_id, variant, c)) for c in configs]


def arch_of(capability: tuple[int, int]) -> int:
    return capability[0] * 10 + capability[1]


def fits(row: dict, arch: int) -> bool:
    return row[f"sm_{arch}"]["shared"] <= SHARED_MEMORY_LIMIT[arch]


def fitting_configs(tuning: Tuning, variant: str, configs, capability: tuple[int, int]) -> list[triton.Config]:
    """The ``configs`` of ``variant`` whose shared memory fits a GPU of compute ``capability``,
    by the resource table. On an architecture the table lacks, or for a variant it lacks, the
    first configuration alone (the smallest: every kernel lists it first). Raises when none fits
    (the table's test rules that out on every architecture it covers)."""
    arch, rows = arch_of(capability), table_rows(tuning.kernel_id, variant, configs)
    if arch not in ARCHS or any(row is None for row in rows):
        return list(configs[:1])
    kept = [c for c, row in zip(configs, rows) if fits(row, arch)]
    if not kept:
        raise RuntimeError(f"no launch configuration of {tuning.kernel_id} ({variant}) fits sm_{arch}'s "
                           f"{SHARED_MEMORY_LIMIT[arch]:,} bytes of shared memory; use PPMA_BACKEND=torch")
    return kept


def least_spilling(tuning: Tuning, variant: str, configs, capability: tuple[int, int]) -> list[triton.Config]:
    """Of ``configs`` of ``variant``, those whose rows in the resource table spill the fewest
    register bytes on a GPU of compute ``capability``: the ones that compile without spills
    wherever one does. The configurations without a row are dropped; with none left (an
    architecture or a variant the table lacks), the first configuration."""
    arch = f"sm_{arch_of(capability)}"
    rows = zip(configs, table_rows(tuning.kernel_id, variant, configs))
    spills = [(c, row[arch]["spills"]) for c, row in rows if row is not None and arch in row]
    if not spills:
        return list(configs[:1])
    least = min(n for _, n in spills)
    return [c for c, n in spills if n == least]


def bucket(value: int, bounds: tuple[int, ...]) -> str:
    """``'<=b'`` for the smallest of the increasing ``bounds`` that is >= ``value``, ``'>last'``
    past the last: a variant of the resource table stands for every launch up to its bound."""
    return next((f"<={b}" for b in bounds if value <= b), f">{bounds[-1]}")


def signature(tuned, pointers: dict[str, str]) -> dict[str, str]:
    """The Triton types of the non-constexpr arguments of the autotuned kernel ``tuned``: the
    pointers named in ``pointers`` (``{'Q': '*fp16', ...}``), every other one ``'i32'``."""
    return {name: pointers.get(name, "i32") for name in _parameters(tuned.fn, constexpr=False)}


def cases_of(tuned, signature: dict[str, str], constexprs: dict[str, Any],
             config_constexprs: Callable[[triton.Config], dict[str, Any]] | None = None,
             fp16_as_bf16: bool = False) -> list[CompileCase]:
    """One :class:`CompileCase` per configuration of the autotuned kernel ``tuned`` for the launch
    ``signature`` (every pointer and integer argument's Triton type) and launch ``constexprs``.
    ``config_constexprs(config)``: constexprs that depend on the configuration (e.g. the tile its
    register budget allows); a configuration's ``maxnreg`` goes into the compile options.
    ``fp16_as_bf16``: an fp16 variant takes the rows of its bf16 twin (same layout), uncompiled."""
    tuning: Tuning = tuned.tuning
    variant = tuning.variant({**signature, **constexprs})
    twin = variant.replace("fp16", "bf16", 1) if fp16_as_bf16 else variant
    cases = []
    for c in tuning.configs:
        extra = config_constexprs(c) if config_constexprs else {}
        cases.append(CompileCase(row_name(tuning.kernel_id, variant, c), tuned.fn, dict(signature),
                                 {**constexprs, **extra, **c.kwargs}, c.num_warps, c.num_stages,
                                 {"maxnreg": c.maxnreg} if c.maxnreg else {},
                                 row_name(tuning.kernel_id, twin, c) if twin != variant else None))
    return cases


def _rows_of(kernel_modules: tuple[str, ...]) -> dict[str, dict]:
    """The table's rows of the kernels defined in ``kernel_modules`` (``'polyline_attention.vanilla'``, ...)."""
    return {name: row for name, row in resource_table().items()
            if name.split(" | ")[0].rsplit(".", 1)[0] in kernel_modules}


def pruning_note(kernel_modules: tuple[str, ...], capability: tuple[int, int]) -> str | None:
    """What the table says about the kernels of ``kernel_modules`` on a GPU of ``capability``: how
    many configurations are pruned there, or that the table does not cover it; None when every
    configuration fits."""
    arch, rows = arch_of(capability), _rows_of(kernel_modules)
    if arch not in ARCHS:
        return (f"sm_{arch} is not in the resource table ({', '.join(f'sm_{a}' for a in ARCHS)}): "
                f"each kernel runs its first (smallest) configuration, untuned")
    pruned = [name for name, row in rows.items() if not fits(row, arch)]
    if not pruned:
        return None
    return (f"{len(pruned)} of {len(rows)} kernel configurations need more than sm_{arch}'s "
            f"{SHARED_MEMORY_LIMIT[arch]:,} bytes of shared memory: pruned, never tried")


@functools.cache
def unfit_variants(kernel_modules: tuple[str, ...], capability: tuple[int, int]) -> list[str]:
    """``'<kernel> | <variant>'`` of ``kernel_modules`` that no configuration fits on ``capability``
    (cached: every op call asks)."""
    arch = arch_of(capability)
    if arch not in ARCHS:
        return []
    fitting: dict[str, bool] = {}
    for name, row in _rows_of(kernel_modules).items():
        variant = name.rsplit(" | ", 1)[0]
        fitting[variant] = fitting.get(variant, False) or fits(row, arch)
    return [variant for variant, ok in fitting.items() if not ok]
