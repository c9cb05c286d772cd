"""The polyline path mask ops against the literal definition (products of decays along paths)."""
import itertools
import math

import pytest
import torch

from ppma.ops import polyline_log_mask, polyline_mask, polyline_mask_1d, polyline_scan
from ppma.ops.polyline_scan_impl import reference as scan_reference

GRIDS_2D = [(1, 1), (1, 7), (5, 1), (3, 4), (7, 9)]
GRIDS_3D = [(1, 1, 1), (2, 3, 4), (3, 1, 2), (1, 3, 5)]
ORDERS = ["v2h", "h2v", "both"]


@pytest.fixture(params=["dense", "recurrent"])
def scan_path(request, monkeypatch):
    """Run a test through both line algorithms of the reference scan."""
    if request.param == "recurrent":
        monkeypatch.setattr(scan_reference, "DENSE_LINE_MAX", 1)
    return request.param


def seeded():
    """A generator seeded with the test's fixed seed (tests/conftest.py), and that seed."""
    seed = torch.initial_seed()
    return torch.Generator().manual_seed(seed), seed


def rand_log_decays(shape, gen, n=2, low=-2.0):
    return [torch.rand(shape, generator=gen, dtype=torch.float64) * low for _ in range(n)]


def literal_v2h(log_alpha, log_beta, log_gamma=None):
    """The definition: for query (t,i,j) and key (s,k,l), multiply the decay of every edge crossed
    going along T at (k,l) with gamma, then along H in frame t at column l with beta, then along W
    in frame t row i with alpha. Crossing p-1 -> p (either direction) costs the decay at p."""
    if log_gamma is None:
        log_alpha, log_beta = log_alpha[:, :, None], log_beta[:, :, None]
        log_gamma = torch.zeros_like(log_alpha)
    a, b, g = log_alpha.exp(), log_beta.exp(), log_gamma.exp()
    bsz, heads, T, H, W = a.shape

    def path(values, start, end):
        out = torch.ones(bsz, heads, dtype=a.dtype)
        for p in range(min(start, end) + 1, max(start, end) + 1):
            out = out * values(p)
        return out

    cells = list(itertools.product(range(T), range(H), range(W)))
    mask = torch.zeros(bsz, heads, len(cells), len(cells), dtype=a.dtype)
    for q, (t, i, j) in enumerate(cells):
        for k_idx, (s, k, l) in enumerate(cells):
            mask[:, :, q, k_idx] = (
                path(lambda p, k=k, l=l: g[:, :, p, k, l], s, t)
                * path(lambda p, t=t, l=l: b[:, :, t, p, l], k, i)
                * path(lambda p, t=t, i=i: a[:, :, t, i, p], l, j)
            )
    return mask


def identity_columns(bsz, heads, grid):
    n = math.prod(grid)
    return torch.eye(n, dtype=torch.float64).reshape(*grid, n).expand(bsz, heads, *grid, n).contiguous(), n


def expected_for(order, v2h):
    return {"v2h": v2h, "h2v": v2h.transpose(-1, -2), "both": v2h + v2h.transpose(-1, -2)}[order]


@pytest.mark.parametrize("grid", GRIDS_2D + GRIDS_3D, ids=str)
def test_literal_equals_mask_equals_scan(grid, scan_path):
    gen, seed = seeded()
    bsz, heads = 2, 3
    decays = rand_log_decays((bsz, heads, *grid), gen, n=len(grid))
    log_alpha, log_beta = decays[-1], decays[-2]
    log_gamma = decays[0] if len(grid) == 3 else None
    v2h = literal_v2h(log_alpha, log_beta, log_gamma)
    x, n = identity_columns(bsz, heads, grid)
    for order in ORDERS:
        want = expected_for(order, v2h)
        mask = polyline_mask(log_alpha, log_beta, order, log_gamma=log_gamma)
        scanned = polyline_scan(x, log_alpha, log_beta, order, log_gamma=log_gamma, backend="torch")
        # column q of the scanned identity is L e_q
        torch.testing.assert_close(mask, want, rtol=1e-12, atol=1e-12, msg=f"mask {order} seed {seed}")
        torch.testing.assert_close(
            scanned.reshape(bsz, heads, n, n), want, rtol=1e-12, atol=1e-12, msg=f"scan {order} seed {seed}"
        )


@pytest.mark.parametrize("grid", [(3, 4), (2, 3, 4)], ids=str)
def test_h2v_is_transpose_of_v2h_and_log_mask_matches(grid):
    gen, _ = seeded()
    decays = rand_log_decays((1, 2, *grid), gen, n=len(grid), low=-1.0)
    log_gamma = decays[0] if len(grid) == 3 else None
    la, lb = decays[-1].float(), decays[-2].float()
    lg = None if log_gamma is None else log_gamma.float()
    v2h = polyline_mask(la, lb, "v2h", log_gamma=lg)
    torch.testing.assert_close(polyline_mask(la, lb, "h2v", log_gamma=lg), v2h.transpose(-1, -2))
    torch.testing.assert_close(polyline_log_mask(la, lb, lg).exp(), v2h)
    torch.testing.assert_close(polyline_log_mask(la, lb, lg, transpose=True).exp(), v2h.transpose(-1, -2))
    both = polyline_mask(la, lb, "both", log_gamma=lg)
    torch.testing.assert_close(both, both.transpose(-1, -2))


def test_mask_1d_symmetric_unit_diagonal():
    gen, _ = seeded()
    log_decay = torch.rand(4, 11, generator=gen) * -3
    mask = polyline_mask_1d(log_decay)
    assert mask.shape == (4, 11, 11)
    torch.testing.assert_close(mask, mask.transpose(-1, -2))
    torch.testing.assert_close(torch.diagonal(mask, dim1=-2, dim2=-1), torch.ones(4, 11))
    # neighbours differ by exactly one decay
    torch.testing.assert_close(torch.diagonal(mask, offset=1, dim1=-2, dim2=-1), log_decay[:, 1:].exp())


@pytest.mark.parametrize("grid", [(5, 7), (6, 6)], ids=str)
def test_constant_decay_is_manhattan_decay(grid):
    """RMT's Manhattan decay: a constant decay g gives g^(|i-k| + |j-l|)."""
    g = 0.83
    H, W = grid
    log_decay = torch.full((1, 1, H, W), math.log(g), dtype=torch.float64)
    ii, jj = torch.meshgrid(torch.arange(H), torch.arange(W), indexing="ij")
    ii, jj = ii.flatten(), jj.flatten()
    manhattan = (ii[:, None] - ii[None, :]).abs() + (jj[:, None] - jj[None, :]).abs()
    want = g ** manhattan.double()
    torch.testing.assert_close(polyline_mask(log_decay, log_decay, "v2h")[0, 0], want)
    torch.testing.assert_close(polyline_mask(log_decay, log_decay, "both")[0, 0], 2 * want)


@pytest.mark.parametrize(
    "grid,order", [((3, 4), "v2h"), ((4, 3), "h2v"), ((2, 5), "both"), ((2, 3, 2), "both"), ((3, 2, 2), "v2h")], ids=str
)
def test_gradcheck_scan(grid, order, scan_path):
    gen, _ = seeded()
    x = torch.randn(1, 2, *grid, 3, generator=gen, dtype=torch.float64, requires_grad=True)
    decays = [d.requires_grad_() for d in rand_log_decays((1, 2, *grid), gen, n=len(grid))]
    log_gamma = decays[0] if len(grid) == 3 else None

    def fn(x, *d):
        lg = d[0] if len(grid) == 3 else None
        return polyline_scan(x, d[-1], d[-2], order, log_gamma=lg, backend="torch")

    assert torch.autograd.gradcheck(fn, (x, *decays))
    assert log_gamma is None or log_gamma.requires_grad


@pytest.mark.parametrize("log_value", [-50.0, -1e-6])
def test_extreme_decays_stay_finite(log_value, scan_path):
    x = torch.randn(2, 2, 9, 13, 4)
    log_decay = torch.full((2, 2, 9, 13), log_value, requires_grad=True)
    y = polyline_scan(x, log_decay, log_decay, "both", backend="torch")
    y.square().sum().backward()
    assert torch.isfinite(y).all() and torch.isfinite(log_decay.grad).all()
    assert torch.isfinite(polyline_mask(log_decay, log_decay)).all()
    if log_value == -50.0:  # nothing leaks past one step: L2D = 2 I
        torch.testing.assert_close(y, 2 * x)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_inputs_accumulate_in_fp32(dtype, scan_path):
    gen, _ = seeded()
    x = torch.randn(1, 2, 7, 9, 5, generator=gen).to(dtype)
    la, lb = (torch.rand(1, 2, 7, 9, generator=gen) * -1e-3 for _ in range(2))  # long, slow decays
    y = polyline_scan(x, la, lb, "both", backend="torch")
    assert y.dtype == dtype
    exact = polyline_scan(x.double(), la.double(), lb.double(), "both", backend="torch")
    # fp32 accumulation: only the final rounding to the half type remains, at most half a unit in
    # the last place (a half-precision running sum over ~16 terms would be far off this bound)
    half_ulp = 0.5 * torch.finfo(dtype).eps * exact.abs()
    assert ((y.double() - exact).abs() <= 1.01 * half_ulp + 1e-6).all()


def test_bad_inputs_name_the_argument():
    x = torch.randn(1, 2, 3, 4, 5)
    la = -torch.rand(1, 2, 3, 4)
    with pytest.raises(ValueError, match="order"):
        polyline_scan(x, la, la, order="diagonal")
    with pytest.raises(ValueError, match="x must have shape"):
        polyline_scan(x[0], la, la)
    with pytest.raises(ValueError, match="log_beta"):
        polyline_scan(x, la, la[:, :, :2])
    with pytest.raises(ValueError, match="log_alpha must be float32"):
        polyline_scan(x, la.half(), la)
    with pytest.raises(ValueError, match="x has grid"):
        polyline_scan(x, la[..., :3], la[..., :3])
    with pytest.raises(ValueError, match="x must be a floating-point"):
        polyline_scan(x.long(), la, la)
    with pytest.raises(ValueError, match="log_gamma"):
        polyline_scan(x[:, :, None], la[:, :, None], la[:, :, None], log_gamma=la)
    with pytest.raises(ValueError, match="contains NaN"):
        polyline_scan(x, la.clone().fill_(float("nan")), la)
    with pytest.raises(ValueError, match="must be <= 0"):
        polyline_mask(la.abs() + 0.1, la)
    with pytest.raises(ValueError, match="empty grid"):
        polyline_mask(la[:, :, :0], la[:, :, :0])


def test_fp32_decay_gradients_match_fp64_for_mixed_extreme_decays(scan_path):
    """Weak (-1e-6) next to strong (-30) decays: cumulative sums reach ~1e3, where a difference of
    weak decays rounds to zero in fp32; the gradient must not depend on that rounding."""
    gen, seed = seeded()
    grid = (7, 5)
    x = torch.randn(1, 2, *grid, 3, generator=gen, dtype=torch.float64)
    choices = torch.tensor([-1e-6, -1e-3, -0.5, -30.0], dtype=torch.float64)
    decays = [choices[torch.randint(0, 4, (1, 2, *grid), generator=gen)] for _ in range(2)]
    weights = torch.randn(1, 2, *grid, 3, generator=gen, dtype=torch.float64)
    grads = {}
    for dtype in (torch.float64, torch.float32):
        la, lb = (d.to(dtype).clone().requires_grad_() for d in decays)
        y = polyline_scan(x.to(dtype), la, lb, "both", backend="torch")
        (y * weights.to(dtype)).sum().backward()
        grads[dtype] = (la.grad.double(), lb.grad.double())
        mask_la = decays[0].to(dtype).clone().requires_grad_()
        (polyline_mask(mask_la, decays[1].to(dtype)) ** 2).sum().backward()
        grads[dtype, "mask"] = mask_la.grad.double()
    for got, want in zip(grads[torch.float32], grads[torch.float64]):
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5 * want.abs().max(), msg=f"seed {seed}")
    want = grads[torch.float64, "mask"]
    torch.testing.assert_close(grads[torch.float32, "mask"], want, rtol=1e-4, atol=1e-5 * want.abs().max())
