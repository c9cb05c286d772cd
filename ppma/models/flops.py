"""FLOPs of a model with fvcore, counting the attention and polyline-mask ops fvcore skips.

fvcore counts one multiply-add as one FLOP (so conv/linear/matmul/einsum are MACs) and ignores
elementwise ops. PPMA's attention adds work fvcore does not see; it is counted here with the
same convention:

- ``aten::softmax``, and the elementwise ops that build the log-mask and add it to the logits
  (``aten::masked_fill``, ``aten::cumsum``, ``aten::sub``, ``aten::abs``, ``aten::neg``,
  ``aten::add``, ``aten::exp``, ``aten::mul``, ``aten::div``, ``aten::softplus``): one FLOP per output element. Elementwise
  ops elsewhere in the model (residual adds, activations) are counted by the same rule.
- ``polyline_scan`` (``y = L x`` of the linear kind): per element of ``x``, per grid axis and
  per path order, two decayed recurrences and their combination: 3 FLOPs. It is traced as one
  op, ``ppma_flops::polyline_scan``, so that the cost of the PyTorch reference's dense 1-D
  masks does not stand in for the O(N) algorithm.

Usage: ``count_flops(model, (1, 3, 224, 224))`` -> total FLOPs (int);
``flop_analysis(model, inputs)`` returns the evaluated fvcore ``FlopCountAnalysis`` (per module,
per operator, ``fvcore.nn.flop_count_table``).
"""
from __future__ import annotations

import contextlib
import math
from typing import Iterator, Optional, Sequence

import torch
from torch import nn

import ppma.layers.polyline_attention as _polyline_attention
from ppma.ops import polyline_scan_reference

ELEMENTWISE_OPS = (
    "aten::softmax",
    "aten::masked_fill",
    "aten::cumsum",
    "aten::sub",
    "aten::abs",
    "aten::neg",
    "aten::add",
    "aten::exp",
    "aten::mul",
    "aten::div",
    "aten::softplus",
)
SCAN_FLOPS_PER_ELEMENT_AXIS_ORDER = 3


@torch.library.custom_op("ppma_flops::polyline_scan", mutates_args=())
def _scan_for_tracing(
    x: torch.Tensor,
    log_alpha: torch.Tensor,
    log_beta: torch.Tensor,
    order: str,
    log_gamma: Optional[torch.Tensor],
) -> torch.Tensor:
    return polyline_scan_reference(x, log_alpha, log_beta, order=order, log_gamma=log_gamma).clone()


def _traced_scan(x, log_alpha, log_beta, order="both", log_gamma=None, backend=None):
    return _scan_for_tracing(x, log_alpha, log_beta, order, log_gamma)


@contextlib.contextmanager
def _scan_as_one_op() -> Iterator[None]:
    original = _polyline_attention.polyline_scan
    _polyline_attention.polyline_scan = _traced_scan
    try:
        yield
    finally:
        _polyline_attention.polyline_scan = original


def _shape(value) -> list[int]:
    return value.type().sizes()


def _elementwise_flops(inputs, outputs) -> int:
    return math.prod(_shape(outputs[0]))


def _scan_flops(inputs, outputs) -> int:
    shape = _shape(inputs[0])
    order = inputs[3].toIValue()
    axes = len(shape) - 3  # (B, heads, *grid, C)
    return math.prod(shape) * axes * (2 if order == "both" else 1) * SCAN_FLOPS_PER_ELEMENT_AXIS_ORDER


def flop_analysis(model: nn.Module, inputs: torch.Tensor | Sequence[torch.Tensor]):
    """fvcore ``FlopCountAnalysis`` of one eval-mode forward of ``model`` on ``inputs``, with the
    handles above, already evaluated (``total()``, ``by_module()``, ``by_operator()`` are cached)."""
    from fvcore.nn import FlopCountAnalysis

    inputs = (inputs,) if isinstance(inputs, torch.Tensor) else tuple(inputs)
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad(), _scan_as_one_op():
            analysis = FlopCountAnalysis(model, inputs)
            analysis.set_op_handle(**{op: _elementwise_flops for op in ELEMENTWISE_OPS})
            analysis.set_op_handle("ppma_flops::polyline_scan", _scan_flops)
            analysis.unsupported_ops_warnings(False).uncalled_modules_warnings(False)
            analysis.total()  # trace now, while the scan is one op
    finally:
        model.train(was_training)
    return analysis


def count_flops(model: nn.Module, input_shape: Sequence[int] = (1, 3, 224, 224)) -> int:
    """Total FLOPs (multiply-adds) of one forward of ``model`` on zeros of ``input_shape``."""
    return int(flop_analysis(model, torch.zeros(input_shape)).total())
