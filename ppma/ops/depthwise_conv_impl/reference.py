"""Plain PyTorch reference of ``depthwise_conv``."""
from __future__ import annotations

import torch
import torch.nn.functional as F


def depthwise_conv_reference(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
                             add_input: bool) -> torch.Tensor:
    """``conv(x) (+ x)``: the ``K x K`` depthwise conv ('same' padding, stride 1) of ``x`` ``(N, H, W,
    C)`` with ``weight`` ``(C, 1, K, K)`` and ``bias`` ``(C,)``, as ``nn.Conv2d(C, C, K, padding=K //
    2, groups=C)`` on the channels-first view (under autocast, in its dtype), ``x`` added when
    ``add_input`` -> ``(N, H, W, C)`` contiguous."""
    k = weight.shape[-1]
    y = F.conv2d(x.permute(0, 3, 1, 2), weight, bias, padding=k // 2, groups=x.shape[-1]).permute(0, 2, 3, 1)
    return (y + x if add_input else y).contiguous()
