"""The selective-scan kernels along VMamba's four routes read straight from the map
(``ppma.kernels.selective_scan.routes``) against the reference: the routes copied out
(``route_sequences``), scanned by the sequential reference and merged back; values and every
gradient, on odd maps with ``H != W`` both ways, several time tiles (a route's reversed and
column-major positions cross tile boundaries), ``N`` of 1 and 3. Interpreter on the CPU."""
from __future__ import annotations

import os

import pytest
import torch

pytest.importorskip("triton", reason="the Triton kernels need the 'triton' package")

if not torch.cuda.is_available() and os.environ.get("TRITON_INTERPRET", "0") != "1":
    pytest.skip(
        "Triton kernels need a CUDA device or TRITON_INTERPRET=1 (CPU interpreter)", allow_module_level=True
    )

from ppma.kernels.selective_scan.routes import cross_scan_bwd, cross_scan_fwd  # noqa: E402
from ppma.ops.cross_scan_impl.reference import cross_merge_reference, route_sequences  # noqa: E402
from ppma.ops.selective_scan_impl import selective_scan_reference  # noqa: E402

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
NAMES = ("x", "dts", "B", "C", "A", "D", "delta_bias")


def rel_err(actual, expected):
    scale = expected.double().abs().max().clamp_min(1e-30)
    return ((actual.double().cpu() - expected.double().cpu()).abs().max() / scale).item()


def map_inputs(batch, height, width, dim, n_state):
    """The kernels' inputs by name, channels-last; ``B``, ``C`` slices of one tensor (as the
    projection gives them)."""
    bc = torch.randn(batch, height, width, 4, 2 * n_state + 1, device=DEVICE)
    return dict(x=torch.randn(batch, height, width, dim, device=DEVICE),
                dts=torch.randn(batch, height, width, 4, dim, device=DEVICE),
                B=bc[..., 1:1 + n_state], C=bc[..., 1 + n_state:],
                A=-torch.rand(4 * dim, n_state, device=DEVICE) * 2, D=torch.randn(4 * dim, device=DEVICE),
                delta_bias=torch.randn(4 * dim, device=DEVICE) - 1)


def reference(inputs, grad_y):
    """``[y (batch, H, W, dim), gradients of NAMES]``: the routes copied, scanned, merged."""
    leaves = {k: v.detach().cpu().requires_grad_() for k, v in inputs.items()}
    batch, height, width, dim = leaves["x"].shape

    def along_routes(t):  # (batch, H, W, 4, c) -> (batch, 4 c, L)
        return route_sequences(t.permute(0, 3, 4, 1, 2)).flatten(1, 2)

    xs = along_routes(leaves["x"][:, :, :, None].expand(-1, -1, -1, 4, -1))
    bs, cs = (along_routes(leaves[k]).unflatten(1, (4, -1)) for k in ("B", "C"))
    ys, _ = selective_scan_reference(xs, along_routes(leaves["dts"]), leaves["A"], bs, cs, leaves["D"],
                                     delta_bias=leaves["delta_bias"], delta_softplus=True)
    y = cross_merge_reference(ys.view(batch, 4, dim, height, width)).permute(0, 2, 3, 1)
    return [y, *torch.autograd.grad((y * grad_y.cpu()).sum(), list(leaves.values()))]


@pytest.mark.parametrize("batch,height,width,dim,n_state,tile", [
    (2, 3, 5, 4, 1, 4), (1, 5, 3, 3, 3, 4), (1, 1, 7, 2, 1, 2), (1, 4, 4, 5, 2, None),
], ids=str)
def test_routes_from_the_map_match_reference(batch, height, width, dim, n_state, tile):
    seed = torch.initial_seed()
    inputs = map_inputs(batch, height, width, dim, n_state)
    grad_y = torch.randn(batch, height, width, dim, device=DEVICE)
    args = [inputs[k] for k in NAMES]
    y, states = cross_scan_fwd(*args, tile=tile)
    dx, *grads = cross_scan_bwd(grad_y, states, *args, tile=tile)
    actual = [y.sum(3), dx.sum(3), *grads]
    for name, a, e in zip(("y", *NAMES), actual, reference(inputs, grad_y)):
        assert a.shape == e.shape, f"{name}: {tuple(a.shape)} != {tuple(e.shape)}"
        assert rel_err(a, e) <= 1e-5, f"seed {seed}: {name} relative error {rel_err(a, e):.3g}"
