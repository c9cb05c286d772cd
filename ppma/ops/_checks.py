"""Input checks shared by the public ops: each raises ``ValueError`` naming the argument."""
from __future__ import annotations

import torch

ORDERS = ("v2h", "h2v", "both")


def check_choice(name: str, value, choices: tuple) -> None:
    if value not in choices:
        raise ValueError(f"{name} must be one of {choices}, got {value!r}")


def check_decays(log_alpha, log_beta, log_gamma, grid_shape=None, x_name="x") -> int:
    """Validate log-decays (and, given ``grid_shape``, that ``x_name`` lies on their grid).

    Returns the grid rank (2 or 3).
    """
    names = ("log_alpha", "log_beta") + (("log_gamma",) if log_gamma is not None else ())
    tensors = (log_alpha, log_beta) + ((log_gamma,) if log_gamma is not None else ())
    rank = 5 if log_gamma is not None else 4
    for name, t in zip(names, tensors):
        if not isinstance(t, torch.Tensor):
            raise ValueError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
        if t.dtype not in (torch.float32, torch.float64):
            raise ValueError(f"{name} must be float32 (or float64), got {t.dtype}: log-decays are kept in fp32")
        if t.dim() != rank:
            layout = "(B, heads, T, H, W)" if log_gamma is not None else "(B, heads, H, W)"
            raise ValueError(f"{name} must have shape {layout}, got a rank-{t.dim()} tensor {tuple(t.shape)}")
        if t.shape != log_alpha.shape:
            raise ValueError(f"{name} has shape {tuple(t.shape)} but log_alpha has {tuple(log_alpha.shape)}")
        if t.device != log_alpha.device:
            raise ValueError(f"{name} is on {t.device} but log_alpha is on {log_alpha.device}")
        if any(s == 0 for s in t.shape[2:]):
            raise ValueError(f"{name} has an empty grid: shape {tuple(t.shape)}")
        # Value checks need the data on the host; on CUDA they would stall every call.
        if t.device.type == "cpu" and not torch.compiler.is_compiling():
            if torch.isnan(t).any():
                raise ValueError(f"{name} contains NaN (a model's input is checked before; NaN here came "
                                 "from its weights or from the tensors passed to the op)")
            if (t > 0).any():
                raise ValueError(f"{name} must be <= 0 (a log-decay), max is {t.max().item():.4g}")
    if grid_shape is not None and tuple(grid_shape) != tuple(log_alpha.shape):
        raise ValueError(
            f"{x_name} has grid {tuple(grid_shape)} (its shape without the channel dim) but the "
            f"decays have shape {tuple(log_alpha.shape)}"
        )
    return rank - 2


def check_grid_tensor(name: str, t, log_alpha, log_gamma) -> None:
    """``t`` is a floating ``(B, heads, *grid, C)`` tensor on the decays' device."""
    if not isinstance(t, torch.Tensor) or not t.is_floating_point():
        raise ValueError(f"{name} must be a floating-point tensor, got {getattr(t, 'dtype', type(t).__name__)}")
    want = 6 if log_gamma is not None else 5
    if t.dim() != want:
        layout = "(B, heads, T, H, W, C)" if log_gamma is not None else "(B, heads, H, W, C)"
        raise ValueError(f"{name} must have shape {layout}, got a rank-{t.dim()} tensor {tuple(t.shape)}")
    if isinstance(log_alpha, torch.Tensor) and t.device != log_alpha.device:
        raise ValueError(f"{name} is on {t.device} but the decays are on {log_alpha.device}")
