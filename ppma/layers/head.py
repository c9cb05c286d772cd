"""Classification heads: the PPMA release's and a norm-pool head (on a grid), a pooled-token head (on a sequence)."""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

POOLS = ("avg", "")
TOKEN_POOLS = ("token", "avg", "")


class ProjectionHead(nn.Module):
    """``fc(mean(silu(BN(fc1(x)))))``: per-token projection to ``hidden_dim``, BatchNorm, SiLU,
    global average pool, classifier.

    Forward: channels-last ``(B, *grid, in_dim)`` -> logits ``(B, num_classes)``, or the pooled
    ``(B, hidden_dim)`` with ``pre_logits=True`` (also when ``num_classes == 0``).
    ``global_pool=''`` leaves out the pooling: channels-first maps ``(B, num_classes, *grid)``
    (``(B, hidden_dim, *grid)`` with ``pre_logits`` or ``num_classes == 0``), the classifier
    applied per token.
    """

    def __init__(self, in_dim: int, num_classes: int, hidden_dim: int = 1024, global_pool: str = "avg"):
        super().__init__()
        self.hidden_dim = hidden_dim
        self.fc1 = nn.Linear(in_dim, hidden_dim)
        self.norm = nn.BatchNorm1d(hidden_dim)
        self.global_pool = _check_pool(global_pool)
        self.fc = nn.Linear(hidden_dim, num_classes) if num_classes > 0 else nn.Identity()

    def reset(self, num_classes: int, global_pool: str | None = None) -> None:
        """New classifier for ``num_classes`` (0: none); ``global_pool`` ``'avg'`` or ``''`` if given."""
        if global_pool is not None:
            self.global_pool = _check_pool(global_pool)
        self.fc = nn.Linear(self.hidden_dim, num_classes) if num_classes > 0 else nn.Identity()

    def forward(self, x: torch.Tensor, pre_logits: bool = False) -> torch.Tensor:
        grid = x.shape[1:-1]
        x = self.fc1(x.flatten(1, -2)).transpose(1, 2)  # (B, hidden, N); tokens first: one product
        x = F.silu(self.norm(x))
        if self.global_pool == "avg":
            x = x.mean(-1)
            return x if pre_logits else self.fc(x)
        if not pre_logits:
            x = self.fc(x.transpose(1, 2)).transpose(1, 2)  # (B, num_classes, N)
        return x.unflatten(2, grid)


class NormPoolHead(nn.Module):
    """``fc(mean(norm(x)))``: LayerNorm (eps 1e-5), average pool, classifier (the MILA and VMamba releases').

    Forward: channels-last ``(B, *grid, in_dim)`` -> logits ``(B, num_classes)``, or the pooled
    ``(B, in_dim)`` with ``pre_logits=True`` (also when ``num_classes == 0``).
    ``global_pool=''``: no pooling, channels-first ``(B, num_classes or in_dim, *grid)``.
    """

    def __init__(self, in_dim: int, num_classes: int, global_pool: str = "avg"):
        super().__init__()
        self.hidden_dim = in_dim
        self.norm = nn.LayerNorm(in_dim)
        self.global_pool = _check_pool(global_pool)
        self.fc = nn.Linear(in_dim, num_classes) if num_classes > 0 else nn.Identity()

    def reset(self, num_classes: int, global_pool: str | None = None) -> None:
        """New classifier for ``num_classes`` (0: none); ``global_pool`` ``'avg'`` or ``''`` if given."""
        if global_pool is not None:
            self.global_pool = _check_pool(global_pool)
        self.fc = nn.Linear(self.hidden_dim, num_classes) if num_classes > 0 else nn.Identity()

    def forward(self, x: torch.Tensor, pre_logits: bool = False) -> torch.Tensor:
        x = self.norm(x)
        if self.global_pool == "avg":
            x = x.flatten(1, -2).mean(1)
            return x if pre_logits else self.fc(x)
        if not pre_logits:
            x = self.fc(x)
        return x.movedim(-1, 1)


class TokenPoolHead(nn.Module):
    """Pool a token sequence, then classify: ``fc(pool(x))``.

    ``global_pool``: ``'token'`` (the first token, the class token), ``'avg'`` (mean of the
    tokens after the ``num_prefix_tokens`` prefix tokens) or ``''`` (no pooling: per token).
    Forward: ``(B, N, dim)`` -> ``(B, num_classes)`` (``''``: ``(B, N, num_classes)``); with
    ``pre_logits`` or ``num_classes == 0`` the pooled features (width ``hidden_dim = dim``).
    """

    def __init__(self, dim: int, num_classes: int, num_prefix_tokens: int = 1, global_pool: str = "token"):
        super().__init__()
        self.hidden_dim = dim
        self.num_prefix_tokens = num_prefix_tokens
        self.global_pool = _check_pool(global_pool, TOKEN_POOLS)
        self.fc = nn.Linear(dim, num_classes) if num_classes > 0 else nn.Identity()

    def reset(self, num_classes: int, global_pool: str | None = None) -> None:
        """New classifier for ``num_classes`` (0: none); ``global_pool`` if given."""
        if global_pool is not None:
            self.global_pool = _check_pool(global_pool, TOKEN_POOLS)
        self.fc = nn.Linear(self.hidden_dim, num_classes) if num_classes > 0 else nn.Identity()

    def forward(self, x: torch.Tensor, pre_logits: bool = False) -> torch.Tensor:
        if self.global_pool == "token":
            x = x[:, 0]
        elif self.global_pool == "avg":
            x = x[:, self.num_prefix_tokens :].mean(1)
        return x if pre_logits else self.fc(x)


def _check_pool(global_pool: str, pools: tuple[str, ...] = POOLS) -> str:
    if global_pool not in pools:
        raise ValueError(f"global_pool must be one of {pools} ('': no pooling), got {global_pool!r}")
    return global_pool
