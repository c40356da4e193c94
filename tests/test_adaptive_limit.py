"""The adaptive concurrency limit: the algorithm on a fake clock. Through the dispatcher:
``test_adaptive_dispatch.py``; the side-by-side experiment: ``test_adaptive_experiment.py``."""

from __future__ import annotations

from typing import Any

import pytest

from toolrelay.adaptive import AdaptiveLimit


class FakeClock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def drive(
    limit: AdaptiveLimit,
    clock: FakeClock,
    rtt_at: Any,
    windows: int,
    *,
    in_flight: Any = None,
    dropped: bool = False,
) -> list[int]:
    """Feed ``windows`` windows of 10 answers each; every answer saw ``in_flight(limit)``
    calls in flight (default: the limit, a saturating load; never more than the limit)
    and took ``rtt_at(in_flight)``. Returns the limit after each window."""
    seen = []
    for _ in range(windows):
        n = limit.limit if in_flight is None else min(limit.limit, in_flight(limit.limit))
        rtt = rtt_at(n)
        for _ in range(10):
            clock.now += rtt / 10
            limit.record(rtt, n, dropped=dropped)
        clock.now += limit.window_max_s  # the window's time is up: the next answer ends it
        seen.append(limit.limit)
    return seen


def congested(capacity: int, base: float = 0.05) -> Any:
    """A service whose latency grows past ``capacity`` calls in flight."""
    return lambda n: base * max(1.0, n / capacity) ** 2


def test_converges_down_under_rising_latency() -> None:
    clock = FakeClock()
    limit = AdaptiveLimit(1, 200, initial=100, clock=clock)
    seen = drive(limit, clock, congested(20), 80)
    assert seen[0] < 100
    settled = seen[-20:]
    assert all(18 <= x <= 24 for x in settled), settled


def test_recovers_up_when_latency_falls() -> None:
    clock = FakeClock()
    limit = AdaptiveLimit(1, 200, initial=50, clock=clock)
    drive(limit, clock, congested(10), 60)
    low = limit.limit
    assert low <= 13
    seen = drive(limit, clock, congested(60), 80)  # the service got faster (more capacity)
    assert seen[-1] >= 55 and seen[-1] > low * 4, seen


def test_respects_min_and_max() -> None:
    clock = FakeClock()
    slow = AdaptiveLimit(3, 40, initial=20, clock=clock)
    seen = drive(slow, clock, congested(1), 60)
    assert min(seen) == 3 and seen[-1] <= 4  # never below the minimum, however slow
    fast = AdaptiveLimit(3, 40, initial=20, clock=clock)
    seen = drive(fast, clock, lambda n: 0.05, 60)
    assert max(seen) == 40 and seen[-1] == 40  # constant latency: up to the maximum, no more


def test_does_not_grow_when_the_caller_is_the_bottleneck() -> None:
    clock = FakeClock()
    limit = AdaptiveLimit(1, 200, initial=20, clock=clock)
    seen = drive(limit, clock, lambda n: 0.05, 40, in_flight=lambda limit: 3)
    assert seen[-1] == 20  # 3 of 20 places used: no evidence the service could take more


def test_timeouts_cut_the_limit() -> None:
    clock = FakeClock()
    limit = AdaptiveLimit(2, 100, initial=50, clock=clock)
    drive(limit, clock, lambda n: 0.05, 3)  # a baseline first
    before = limit.limit
    seen = drive(limit, clock, lambda n: 5.0, 5, dropped=True)
    assert before * 0.9 - 1 <= seen[0] <= before * 0.9 + 1 and seen[-1] < before * 0.6
    assert limit.last_rtt == pytest.approx(0.05)  # a timeout's time is not an RTT sample
    assert drive(limit, clock, lambda n: 5.0, 60, dropped=True)[-1] == 2


def test_baseline_follows_a_service_that_became_slower() -> None:
    clock = FakeClock()
    limit = AdaptiveLimit(1, 100, initial=30, baseline_s=5.0, clock=clock)
    drive(limit, clock, lambda n: 0.05, 10)
    assert limit.baseline == pytest.approx(0.05)
    drive(limit, clock, lambda n: 0.2, 40)  # 4× slower for good, whatever the load
    assert limit.baseline == pytest.approx(0.2)  # the old no-load time has aged out
    assert drive(limit, clock, lambda n: 0.2, 40)[-1] > 30  # and the limit grows again


def test_waits_for_enough_samples_and_time() -> None:
    clock = FakeClock()
    limit = AdaptiveLimit(1, 100, initial=20, min_samples=10, clock=clock)
    assert limit.probing and limit.limit == 1  # the baseline is measured first, at the minimum
    clock.now = 5.0
    for _ in range(9):
        assert not limit.record(1.0, 1)  # only 9 answers: the window goes on
    assert limit.limit == 1 and limit.baseline is None
    assert not limit.record(0.2, 8)  # admitted before the probe: not a no-load time
    assert limit.record(1.0, 1)
    assert limit.limit == 20 and limit.baseline == pytest.approx(1.0)
    assert limit.retry_after_s() == pytest.approx(1.0)


def test_probes_the_baseline_again() -> None:
    clock = FakeClock()
    limit = AdaptiveLimit(2, 100, initial=30, baseline_s=5.0, clock=clock)
    seen = drive(limit, clock, lambda n: 0.05, 30)
    assert 2 in seen[1:] and seen[-1] > 30  # dipped to the minimum to probe, then resumed


def test_rejects_bad_bounds() -> None:
    with pytest.raises(ValueError, match="min_limit"):
        AdaptiveLimit(5, 4)
    with pytest.raises(ValueError, match="min_limit"):
        AdaptiveLimit(0, 4)
