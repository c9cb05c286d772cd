"""Time limits for a report's sections: one total budget, shared out as the sections start.

A section gets its weight's share of the time still left when it starts, so the time that a
section leaves unused goes to the sections after it. Inside a section, :class:`Deadline` tells
loops how much time is left, and :meth:`Budget.section` stops the section with
:class:`SectionTimeout` when its limit passes (a ``SIGALRM`` timer, in the main thread).
"""
from __future__ import annotations

import contextlib
import signal
import threading
import time
from collections.abc import Callable, Iterator


class SectionTimeout(BaseException):
    """A section's time limit passed. A ``BaseException``, so that a section's per-item
    ``except Exception`` handlers let it through to the code that runs the section."""


class Deadline:
    """A point in time ``seconds`` from now on ``clock``."""

    def __init__(self, seconds: float, clock: Callable[[], float] = time.monotonic):
        self.seconds = seconds
        self._clock = clock
        self._end = clock() + seconds

    def left(self) -> float:
        """Seconds until the deadline (0 once it passed)."""
        return max(0.0, self._end - self._clock())


class Budget:
    """``total`` seconds for the sections named in ``weights`` (name -> positive weight)."""

    def __init__(self, total: float, weights: dict[str, float], clock: Callable[[], float] = time.monotonic):
        if total <= 0:
            raise ValueError(f"the time budget must be positive, got {total} s")
        bad = {name: w for name, w in weights.items() if not w > 0}
        if bad:
            raise ValueError(f"section weights must be positive, got {bad}")
        self._clock = clock
        self._deadline = Deadline(total, clock)
        self._pending = dict(weights)

    def left(self) -> float:
        """Seconds left of the whole budget."""
        return self._deadline.left()

    def share(self, name: str) -> float:
        """Start section ``name``: its seconds, ``left() * weight / (its weight + the weights of
        the sections not started yet)``. Each section starts once."""
        if name not in self._pending:
            raise ValueError(f"section {name!r} is not one of the budget's sections not started yet: "
                             f"{sorted(self._pending)}")
        weight = self._pending[name]
        total_weight = sum(self._pending.values())
        del self._pending[name]
        return self.left() * weight / total_weight

    @contextlib.contextmanager
    def section(self, name: str) -> Iterator[Deadline]:
        """Run section ``name`` within its share: yields its :class:`Deadline`, raises
        :class:`SectionTimeout` in the block when the share has passed (at once when it is 0)."""
        deadline = Deadline(self.share(name), self._clock)
        with time_limit(deadline.seconds):
            yield deadline


@contextlib.contextmanager
def time_limit(seconds: float) -> Iterator[None]:
    """Raise :class:`SectionTimeout` in the block after ``seconds``. The timer needs the main
    thread (Python delivers signals there); elsewhere the block runs to its end and only the
    callers' :class:`Deadline` checks limit it."""
    if seconds <= 0:
        raise SectionTimeout(f"no time left (limit {seconds:.0f} s)")
    if threading.current_thread() is not threading.main_thread() or not hasattr(signal, "setitimer"):
        yield
        return

    def expire(signum, frame):
        raise SectionTimeout(f"time limit of {seconds:.0f} s reached")

    previous = signal.signal(signal.SIGALRM, expire)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
