"""Triton kernels, one folder per op (``kernels/<op>/``), installed as ``ppma.kernels``.

``common/`` holds what several kernels share: whether and how Triton runs here
(:mod:`ppma.kernels.common.runtime`) and strided-addressing helpers. Dependencies point down:
``ppma.ops`` imports kernels, kernels never import ``ppma.ops``. The benchmarks in ``bench/`` are
scripts (not installed) and compare kernels with the ops' references.
"""
