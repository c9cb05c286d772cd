"""The launchers' integer helpers equal Triton's own (``triton.cdiv``, ``triton.next_power_of_2``),
constexpr functions whose wrapper costs the host far more than the arithmetic."""
from __future__ import annotations

import pytest

triton = pytest.importorskip("triton", reason="the Triton kernels need the 'triton' package")


def test_cdiv_and_pow2_equal_tritons():
    from ppma.kernels.common.strided import cdiv, pow2

    assert [pow2(v) for v in range(1, 4100)] == [triton.next_power_of_2(v) for v in range(1, 4100)]
    assert pow2(0) == 1 and pow2(2**40 + 1) == 2**41
    pairs = [(a, b) for a in range(0, 300) for b in range(1, 70)]
    assert [cdiv(a, b) for a, b in pairs] == [triton.cdiv(a, b) for a, b in pairs]
