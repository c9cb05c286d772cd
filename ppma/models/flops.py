"""FLOPs of a model with fvcore; every registered op counted by its registry formula.

Convention (fvcore's, and the papers'): one multiply-add is one FLOP, so conv / linear / matmul /
einsum count their MACs (fvcore's own handles). Added here:

- every op of :mod:`ppma.ops.registry` (``ppma::polyline_attention``, ``ppma::polyline_scan``,
  ...; one node in fvcore's trace whatever backend runs) is counted by its ``flops`` formula,
  a dict of named terms, reported per operator as ``'<op>.<term>'`` (e.g.
  ``'polyline_attention.products'``). ``exclude_terms`` leaves terms out of a total:
  ``('products',)`` drops the attention products ``q k^T`` and ``weights x v`` (the paper's
  detection FLOPs leave them out, see docs/models.md);
- the elementwise ops outside the registered ops (residual adds, layer scale, RoPE, the decay
  generator, the linear kind's normalization): one FLOP per output element.

Usage: ``count_flops(model, (1, 3, 224, 224))`` -> total FLOPs (int);
``flop_analysis(model, inputs)`` returns the evaluated fvcore ``FlopCountAnalysis`` (per module,
per operator, ``fvcore.nn.flop_count_table``) and ``total_flops(analysis, exclude_terms)`` its
total without some terms (one trace gives both totals).
"""
from __future__ import annotations

import math
from collections import Counter
from typing import Sequence

import torch
from torch import nn

from ppma.ops import registered_ops
from ppma.ops._custom_op import APPENDED_ARGUMENTS

# Out of place and in place (the layers compute in place where autograd does not need the input)
ELEMENTWISE_OPS = tuple(f"aten::{name}{suffix}" for name in ("neg", "add", "exp", "mul", "div", "softplus")
                        for suffix in ("", "_"))


def _argument(value):
    """A traced op argument as the registry's formulas take it: a tensor's shape, else its value."""
    if isinstance(value.type(), torch._C.TensorType):
        return tuple(value.type().sizes())
    return value.toIValue()


def _elementwise_flops(inputs, outputs) -> int:
    """One FLOP per output element; a complex multiply (the rotary embeddings') counts as the
    real arithmetic it stands for, ``x cos - y sin`` and ``x sin + y cos``: 6."""
    out = outputs[0].type()
    return math.prod(out.sizes()) * (6 if out.scalarType().startswith("Complex") else 1)


def _op_handle(name: str, formula):
    def handle(inputs, outputs) -> Counter:
        terms = formula(*[_argument(v) for v in inputs[: -len(APPENDED_ARGUMENTS)]])
        return Counter({f"{name}.{term}": flops for term, flops in terms.items()})

    return handle


def flop_analysis(model: nn.Module, inputs: torch.Tensor | Sequence[torch.Tensor]):
    """fvcore ``FlopCountAnalysis`` of one eval-mode forward of ``model`` on ``inputs`` with the
    handles above, already evaluated (``total()``, ``by_module()``, ``by_operator()`` are cached)."""
    from fvcore.nn import FlopCountAnalysis

    inputs = (inputs,) if isinstance(inputs, torch.Tensor) else tuple(inputs)
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad():
            analysis = FlopCountAnalysis(model, inputs)
            analysis.set_op_handle(**{op: _elementwise_flops for op in ELEMENTWISE_OPS})
            analysis.set_op_handle(
                **{f"ppma::{name}": _op_handle(name, op.flops) for name, op in registered_ops().items()}
            )
            analysis.unsupported_ops_warnings(False).uncalled_modules_warnings(False)
            analysis.total()
    finally:
        model.train(was_training)
    return analysis


def total_flops(analysis, exclude_terms: Sequence[str] = ()) -> int:
    """``analysis.total()`` without the registered ops' terms named in ``exclude_terms``."""
    ops = registered_ops()
    left_out = sum(
        flops
        for key, flops in analysis.by_operator().items()
        if key.partition(".")[0] in ops and key.partition(".")[2] in exclude_terms
    )
    return int(analysis.total() - left_out)


def count_flops(
    model: nn.Module, input_shape: Sequence[int] = (1, 3, 224, 224), exclude_terms: Sequence[str] = ()
) -> int:
    """Total FLOPs (multiply-adds) of one forward of ``model`` on zeros of ``input_shape``,
    without the registered ops' terms named in ``exclude_terms`` (e.g. ``('products',)``)."""
    return total_flops(flop_analysis(model, torch.zeros(input_shape)), exclude_terms)
