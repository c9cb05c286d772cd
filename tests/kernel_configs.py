"""Choosing the configuration a kernel test runs: Triton's interpreter runs an autotuned kernel's
first configuration only, so a test of another makes it the first."""
from __future__ import annotations


def run_config(monkeypatch, kernels, **tuned) -> None:
    """Make each of the autotuned ``kernels`` run its first configuration whose tuned values
    include ``tuned`` (e.g. ``BLOCK=16``)."""
    for kernel in kernels:
        chosen = [c for c in kernel.tuning.configs if all(c.kwargs.get(k) == v for k, v in tuned.items())][:1]
        assert chosen, f"{kernel.fn.__name__} has no configuration with {tuned}"
        monkeypatch.setattr(kernel, "configs", chosen)
