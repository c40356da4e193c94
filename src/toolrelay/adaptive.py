"""An adaptive concurrency limit: how many calls a breaker key may have in flight, following
the service's latency (``max_concurrent = "adaptive"``).

A gradient limit after Netflix's ``Gradient2Limit`` and Envoy's adaptive concurrency
filter: each window's 90th-percentile round trip against a no-load baseline (measured in
probe windows at ``min_limit``) moves the limit by ``baseline × tolerance / sample`` plus
√limit of headroom; timeouts cut it by ``backoff``; an app-limited window does not grow
it. The algorithm step by step: ``docs/adaptive-concurrency.md``. Cancelled attempts are
not recorded. The clock is a parameter (tests run it on a fake one); no lock, no I/O.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable

Clock = Callable[[], float]


class AdaptiveLimit:
    """The limit of one breaker key. :attr:`limit` is how many calls may be in flight.

    ``record(rtt, in_flight)`` after each attempt that reached the service (``dropped``
    for a timeout); it returns True when a window ended (the limit was re-evaluated).
    """

    __slots__ = (
        "_at_min",
        "_drops",
        "_end",
        "_estimate",
        "_next_probe",
        "_peak",
        "_samples",
        "backoff",
        "baseline",
        "baseline_s",
        "clock",
        "last_rtt",
        "max_limit",
        "min_limit",
        "min_samples",
        "peak",
        "probing",
        "smoothing",
        "tolerance",
        "window_max_s",
        "window_s",
    )

    def __init__(
        self,
        min_limit: int = 2,
        max_limit: int = 100,
        *,
        initial: int | None = None,
        min_samples: int = 10,
        window_s: float = 0.05,
        window_max_s: float = 1.0,
        baseline_s: float = 30.0,
        tolerance: float = 0.95,
        smoothing: float = 0.3,
        backoff: float = 0.9,
        clock: Clock = time.monotonic,
    ) -> None:
        if not 1 <= min_limit <= max_limit:
            raise ValueError(f"need 1 ≤ min_limit ≤ max_limit, not {min_limit}, {max_limit}")
        self.min_limit = min_limit
        self.max_limit = max_limit
        self.min_samples = min_samples
        self.window_s = window_s
        self.window_max_s = window_max_s
        self.baseline_s = baseline_s
        self.tolerance = tolerance
        self.smoothing = smoothing
        self.backoff = backoff
        self.clock = clock
        start = min(max_limit, max(min_limit, 20)) if initial is None else initial
        self._estimate = float(min(max_limit, max(min_limit, start)))
        self._samples: list[float] = []
        self._drops = 0
        self._peak = 0
        self._end = clock() + window_s
        self._next_probe = math.inf
        self._at_min = 0
        self.probing = True
        """Measuring the baseline: the limit is ``min_limit`` until the window ends."""
        self.baseline: float | None = None
        """The no-load RTT (None before the first probe ends)."""
        self.peak = 0
        """The most calls in flight during the latest window."""
        self.last_rtt: float | None = None
        """The latest window's sample: what a rejected caller is told to wait."""

    @property
    def limit(self) -> int:
        return self.min_limit if self.probing else int(self._estimate)

    def retry_after_s(self) -> float:
        """How long a rejected caller should wait: about one RTT, when places free up."""
        rtt = self.last_rtt if self.last_rtt is not None else self.window_s
        return max(0.01, math.ceil(rtt * 100) / 100)

    def record(self, rtt: float, in_flight: int, *, dropped: bool = False) -> bool:
        """One attempt ended after ``rtt`` seconds with ``in_flight`` calls holding places
        (itself included); ``dropped`` if it timed out."""
        if self.probing and in_flight > self.min_limit:
            pass  # admitted before the probe, at a higher concurrency: not a no-load time
        elif dropped:
            self._drops += 1
        else:
            self._samples.append(rtt)
        if in_flight > self._peak:
            self._peak = in_flight
        now = self.clock()
        if now < self._end or len(self._samples) + self._drops < self.min_samples:
            return False
        samples, drops, self.peak = self._samples, self._drops, self._peak
        self._samples, self._drops, self._peak = [], 0, 0
        if self.probing:
            self._probed(now, samples, drops)
        else:
            self._update(now, samples, drops)
        return True

    def _probed(self, now: float, samples: list[float], drops: int) -> None:
        if drops:  # timeouts even at the minimum: keep probing, resume lower
            self._estimate = max(float(self.min_limit), self._estimate * self.backoff)
            return
        samples.sort()
        self.baseline = self.last_rtt = samples[min(len(samples) - 1, int(len(samples) * 0.9))]
        self.probing = False
        self._at_min = 0
        self._next_probe = now + self.baseline_s
        self._end = now + min(self.window_max_s, max(self.window_s, 2 * samples[0]))

    def _update(self, now: float, samples: list[float], drops: int) -> None:
        estimate = self._estimate
        shortest = self.window_s
        if drops:
            estimate *= self.backoff
        if samples:
            samples.sort()
            shortest = samples[0]
            sample = samples[min(len(samples) - 1, int(len(samples) * 0.9))]
            self.last_rtt = sample
            assert self.baseline is not None
            baseline = self.baseline = min(self.baseline, sample)
            if not drops:
                gradient = max(0.5, min(1.0, self.tolerance * baseline / sample))
                target = estimate * gradient + math.sqrt(estimate)
                if target > estimate and self.peak * 2 < estimate:
                    target = estimate  # app-limited: the service was not the bottleneck
                estimate += self.smoothing * (target - estimate)
        self._estimate = min(float(self.max_limit), max(float(self.min_limit), estimate))
        self._end = now + min(self.window_max_s, max(self.window_s, 2 * shortest))
        self._at_min = self._at_min + 1 if self.limit == self.min_limit else 0
        if now >= self._next_probe or self._at_min >= 5:
            self.probing = True  # measure the baseline again; resume from this estimate
