"""Classification head of the PPMA release."""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


class ProjectionHead(nn.Module):
    """``fc(mean(silu(BN(fc1(x)))))``: per-token projection to ``hidden_dim``, BatchNorm, SiLU,
    global average pool, classifier.

    Forward: channels-last ``(B, *grid, in_dim)`` -> logits ``(B, num_classes)``, or the pooled
    ``(B, hidden_dim)`` with ``pre_logits=True`` (also when ``num_classes == 0``).
    """

    def __init__(self, in_dim: int, num_classes: int, hidden_dim: int = 1024):
        super().__init__()
        self.hidden_dim = hidden_dim
        self.fc1 = nn.Linear(in_dim, hidden_dim)
        self.norm = nn.BatchNorm1d(hidden_dim)
        self.fc = nn.Linear(hidden_dim, num_classes) if num_classes > 0 else nn.Identity()

    def reset(self, num_classes: int) -> None:
        self.fc = nn.Linear(self.hidden_dim, num_classes) if num_classes > 0 else nn.Identity()

    def forward(self, x: torch.Tensor, pre_logits: bool = False) -> torch.Tensor:
        x = self.fc1(x).flatten(1, -2).transpose(1, 2)  # (B, hidden, N)
        x = F.silu(self.norm(x)).mean(-1)
        return x if pre_logits else self.fc(x)
