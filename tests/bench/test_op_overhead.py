"""``tools/op_overhead.py``: both paths measured, their outputs compared (no timing asserted)."""
from unittest import mock

import pytest

from ppma.bench import op_overhead


def test_rows_for_each_pass_on_both_paths(capsys):
    op_overhead.main(["--repeats", "20"])
    out = capsys.readouterr().out
    rows = [line for line in out.splitlines() if line.startswith("| ") and not line.startswith("| pass")]
    assert [r.split("|")[1].strip() for r in rows] == ["no grad", "forward", "forward+backward"]
    assert all(float(c) > 0 for r in rows for c in r.strip("|").split("|")[1:3])


def test_disagreeing_paths_raise():
    real = op_overhead._calls

    def skewed(backend):
        calls = real(backend)
        forward = calls["forward"]
        # plain_eager([]) is 1 on the eager path and 0 where the measurement turns it off
        calls["forward"] = lambda: tuple(t + op_overhead.registry.plain_eager([]) for t in forward())
        return calls

    with mock.patch.object(op_overhead, "_calls", skewed), pytest.raises(AssertionError, match="disagree"):
        op_overhead.measure(repeats=2)
