"""Record what PPMA's attention layers compute, without touching model code.

:func:`capture_attention` registers forward hooks on every
:class:`ppma.layers.PolylineAttention` of a model (or the chosen ones): on its ``decay`` submodule
(the log-decays) and on its ``q_tap`` / ``k_tap`` identities (queries and keys after RoPE and the
``1/sqrt(d)`` scaling, so the attention logits are ``q @ k^T``). The hooks only read; the model's
outputs are unchanged. Hooks are removed when the ``with`` block ends.

    with capture_attention(model) as records:
        model(x)
    rec = records['stages.2.blocks.0.attn']   # an AttentionRecord
"""
from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Callable, Iterator, Sequence

import torch
from torch import nn

from ppma._deprecation import renamed_property
from ppma.layers import PolylineAttention


@dataclass
class AttentionRecord:
    """What one attention layer saw in the last forward pass (tensors detached, on their device).

    Shapes (2-D grid ``H x W``; the 3-D grid adds ``T`` after ``heads``):
    ``log_alpha``, ``log_beta`` (and ``log_gamma`` for 3-D): fp32 ``(B, heads, H, W)``;
    ``q``, ``k``: ``(B, heads, H, W, head_dim)``, scaled and rotated, so logits are ``q @ k^T``.
    ``feature_map``: the positive feature map of the ``'linear'`` kind (None otherwise).
    """

    name: str
    kind: str
    token_layout: str  # '2d' or '3d' (ppma.layers.layout)
    form: str | None  # None for the linear kind
    num_heads: int
    log_alpha: torch.Tensor
    log_beta: torch.Tensor
    log_gamma: torch.Tensor | None
    q: torch.Tensor
    k: torch.Tensor
    feature_map: Callable[[torch.Tensor], torch.Tensor] | None = None

    grid = renamed_property("grid", "token_layout")
    mask_form = renamed_property("mask_form", "form")

    @property
    def grid_shape(self) -> tuple[int, ...]:
        """``(H, W)`` or ``(T, H, W)``."""
        return tuple(self.log_alpha.shape[2:])

    @property
    def batch_size(self) -> int:
        return self.log_alpha.shape[0]


def attention_layers(model: nn.Module) -> dict[str, nn.Module]:
    """All :class:`ppma.layers.PolylineAttention` modules of ``model`` by qualified name, in order."""
    return {name: m for name, m in model.named_modules() if isinstance(m, PolylineAttention)}


def select_layers(model: nn.Module, layers: Sequence[str | int] | None = None) -> dict[str, nn.Module]:
    """Pick attention layers by qualified name or by index into :func:`attention_layers` (negative ok).

    ``None`` selects all. Raises ``ValueError`` naming the bad entry and the valid choices.
    """
    found = attention_layers(model)
    if not found:
        raise ValueError(f"{type(model).__name__} has no PolylineAttention layers to visualize")
    if layers is None:
        return found
    names = list(found)
    chosen = {}
    for item in layers:
        if isinstance(item, int) or (isinstance(item, str) and item.lstrip("-").isdigit()):
            index = int(item)
            if not -len(names) <= index < len(names):
                raise ValueError(f"layer index {index} is out of range: the model has {len(names)} attention layers")
            name = names[index]
        elif item in found:
            name = item
        else:
            raise ValueError(
                f"layer {item!r} is not an attention layer of the model; choose an index or one of {names}"
            )
        chosen[name] = found[name]
    return chosen


@contextlib.contextmanager
def capture_attention(
    model: nn.Module, layers: Sequence[str | int] | None = None
) -> Iterator[dict[str, AttentionRecord]]:
    """Context manager yielding a dict that forward passes fill with :class:`AttentionRecord` s.

    ``layers``: names or indices as in :func:`select_layers` (default: every attention layer).
    A later forward pass overwrites the records of an earlier one.
    """
    records: dict[str, AttentionRecord] = {}
    handles = []

    def keep(parts: dict, key: str):
        def hook(_module, _inputs, output):
            parts[key] = output

        return hook

    def assemble(name: str, parts: dict):
        def hook(module, _inputs, _output):
            missing = {"decay", "q", "k"} - parts.keys()
            if missing:
                raise RuntimeError(f"capture of {name}: the forward pass did not run {sorted(missing)}")
            decays = tuple(d.detach() for d in parts["decay"])
            records[name] = AttentionRecord(
                name=name,
                kind=module.kind,
                token_layout=module.token_layout,
                form=module.form,
                num_heads=module.num_heads,
                log_alpha=decays[0],
                log_beta=decays[1],
                log_gamma=decays[2] if len(decays) == 3 else None,
                q=parts["q"].detach(),
                k=parts["k"].detach(),
                feature_map=getattr(module, "feature_map", None) if module.kind == "linear" else None,
            )
            parts.clear()

        return hook

    try:
        for name, module in select_layers(model, layers).items():
            parts: dict = {}
            handles.append(module.decay.register_forward_hook(keep(parts, "decay")))
            handles.append(module.q_tap.register_forward_hook(keep(parts, "q")))
            handles.append(module.k_tap.register_forward_hook(keep(parts, "k")))
            handles.append(module.register_forward_hook(assemble(name, parts)))
        yield records
    finally:
        for handle in handles:
            handle.remove()


def last_per_stage(records: dict[str, AttentionRecord]) -> list[AttentionRecord]:
    """The last captured layer of every stage (layers of a stage share a grid), in capture order."""
    by_grid: dict[tuple[int, ...], AttentionRecord] = {}
    for rec in records.values():
        by_grid.pop(rec.grid_shape, None)
        by_grid[rec.grid_shape] = rec
    return list(by_grid.values())
