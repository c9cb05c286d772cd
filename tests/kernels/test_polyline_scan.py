"""Triton ``polyline_scan`` against the PyTorch reference: forward, every gradient, dispatch.

CI runs these on the CPU through Triton's interpreter (``TRITON_INTERPRET=1``), so grids stay
small. The kernels run through the public op with ``backend='triton'`` (the custom op
``ppma::polyline_scan``, whose backward is the kernels' backward). The oracle is
``polyline_scan_reference`` evaluated in float64: in fp32 its decay
gradients come from differences of cumulative log-decays and lose digits at log-decays near -30,
while the kernels' fp32 recurrences stay within ~1e-6 of the float64 result.
"""
from __future__ import annotations

import functools
import os

import pytest
import torch
from torch._dynamo.testing import CompileCounterWithBackend

triton = pytest.importorskip("triton", reason="the Triton kernels need the 'triton' package")

if not torch.cuda.is_available() and os.environ.get("TRITON_INTERPRET", "0") != "1":
    pytest.skip(
        "Triton kernels need a CUDA device or TRITON_INTERPRET=1 (CPU interpreter)", allow_module_level=True
    )

from ppma.kernels import polyline_scan as scan_kernels  # noqa: E402
from ppma.kernels.polyline_scan import decay_scan, plane_scan  # noqa: E402
from ppma.ops import backend_report, polyline_scan, polyline_scan_reference  # noqa: E402

polyline_scan_triton = functools.partial(polyline_scan, backend="triton")

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
ORDERS = ("v2h", "h2v", "both")
# Every grid here runs the fused kernels of plane_scan (2-D and 3-D).
GRIDS = [(1, 1), (1, 9), (9, 1), (7, 9), (13, 17), (3, 5, 7)]


@pytest.fixture
def gen():
    """A generator seeded with the test's fixed seed; failure messages name the seed."""
    return torch.Generator().manual_seed(torch.initial_seed() % 2**63)


def log_decays(shape, count, gen):
    """``count`` fp32 log-decays of ``shape``, log-uniform in magnitude from -1e-6 to -30 (both hit)."""
    out = []
    for _ in range(count):
        mag = 10 ** (torch.rand(shape, generator=gen, dtype=torch.float64) * 7.477 - 6)  # 1e-6 .. 30
        ld = -mag.float()
        ld.view(-1)[0], ld.view(-1)[-1] = -1e-6, -30.0
        out.append(ld.to(DEVICE))
    return out


def scan_and_grads(fn, x, decays, order, grad):
    """``[y, dx, dlog_alpha, dlog_beta(, dlog_gamma)]`` of ``fn`` for upstream gradient ``grad``."""
    x = x.detach().requires_grad_()
    decays = [d.detach().requires_grad_() for d in decays]
    y = fn(x, decays[0], decays[1], order, decays[2] if len(decays) == 3 else None)
    return [y, *torch.autograd.grad(y, [x, *decays], grad)]


def reference64(x, decays, order, grad):
    return scan_and_grads(polyline_scan_reference, x.double(), [d.double() for d in decays], order, grad.double())


def rel_err(a, b):
    return ((a.double() - b.double()).abs().max() / b.double().abs().max().clamp_min(1e-30)).item()


def assert_close(got, want, tol, gen, names=("y", "dx", "dlog_alpha", "dlog_beta", "dlog_gamma")):
    for name, g, w in zip(names, got, want):
        assert g.shape == w.shape, f"{name}: shape {tuple(g.shape)} != {tuple(w.shape)}"
        assert torch.isfinite(g).all(), f"{name} has non-finite entries (seed {gen.initial_seed()})"
        err = rel_err(g, w)
        assert err < tol, f"{name}: relative error {err:.2e} >= {tol} (seed {gen.initial_seed()})"


@pytest.fixture(autouse=True)
def poison_buffers(monkeypatch):
    """Every buffer the kernels write starts as NaN, so an element they skip fails the test."""
    real = decay_scan._buffer

    def poisoned(like, dtype, shape=None):
        return real(like, dtype, shape).fill_(float("nan"))  # plane_scan's buffers come from here too

    monkeypatch.setattr(decay_scan, "_buffer", poisoned)


def small_tiles(monkeypatch, tile_h=2, block_c=4):
    """The fused kernels run one small tiling (several tiles and channel blocks a plane)."""
    config = [triton.Config({"TILE_H": tile_h, "BLOCK_C": block_c}, num_warps=4)]
    monkeypatch.setattr(plane_scan._plane_fwd_kernel, "configs", config)
    monkeypatch.setattr(plane_scan._plane_bwd_kernel, "configs", config)


def make_inputs(grid, channels, gen, dtype=torch.float32, batch=2, heads=3):
    shape = (batch, heads, *grid)
    x = torch.randn(*shape, channels, generator=gen).to(DEVICE, dtype)
    grad = torch.randn(*shape, channels, generator=gen).to(DEVICE, dtype)
    return x, log_decays(shape, len(grid), gen), grad


@pytest.mark.parametrize("order", ORDERS)
@pytest.mark.parametrize("grid", GRIDS, ids=lambda g: "x".join(map(str, g)))
def test_fp32_matches_reference(grid, order, gen):
    channels = (1, 3, 6, 70)[int(torch.randint(4, (), generator=gen))]  # 70: two channel blocks on a GPU
    x, decays, grad = make_inputs(grid, channels, gen)
    got = scan_and_grads(polyline_scan_triton, x, decays, order, grad)
    assert got[0].dtype == torch.float32
    assert_close(got, reference64(x, decays, order, grad), 1e-5, gen)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=str)
@pytest.mark.parametrize("grid", [(7, 5), (3, 5, 7)], ids=lambda g: "x".join(map(str, g)))
def test_half_precision_accumulates_in_fp32(grid, dtype, gen):
    x, decays, grad = make_inputs(grid, 5, gen, dtype=dtype)
    got = scan_and_grads(polyline_scan_triton, x, decays, "both", grad)
    assert got[0].dtype == dtype and got[1].dtype == dtype
    assert got[2].dtype == torch.float32
    # fp16/bf16 inputs are exact in float64: only output rounding separates the two.
    assert_close(got, reference64(x, decays, "both", grad), 1e-2, gen)


@pytest.mark.parametrize("order", ORDERS)
def test_channels_last_views_are_read_in_place(order, gen):
    b, heads, hh, ww, c = 2, 3, 6, 5, 4
    # The attention layer's layout: (B, H, W, heads, C) seen as (B, heads, H, W, C).
    x = torch.randn(b, hh, ww, heads, c, generator=gen).to(DEVICE).permute(0, 3, 1, 2, 4)
    decays = [d.permute(0, 2, 3, 1).contiguous().permute(0, 3, 1, 2) for d in log_decays((b, heads, hh, ww), 2, gen)]
    grad = torch.randn(b, heads, ww, hh, c, generator=gen).to(DEVICE).transpose(2, 3)
    got = scan_and_grads(polyline_scan_triton, x, decays, order, grad)
    assert got[0].stride() == x.stride(), "the output should keep the input's channels-last layout"
    assert_close(got, reference64(x, decays, order, grad), 1e-5, gen)


def test_non_dense_and_broadcast_inputs(gen):
    b, heads, tt, hh, ww = 1, 2, 3, 4, 5
    x = torch.randn(b, heads, tt, hh, ww, 8, generator=gen).to(DEVICE)[..., ::3]  # C=3, stride 3
    alpha, beta, gamma = log_decays((b, heads, tt, hh, ww), 3, gen)
    beta = beta[:, :1].expand(b, heads, tt, hh, ww)  # stride 0 over heads
    grad = torch.randn(b, heads, tt, hh, ww, 3, generator=gen).to(DEVICE).expand_as(x)
    got = scan_and_grads(polyline_scan_triton, x, [alpha, beta, gamma], "both", grad)
    assert_close(got, reference64(x, [alpha, beta, gamma], "both", grad), 1e-5, gen)


@pytest.mark.parametrize("grid", [(2, 67), (67, 2), (67, 1, 5)], ids=lambda g: "x".join(map(str, g)))
def test_long_lines(grid, gen):
    """Lines of any length: rows of 67 in one tile, columns of 67 in many tiles, and (3-D, 128
    frames x 8 tokens: wider than a tile) a line that one program of decay_scan walks with its
    state in registers."""
    x, decays, grad = make_inputs(grid, 3, gen, batch=1, heads=1)
    got = scan_and_grads(polyline_scan_triton, x, decays, "both", grad)
    assert_close(got, reference64(x, decays, "both", grad), 1e-5, gen)


@pytest.mark.parametrize("grid", [(5, 3), (3, 2, 3)], ids=lambda g: "x".join(map(str, g)))
def test_many_small_program_blocks(grid, gen, monkeypatch):
    """GPU-like blocking (many programs, partial line and channel blocks) through the interpreter."""
    monkeypatch.setattr(decay_scan, "_blocks", lambda n_lines, channels: (2, 4))  # (BLOCK_L, BLOCK_C)
    small_tiles(monkeypatch)
    x, decays, grad = make_inputs(grid, 6, gen, batch=1, heads=1)  # 6 channels: two blocks of 4
    got = scan_and_grads(polyline_scan_triton, x, decays, "both", grad)
    assert_close(got, reference64(x, decays, "both", grad), 1e-5, gen)


@pytest.mark.parametrize("order", ORDERS)
def test_fused_tiles_and_channel_blocks(order, gen, monkeypatch):
    """The fused kernels with tiles of 2 rows and blocks of 4 channels: 4 tiles (the last one
    partial) and 2 channel blocks a plane, batch 1, H != W."""
    small_tiles(monkeypatch)
    x, decays, grad = make_inputs((7, 9), 5, gen, batch=1)
    got = scan_and_grads(polyline_scan_triton, x, decays, order, grad)
    assert_close(got, reference64(x, decays, order, grad), 1e-5, gen)


@pytest.mark.parametrize("grid", [(3, 5), (2, 2, 3)], ids=lambda g: "x".join(map(str, g)))
def test_associative_scan_path(grid, gen, monkeypatch):
    """The GPU's scans (``tl.associative_scan``, which the interpreter runs one element at a
    time) give what the interpreter's doubling scans give: a tiny grid through both."""
    x, decays, grad = make_inputs(grid, 2, gen, batch=1, heads=1)
    small_tiles(monkeypatch, block_c=2)
    monkeypatch.setattr(plane_scan, "interpreted", lambda: False)
    got = scan_and_grads(polyline_scan_triton, x, decays, "both", grad)
    assert_close(got, reference64(x, decays, "both", grad), 1e-5, gen)


@pytest.mark.skipif(not (plane_scan.interpreted() or plane_scan.compiler_fuses()),
                    reason=f"Triton {plane_scan.triton.__version__} runs 1-D passes on GPUs (plane_scan.FUSED_SINCE)")
@pytest.mark.parametrize("order", ORDERS)
@pytest.mark.parametrize("grid", [(2, 3, 5), (3, 2, 4), (1, 4, 6), (5, 1, 1)], ids=lambda g: "x".join(map(str, g)))
def test_3d_grids_run_fused(grid, order, gen, monkeypatch):
    """3-D grids run plane_scan's kernels (never a 1-D pass), here in tiles of 2 rows and blocks
    of 4 channels (several of each), batch 1: values and every gradient, one frame and one
    token a frame included."""
    monkeypatch.setattr(scan_kernels.scan, "decay_scan_fwd", None)  # would fail if called
    monkeypatch.setattr(scan_kernels.scan, "decay_scan_bwd", None)
    small_tiles(monkeypatch)
    x, decays, grad = make_inputs(grid, 5, gen, batch=1, heads=2)
    got = scan_and_grads(polyline_scan_triton, x, decays, order, grad)
    assert_close(got, reference64(x, decays, order, grad), 1e-5, gen)


@pytest.mark.parametrize("grid", [(3, 6), (2, 3, 3)], ids=lambda g: "x".join(map(str, g)))
def test_rows_wider_than_a_tile_run_1d_passes(grid, gen, monkeypatch):
    """Rows (times frames) that do not fit a tile fall back to the 1-D passes of decay_scan."""
    monkeypatch.setattr(plane_scan, "MAX_BLOCK_W", 4)
    monkeypatch.setattr(plane_scan, "forward", None)  # would fail if called
    x, decays, grad = make_inputs(grid, 2, gen, batch=1)
    got = scan_and_grads(polyline_scan_triton, x, decays, "both", grad)
    assert_close(got, reference64(x, decays, "both", grad), 1e-5, gen)


@pytest.mark.parametrize("grid", [(7, 9), (2, 3, 5)], ids=lambda g: "x".join(map(str, g)))
def test_triton_older_than_the_fused_kernels_runs_1d_passes(grid, gen, monkeypatch):
    """Before Triton 3.8 the GPU compiler fails on the fused kernels' narrow tiles: 1-D passes."""
    assert not plane_scan.compiler_fuses("3.6.0") and plane_scan.compiler_fuses("3.8.0")
    assert plane_scan.compiler_fuses("3.10.1")
    monkeypatch.setattr(plane_scan, "interpreted", lambda: False)
    monkeypatch.setattr(plane_scan, "compiler_fuses", lambda: False)
    monkeypatch.setattr(plane_scan, "forward", None)  # would fail if called
    x, decays, grad = make_inputs(grid, 3, gen, batch=1)
    got = scan_and_grads(polyline_scan_triton, x, decays, "both", grad)
    assert_close(got, reference64(x, decays, "both", grad), 1e-5, gen)


def test_no_channels(gen):
    x, decays, grad = make_inputs((3, 4), 0, gen)
    y, dx, dlog_alpha, dlog_beta = scan_and_grads(polyline_scan_triton, x, decays, "both", grad)
    assert y.shape == x.shape and dx.shape == x.shape
    assert not dlog_alpha.any() and not dlog_beta.any()


def test_fp64_gradcheck(gen):
    """float64 inputs accumulate in float64, so ``gradcheck`` holds through the kernels."""
    x = torch.randn(1, 1, 3, 4, 2, generator=gen, dtype=torch.float64).to(DEVICE)
    alpha, beta = log_decays((1, 1, 3, 4), 2, gen)
    # Decays near -30 make entries ~1e-13: finite differences cannot see them; keep them moderate.
    inputs = [t.requires_grad_() for t in (x, alpha.double().clamp_min(-3), beta.double().clamp_min(-3))]
    assert torch.autograd.gradcheck(lambda *a: polyline_scan_triton(*a, order="both"), inputs, fast_mode=True)


def test_dispatch_runs_triton(gen, monkeypatch):
    """``auto`` runs the kernel on CUDA; under the CPU interpreter only ``backend='triton'`` does."""
    monkeypatch.delenv("PPMA_BACKEND", raising=False)
    x, decays, _ = make_inputs((3, 4), 2, gen)
    assert backend_report(DEVICE)["polyline_scan"]["selected"] == ("triton" if DEVICE == "cuda" else "torch")
    y = polyline_scan(x, *decays, order="v2h", backend="triton")
    assert torch.equal(y, scan_kernels.forward(x, *decays, "v2h", None)), f"seed {gen.initial_seed()}"


@pytest.mark.parametrize(
    "case, match",
    [
        ("device_mix", "is on"),
        ("rank", "x must have shape"),
        ("grid_mismatch", "has grid"),
        ("decay_shape_mismatch", "log_beta has shape"),
        ("decay_dtype", "must be float32"),
    ],
)
def test_bad_input_raises(case, match, gen):
    x, (alpha, beta), _ = make_inputs((3, 4), 2, gen)
    if case == "device_mix":
        alpha, beta = alpha.to("meta"), beta.to("meta")
    elif case == "rank":
        x = x[0]
    elif case == "grid_mismatch":
        x = x[:, :, :2]
        alpha, beta = alpha[:, :, :3], beta[:, :, :3]
    elif case == "decay_shape_mismatch":
        beta = beta[:, :, :2]
    else:
        alpha = alpha.half()
    with pytest.raises(ValueError, match=match):
        polyline_scan(x, alpha, beta, backend="triton")


def test_torch_compile_sees_one_op(gen):
    x, decays, grad = make_inputs((3, 4), 2, gen, batch=1, heads=1)
    counter = CompileCounterWithBackend("aot_eager")
    fn = torch.compile(lambda x, a, b: polyline_scan_triton(x, a, b, order="both") * 2, backend=counter, fullgraph=True)
    got = scan_and_grads(lambda x, a, b, order, g: fn(x, a, b), x, decays, "both", grad)
    want = scan_and_grads(lambda x, a, b, order, g: polyline_scan_triton(x, a, b, order) * 2, x, decays, "both", grad)
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w)
    assert counter.frame_count == 1
    targets = [str(n.target) for n in counter.graphs[0].graph.nodes if n.op == "call_function"]
    assert targets.count("ppma.polyline_scan.default") == 1, targets


def test_opcheck(gen):
    x, decays, _ = make_inputs((2, 3), 2, gen, batch=1, heads=1)
    x.requires_grad_()
    for d in decays:
        d.requires_grad_()
    torch.library.opcheck(torch.ops.ppma.polyline_scan.default, (x, *decays, "both", None, "triton", True))
