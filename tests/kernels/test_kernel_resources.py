"""The resource table (``kernels/common/resources.json``, written by ``tools/kernel_resources.py``
through :mod:`ppma.kernels.common.resources`) and the pruning it drives: every kernel module's
compile cases are in it, every launch's configurations too, each kernel variant has a
configuration that fits every architecture, launches on sm_80 and sm_90 keep only configurations
without register spills, pruning drops exactly the ones that do not fit, and a
few rows compiled again (those of the vanilla launches that ran out of shared memory on an H200,
one of every other kernel, and samples of the rows copied from another dtype or architecture)
give the table's numbers.

Compiling needs no GPU (``triton.compile`` with an explicit target), but runs in a subprocess:
``TRITON_INTERPRET=1`` replaces ``@triton.jit`` at import time.
"""
from __future__ import annotations

import importlib
import json
import os
import pkgutil

import pytest
import torch
from compile_only import run_compile_script, same_minor, table_triton

pytest.importorskip("triton", reason="the Triton kernels need the 'triton' package")

import triton
import triton.language as tl
from triton.runtime.autotuner import Autotuner

import ppma.kernels
from ppma.kernels.common import tuning
from ppma.kernels.depthwise_conv import conv
from ppma.kernels.polyline_attention import criss_cross, vanilla
from ppma.kernels.polyline_scan import decay_scan
from ppma.kernels.selective_scan import scan

# Every module below ppma.kernels with compile cases, and every autotuned kernel of those.
MODULES = {info.name.split("kernels.", 1)[1]: importlib.import_module(info.name)
           for info in pkgutil.walk_packages(ppma.kernels.__path__, "ppma.kernels.")}
MODULES = {name: module for name, module in MODULES.items()  # defined there, not re-exported
           if getattr(getattr(module, "compile_cases", None), "__module__", None) == module.__name__}
TUNED = {value.tuning.kernel_id: value for module in MODULES.values() for value in vars(module).values()
         if isinstance(getattr(value, "tuning", None), tuning.Tuning)
         and value.tuning.kernel_id.rsplit(".", 1)[0] == module.__name__.split("kernels.", 1)[1]}


@pytest.fixture(scope="module")
def table():
    rows = tuning.resource_table()
    assert rows, f"{tuning.RESOURCES_PATH} is missing: run tools/kernel_resources.py"
    return rows


def variants(table):
    """``{(kernel id, variant): [row names in configuration order]}``."""
    groups = {}
    for name in table:
        kernel, variant, _ = name.split(" | ")
        groups.setdefault((kernel, variant), []).append(name)
    return groups


def test_the_table_has_every_compile_case_on_every_architecture(table):
    assert set(tuning.KERNEL_MODULES) == set(MODULES), "a kernel module with compile_cases() is not in KERNEL_MODULES"
    cases = [case for module in MODULES.values() for case in module.compile_cases()]
    assert sorted(case.name for case in cases) == sorted(table), "the table is stale: run tools/kernel_resources.py"
    assert {name.split(" | ")[0] for name in table} == set(TUNED), "a tuned kernel has no compile case"
    for case in cases:
        assert sorted(table[case.name]) == sorted(f"sm_{a}" for a in tuning.ARCHS), case.name
        if case.same_as:  # uncompiled: the numbers of a case of the same kernel and configuration
            assert table[case.name] == table[case.same_as], case.name
            assert case.name.split(" | ")[::2] == case.same_as.split(" | ")[::2], case.name


def test_launches_compile_without_spills_on_sm80_and_sm90(table):
    """Issue 33's compile-only report, clean: on sm_80 and sm_90 every configuration a launch may
    run compiles without register spills. A ``spill_free`` kernel keeps, per launch, the
    configurations that spill least (:func:`tuning.least_spilling`): each of its variants needs one
    without spills there; every configuration of the other kernels must have none."""
    for (kernel, variant), names in variants(table).items():
        for arch in ("sm_80", "sm_90"):
            spills = {name.split(" | ")[2]: table[name][arch]["spills"] for name in names}
            if TUNED[kernel].tuning.spill_free:
                assert min(spills.values()) == 0, f"{kernel} | {variant}: every configuration spills on {arch}: {spills}"
            else:
                assert not any(spills.values()), f"{kernel} | {variant} spills on {arch}: {spills}"


def test_launches_run_the_configurations_that_spill_least(resource_table):
    """On a GPU the autotuner first keeps the configurations whose resource-table rows spill the
    fewest bytes on that architecture (none, where one compiles without spills); configurations
    without rows are dropped, and with no row at all (an architecture or a head dim the table
    lacks) the first configuration runs."""
    kernel = vanilla._bwd_dkdv_kernel
    configs = list(kernel.tuning.configs[:2])
    variant = "bf16 3d official d<=32 cols16"
    names = [tuning.row_name(kernel.tuning.kernel_id, variant, c) for c in configs]

    def row(sm80, sm90):
        return {"sm_80": {"shared": 0, "registers": 255, "spills": sm80},
                "sm_90": {"shared": 0, "registers": 255, "spills": sm90}}

    resource_table({names[0]: row(72, 0), names[1]: row(32, 0)})
    assert tuning.least_spilling(kernel.tuning, variant, configs, (9, 0)) == configs  # both clean
    assert tuning.least_spilling(kernel.tuning, variant, configs, (8, 0)) == [configs[1]]  # the least
    resource_table({names[1]: row(0, 8)})
    assert tuning.least_spilling(kernel.tuning, variant, configs, (8, 0)) == [configs[1]]  # no row: dropped
    assert tuning.least_spilling(kernel.tuning, "bf16 3d official d>128 cols16", configs, (9, 0)) == [configs[0]]
    assert tuning.least_spilling(kernel.tuning, variant, configs, (12, 0)) == [configs[0]]


SOURCE_KEYS = r"""
import importlib.util, json, pathlib, tempfile
from ppma.kernels.common.resources import source_key

MODULE = '''
import triton
import triton.language as tl

SCALE: tl.constexpr = 2


@triton.jit
def _helper(x):
    return x + 1


@triton.jit
def kernel(X):
    tl.store(X, _helper(tl.load(X)) * SCALE)
'''
variants = {"base": MODULE, "lines above": "\n\n# a comment\n" + MODULE,
            "helper edited": MODULE.replace("x + 1", "x + 2"), "constexpr edited": MODULE.replace("= 2", "= 3")}
keys = {}
for name, text in variants.items():
    path = pathlib.Path(tempfile.mkdtemp()) / "kernel_module.py"
    path.write_text(text)
    spec = importlib.util.spec_from_file_location(f"kernel_module_{len(keys)}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    keys[name] = source_key(module.kernel)
print(json.dumps(keys))
"""


def test_row_hashes_see_the_code_but_not_its_line_numbers():
    """A row's hash (:func:`resources.source_key`) stays when lines are added above a kernel (the
    table needs no recompiles for that; Triton's ``cache_key`` changes) and changes with a
    ``@triton.jit`` helper's code or a ``tl.constexpr`` global the kernel uses."""
    keys = run_compile_script(SOURCE_KEYS)
    assert keys["lines above"] == keys["base"]
    assert keys["helper edited"] != keys["base"]
    assert keys["constexpr edited"] != keys["base"]


def test_the_first_configuration_of_every_variant_fits_every_architecture(table):
    """So something always fits, and a configuration left alone after pruning (launched untimed)
    is the first one."""
    for names in variants(table).values():
        for arch in tuning.ARCHS:
            assert tuning.fits(table[names[0]], arch), f"{names[0]} does not fit sm_{arch}"


@pytest.fixture
def launches(monkeypatch):
    """Record the variant of every autotuned launch: ``[(Tuning, variant name)]``."""
    seen = []
    run = Autotuner.run

    def recording_run(self, *args, **kwargs):
        named = dict(zip(self.arg_names, args))
        named.update({k: v for k, v in kwargs.items() if k in self.arg_names})
        seen.append((self.tuning, self.tuning.variant(tuning.launch_types(named))))
        return run(self, *args, **kwargs)

    monkeypatch.setattr(Autotuner, "run", recording_run)
    return seen


@pytest.mark.skipif(os.environ.get("TRITON_INTERPRET", "0") != "1", reason="launches through the CPU interpreter")
def test_every_launch_of_the_model_shapes_is_in_the_table(table, launches):
    """The launchers' own variants (head dims 16 and 20, 2-D and 3-D, fp32 and fp16, both forms
    and the linear kind, whole and tiled criss-cross lines, 1 and 16 states, fp16 and fp64 scans,
    fp32 depthwise convs on 7, 14 and 56 columns) name rows of the table, with every configuration."""
    for dtype, grid, d in ((torch.float32, (2, 3, 4), 16), (torch.float16, (3, 5), 20)):
        q, k, v = (torch.randn(1, 1, *grid, d).to(dtype) for _ in range(3))
        decays = [-torch.rand(1, 1, *grid) for _ in grid] + [None] * (3 - len(grid))
        for form in ("official", "paper"):
            out, residuals = vanilla.vanilla_attention_fwd(q, k, v, *decays[:3], form=form)
            vanilla.vanilla_attention_bwd(out, out, residuals, q, k, v, *decays[:3], form=form)
        out, num = vanilla.linear_attention_quadratic_fwd(q.abs(), k.abs(), v, *decays[:3])  # the linear kind
        vanilla.linear_attention_quadratic_bwd(out, num, q.abs(), k.abs(), v, *decays[:3])
        out, residuals = criss_cross.criss_cross_attention_fwd(q, k, v, *decays[:3])  # whole lines
        criss_cross.criss_cross_attention_bwd(out, q, k, v, *decays[:3], residuals=residuals)
        rows = [torch.randn(1, 1, 1, 65, d).to(dtype) for _ in range(3)]  # too long: the tiled line kernels
        row_decays = [-torch.rand(1, 1, 1, 65) for _ in range(2)]
        out, residuals = criss_cross.criss_cross_attention_fwd(*rows, *row_decays)
        criss_cross.criss_cross_attention_bwd(out, *rows, *row_decays, residuals=residuals)
    for n_state, dtype in ((1, torch.float16), (16, torch.float32)):
        u = torch.randn(1, 4, 5).to(dtype)
        args = (u, u.float(), -torch.rand(4, n_state), torch.randn(1, n_state, 5), torch.randn(1, n_state, 5))
        y, _, states = scan.selective_scan_fwd(*args)
        scan.selective_scan_bwd(y, None, states, *args)
    for dtype in (torch.float16, torch.float64):
        x, ld = torch.randn(1, 1, 1, 3, 4, 2).to(dtype), -torch.rand(1, 1, 1, 3, 4)
        decay_scan.decay_scan_fwd(x, ld, 3, dtype)
        decay_scan.decay_scan_bwd(x, x, ld, 3, dtype)
    for width, k, add_input in ((7, 3, True), (14, 3, False), (56, 5, False)):  # PPMA-T's grids, 64 channels
        x, weight = torch.randn(1, 2, width, 64), torch.randn(64, 1, k, k)
        y = conv.forward(x, weight, weight[:, 0, 0, 0], add_input, torch.float32, torch.float32)
        conv.backward(y, x, weight, weight[:, 0, 0, 0], add_input, torch.float32)
    launched_modules = ("polyline_attention.vanilla", "polyline_attention.decays", "polyline_attention.line",
                        "polyline_attention.whole_line", "selective_scan.scan", "polyline_scan.decay_scan",
                        "depthwise_conv.conv")
    assert {t.kernel_id for t, _ in launches} == {k for k in TUNED if k.rsplit(".", 1)[0] in launched_modules}
    for t, variant in launches:
        configs = t.configs
        if " cols" in variant and t.kernel_id.startswith("polyline_attention.vanilla."):  # at the head dim's tiles
            configs = vanilla.offered(configs, int(variant.split("d<=")[1].split()[0]), " linear " in variant,
                                      int(variant.split("cols")[1]))
        names = [tuning.row_name(t.kernel_id, variant, config) for config in configs]
        assert names and all(name in table for name in names), variant


def test_pruning_on_a_mocked_device_drops_exactly_what_does_not_fit(table, monkeypatch):
    for (kernel, variant), names in variants(table).items():
        t = TUNED[kernel].tuning
        # The configurations the variant has rows for: all of them, or (plane_scan, whose variant
        # names the row width) those its register pruning keeps at that width.
        configs = [c for c in t.configs if tuning.row_name(kernel, variant, c) in table]
        for arch in tuning.ARCHS:
            kept = tuning.fitting_configs(t, variant, configs, divmod(arch, 10))
            assert [tuning.row_name(kernel, variant, c) for c in kept] == [n for n in names if tuning.fits(table[n], arch)]
    # Through the autotuner's prune hook, at the H200's failing launch (3-D fp32, head dim 16).
    t = vanilla._fwd_kernel.tuning
    args = {"Q": torch.empty(1, dtype=torch.float32), "IS_3D": True, "PAPER": False, "BLOCK_D": 16, "BLOCK_DV": 16,
            "COLS": 16}
    variant = t.variant(tuning.launch_types(args))
    for capability in ((8, 0), (8, 6), (8, 9), (9, 0)):
        monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None, cc=capability: cc)
        kept = tuning.launch_prune(t, None, t.configs, {"Q": args["Q"]},
                                   **{k: v for k, v in args.items() if k != "Q"})
        arch = tuning.arch_of(capability)
        rows = [table[tuning.row_name(t.kernel_id, variant, c)][f"sm_{arch}"] for c in kept]
        assert kept and all(row["shared"] <= tuning.SHARED_MEMORY_LIMIT[arch] for row in rows)
        least = min(r[f"sm_{arch}"]["spills"] for r in tuning.table_rows(t.kernel_id, variant, t.configs) if r)
        assert all(row["spills"] == least for row in rows)
    # No table row (a head dim above 128) or an architecture the table lacks: the first configuration.
    assert tuning.fitting_configs(t, t.variant(tuning.launch_types({**args, "BLOCK_D": 256})), t.configs,
                                  (9, 0)) == [t.configs[0]]
    assert tuning.fitting_configs(t, variant, t.configs, (12, 0)) == [t.configs[0]]


@triton.jit
def _scale_kernel(x_ptr, y_ptr, n, SCALE: tl.constexpr, BLOCK: tl.constexpr):
    i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(y_ptr + i, tl.load(x_ptr + i, mask=i < n) * SCALE, mask=i < n)


def test_the_default_variant_names_a_launch_as_its_compile_case(launches):
    """A kernel given no ``variant``: its launches and its compile cases name the same rows."""
    tuned = tuning.autotune([triton.Config({"BLOCK": 16}), triton.Config({"BLOCK": 64})], key=["n"])(_scale_kernel)
    cases = tuning.cases_of(tuned, tuning.signature(tuned, {"x_ptr": "*fp16", "y_ptr": "*fp32"}), {"SCALE": 3})
    assert [c.name.split(" | ")[1] for c in cases] == ["fp16 fp32 SCALE=3"] * 2
    assert [c.constexprs for c in cases] == [{"SCALE": 3, "BLOCK": 16}, {"SCALE": 3, "BLOCK": 64}]
    if os.environ.get("TRITON_INTERPRET", "0") == "1":
        x, y = torch.arange(20, dtype=torch.float16), torch.empty(20)
        tuned[lambda meta: (triton.cdiv(20, meta["BLOCK"]),)](x, y, 20, SCALE=3)
        torch.testing.assert_close(y, x.float() * 3)
        assert launches[-1][1] == "fp16 fp32 SCALE=3"


def test_nothing_fitting_raises_a_clear_error(resource_table):
    t = vanilla._fwd_kernel.tuning
    names = [tuning.row_name(t.kernel_id, "v", c) for c in t.configs]
    huge = {f"sm_{a}": {"shared": 10**6, "registers": 0, "spills": 0} for a in tuning.ARCHS}
    resource_table(dict.fromkeys(names, huge))
    with pytest.raises(RuntimeError, match="no launch configuration .* fits sm_86.*PPMA_BACKEND=torch"):
        tuning.fitting_configs(t, "v", t.configs, (8, 6))
    assert tuning.unfit_variants(("polyline_attention.vanilla",), (8, 6)) == [f"{t.kernel_id} | v"]


CHECK = r"""
import json, sys
from ppma.kernels.common import resources, tuning
from ppma.kernels.polyline_attention import vanilla

rows, samples = json.loads(sys.argv[1])
measured = resources.measure(rows, [90], jobs=2)
# Rows copied from another case (same_as) or architecture (ARCH_SAME_AS), compiled themselves.
copied = {f"{name} @ sm_{arch}": resources.compile_case(resources.all_cases()[name], arch) for name, arch in samples}
kernel = vanilla._fwd_kernel
wiring = dict(key=kernel.keys, prunes=kernel.early_config_prune is not None, configs=len(kernel.configs))
print(json.dumps(dict(measured=measured, copied=copied, wiring=wiring)))
"""


def test_recompiled_rows_match_the_table_and_the_h200_failures_fit(table):
    """The vanilla forward at the H200's failing launches (3-D, head dim 16, official: fp32 and
    bf16, whose rows fp16 takes, with the largest configuration pruning keeps on sm_90) and the
    first row of every other kernel: compiled again for sm_90, the same shared memory, registers
    and spills as the table, within the limit. A row copied from another dtype (``same_as``)
    compiled for sm_89 (copied from sm_86): bf16's shared memory, at most its registers and
    spills; the vanilla bf16 row on sm_89: the table's numbers. The numbers are compared under the
    table's Triton only (another version's compiler gives others: Triton 3.6, the GPU image's,
    spills 28 bytes where the table says 24); elsewhere the rows must fit."""
    t = vanilla._fwd_kernel.tuning
    rows = []
    for dtype in ("fp32", "bf16"):
        variant = t.variant({"Q": f"*{dtype}", "IS_3D": True, "PAPER": False, "BLOCK_D": 16, "BLOCK_DV": 16,
                             "COLS": 16})
        kept = tuning.fitting_configs(t, variant, t.configs, (9, 0))
        rows.append(tuning.row_name(t.kernel_id, variant, kept[-1]))  # the largest tile kept
    cases = {case.name: case for module in MODULES.values() for case in module.compile_cases()}
    for kernel in sorted(set(TUNED) - {t.kernel_id}):
        rows.append(next(n for n in table if n.startswith(f"{kernel} | ") and not cases[n].same_as))
    copied = next(name for name, case in cases.items() if case.same_as)
    samples = [(copied, 89), (rows[1], 89)]
    result = run_compile_script(CHECK, json.dumps([rows, samples]))
    # Outside the interpreter the autotuner has every configuration, prunes, and keys on the variant.
    wiring = result["wiring"]
    assert wiring["prunes"] and wiring["configs"] == len(t.configs)
    assert {"T", "H", "W", "IS_3D", "PAPER", "PRECISION", "COLS", "BLOCK_D", "BLOCK_DV"} <= set(wiring["key"])
    table_compiler = same_minor(triton.__version__, table_triton())
    for name in rows:
        got = result["measured"][name]["sm_90"]
        assert got["shared"] <= tuning.SHARED_MEMORY_LIMIT[90], name
        if table_compiler:
            assert got == table[name]["sm_90"], name
    # sm_89 is sm_86 to the byte and register; an fp16 row has bf16's shared memory, and no more
    # registers or spills than bf16's (which the table gives it).
    (copied_name, _), (own_name, _) = samples
    if table_compiler:
        assert result["copied"][f"{own_name} @ sm_89"] == table[own_name]["sm_89"], own_name
        got, want = result["copied"][f"{copied_name} @ sm_89"], table[copied_name]["sm_89"]
        assert got["shared"] == want["shared"] and got["registers"] <= want["registers"], (copied_name, got, want)
        assert got["spills"] <= want["spills"], (copied_name, got, want)
