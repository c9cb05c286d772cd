"""Depthwise convolution on channels-last token grids (PPMA's positional conv, LePE, FFN conv)."""
from __future__ import annotations

import torch
from torch import nn

from ppma.ops import depthwise_conv, select_backend

from .hooks import plain_modules
from .paths import paths_for


class GridDepthwiseConv(nn.Conv2d):
    """``k x k`` depthwise conv (stride 1, 'same' padding, bias) on a channels-last grid.

    Forward: ``(B, H, W, C)`` -> ``(B, H, W, C)``; a 3-D grid ``(B, T, H, W, C)`` is convolved
    frame by frame with the same 2-D kernel (so 2-D weights carry over to 3-D models).
    Parameters are those of ``nn.Conv2d(C, C, k, padding=k // 2, groups=C)``.

    Where autograd records or the tensors are on a GPU, and the op's backend is a kernel (a
    Triton launch each way on a GPU), the conv is :func:`ppma.ops.depthwise_conv`; elsewhere (CPU
    inference, ``PPMA_BACKEND=torch``) ``nn.Conv2d``'s on the channels-first view. The same
    function either way.
    """

    def __init__(self, dim: int, kernel_size: int):
        if kernel_size % 2 == 0:
            raise ValueError(f"kernel_size must be odd, got {kernel_size}")
        super().__init__(dim, dim, kernel_size, padding=kernel_size // 2, groups=dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        frames = x.flatten(0, -4)  # (B*T, H, W, C); a no-op for (B, H, W, C)
        if not torch.jit.is_scripting():  # TorchScript compiles the conv alone
            backend = _kernel_backend(x)
            if backend is not None:
                return depthwise_conv(frames, self.weight, self.bias, backend=backend).reshape(x.shape)
        y = self._conv_forward(frames.permute(0, 3, 1, 2), self.weight, self.bias).permute(0, 2, 3, 1)
        return y.reshape(x.shape)

    def plus_input(self, x: torch.Tensor) -> torch.Tensor:
        """``x + self(x)``, same shape: one op (its backward adds the residual's gradient itself)
        where :meth:`forward` runs the kernel and no hook watches this module, else the module's
        call and :func:`add_to_conv_output`."""
        backend = _kernel_backend(x)
        if backend is not None and plain_modules(GridDepthwiseConv, self):
            return depthwise_conv(x.flatten(0, -4), self.weight, self.bias, True, backend).reshape(x.shape)
        return add_to_conv_output(self(x), x)


def _kernel_backend(x: torch.Tensor) -> str | None:
    """The kernel backend with which :class:`GridDepthwiseConv` runs :func:`ppma.ops.depthwise_conv`
    on ``x`` (outside CPU inference, where the op's backend is a kernel), else None."""
    if paths_for(x.device).cpu_inference:
        return None
    backend = select_backend("depthwise_conv", x.device)
    return None if backend == "torch" else backend


def add_to_conv_output(out: torch.Tensor, other: torch.Tensor) -> torch.Tensor:
    """``out + other``, same shape, for ``out`` a fresh :class:`GridDepthwiseConv` output (a permuted
    view of the conv's result): added into ``out`` where :func:`~ppma.layers.paths.paths_for`
    updates views in place (CPU inference), else into a new tensor."""
    return out.add_(other) if paths_for(out.device).update_views_in_place else out + other


def channels_last_weight(conv: nn.Conv2d) -> nn.Conv2d:
    """``conv`` with its weight stored channels-last (same values, same parameter), the layout in
    which its gradient comes from channels-last inputs: else autograd copies every step's gradient
    into the weight's layout. For convs that read permuted ``(B, H, W, C)`` grids. Its state dict
    holds the weight contiguous, as any other (checkpoints and ``safetensors`` files unchanged)."""
    with torch.no_grad():
        conv.weight.set_(conv.weight.contiguous(memory_format=torch.channels_last))
    conv.register_state_dict_post_hook(_contiguous_weight_in_state_dict)
    return conv


def _contiguous_weight_in_state_dict(module, state_dict, prefix, local_metadata) -> None:
    key = prefix + "weight"
    # keep_vars=True (torch.jit's tracer collects parameters so) holds the Parameter itself: kept
    if key in state_dict and not isinstance(state_dict[key], nn.Parameter):
        state_dict[key] = state_dict[key].contiguous()
