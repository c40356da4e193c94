"""Failure windows: what a closed breaker counts to decide whether to open.

``consecutive`` needs no window (pybreaker's counter); ``count`` keeps the last N recorded
calls, ``time`` the calls of the last N seconds in one-second buckets (as resilience4j).
"""

from __future__ import annotations

from .options import BreakerOptions

_FAILED, _SLOW, _SEEN = 1, 2, 4


class CountWindow:
    """The last ``size`` recorded calls: a ring of outcome codes and running totals."""

    __slots__ = ("calls", "failures", "pos", "ring", "slow")

    def __init__(self, size: int) -> None:
        self.ring = bytearray(size)
        self.pos = 0
        self.calls = self.failures = self.slow = 0

    def add(self, failed: bool, slow: bool, now: float) -> None:
        ring, pos = self.ring, self.pos
        old = ring[pos]
        if old:
            self.calls -= 1
            self.failures -= old & _FAILED
            self.slow -= (old & _SLOW) >> 1
        ring[pos] = _SEEN | failed | (slow << 1)
        self.calls += 1
        self.failures += failed
        self.slow += slow
        self.pos = pos + 1 if pos + 1 < len(ring) else 0

    def totals(self, now: float) -> tuple[int, int, int]:
        return self.calls, self.failures, self.slow

    peek = totals  # reading a count window changes nothing


class TimeWindow:
    """The calls of the last ``size`` seconds, in one-second buckets (as resilience4j)."""

    __slots__ = ("buckets", "calls", "failures", "head", "size", "slow")

    def __init__(self, size: int) -> None:
        self.size = size
        self.buckets = [[-1, 0, 0, 0] for _ in range(size)]  # second, calls, failures, slow
        self.head = -1
        self.calls = self.failures = self.slow = 0

    def _advance(self, second: int) -> None:
        """Move the window's end to ``second``, emptying the buckets that fall out."""
        size = self.size
        first = max(self.head + 1, second - size + 1)
        for s in range(first, second + 1):
            bucket = self.buckets[s % size]
            self.calls -= bucket[1]
            self.failures -= bucket[2]
            self.slow -= bucket[3]
            bucket[0], bucket[1], bucket[2], bucket[3] = s, 0, 0, 0
        self.head = second

    def add(self, failed: bool, slow: bool, now: float) -> None:
        second = int(now)
        if second > self.head:
            self._advance(second)
        elif second <= self.head - self.size:
            return  # older than the window (a clock that went back): dropped
        bucket = self.buckets[second % self.size]
        bucket[1] += 1
        bucket[2] += failed
        bucket[3] += slow
        self.calls += 1
        self.failures += failed
        self.slow += slow

    def totals(self, now: float) -> tuple[int, int, int]:
        second = int(now)
        if second > self.head:
            self._advance(second)
        return self.calls, self.failures, self.slow

    def peek(self, now: float) -> tuple[int, int, int]:
        """The totals at ``now`` without changing anything (for another thread)."""
        oldest = int(now) - self.size
        calls = failures = slow = 0
        for second, c, f, s in list(self.buckets):
            if second > oldest:
                calls += c
                failures += f
                slow += s
        return calls, failures, slow


FailureWindow = CountWindow | TimeWindow


def new_window(options: BreakerOptions) -> FailureWindow | None:
    if options.window == "count":
        return CountWindow(options.window_size)
    if options.window == "time":
        return TimeWindow(options.window_size)
    return None


def minimum_calls(options: BreakerOptions) -> int:
    """``minimum_calls``, but a count window can never hold more than ``window_size`` calls
    (as resilience4j)."""
    if options.window == "count":
        return min(options.minimum_calls, options.window_size)
    return options.minimum_calls
