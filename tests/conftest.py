"""Fixtures shared by the test folders: every test runs with a fixed seed."""
import random
import zlib

import numpy as np
import pytest
import torch


def seed_of(nodeid: str) -> int:
    """The fixed seed of one test: a hash of its node id, so reruns see the same data."""
    return zlib.crc32(nodeid.encode())


@pytest.fixture(autouse=True)
def fixed_seed(request):
    """Seed torch, numpy and random before every test; ``torch.initial_seed()`` returns it."""
    seed = seed_of(request.node.nodeid)
    torch.manual_seed(seed)
    np.random.seed(seed)
    random.seed(seed)
    return seed


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    """Name the seed in the report of a failed test."""
    report = (yield).get_result()
    if report.failed:
        report.sections.append(("seed", f"this test ran with seed {seed_of(item.nodeid)} (tests/conftest.py: fixed_seed)"))


@pytest.fixture
def resource_table(monkeypatch):
    """Replace the Triton kernels' resource table: ``set_to(rows)`` (see kernels/common/tuning.py)."""
    from ppma.kernels.common import tuning

    def set_to(rows: dict):
        monkeypatch.setattr(tuning, "resource_table", lambda: rows)
        tuning.unfit_variants.cache_clear()

    yield set_to
    tuning.unfit_variants.cache_clear()
