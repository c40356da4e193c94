"""The breaker gauges: failure and slow-call rates, the current break and the key's
settings, read from the breakers' windows.

They cost the dispatch path nothing: a collector computes them at scrape time from every
:class:`~toolrelay.breakers.Breakers` watched on the registry (held weakly, so a dispatcher
that is garbage-collected drops out). In multiprocess mode a scrape never reaches the worker
processes, so each process copies them into ``livemax`` gauges every
:data:`BREAKER_REFRESH_S` seconds instead, from a daemon thread.
"""

from __future__ import annotations

import os
import threading
import time
import weakref
from collections.abc import Callable, Iterator
from typing import Any

from prometheus_client import CollectorRegistry, Gauge
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from ..breakers import Breakers, KeyBreaker

BREAKER_GAUGES: tuple[tuple[str, str], ...] = (
    (
        "breaker_failure_rate",
        "Failed share (0-1) of the calls in the breaker key's window; "
        "count and time windows only. Computed at scrape time.",
    ),
    (
        "breaker_slow_call_rate",
        "Share (0-1) of the calls in the breaker key's window slower than slow_call_s; "
        "count and time windows only. Computed at scrape time.",
    ),
    (
        "breaker_break_duration_seconds",
        "The key's current break: how long its breaker stays open each time it opens, "
        "grown by failed trials up to reset_timeout_max_s. Computed at scrape time.",
    ),
    (
        "breaker_failure_rate_threshold",
        "The key's failure_rate setting: the window's failed share that opens the breaker; "
        "count and time windows only.",
    ),
    (
        "breaker_slow_call_rate_threshold",
        "The key's slow_call_rate setting: the window's slow share that opens the breaker; "
        "only when set.",
    ),
    (
        "breaker_break_duration_max_seconds",
        "The key's reset_timeout_max_s: the longest break; only when the break can grow "
        "(above reset_timeout_s).",
    ),
)
"""(name without ``toolrelay_``, help text), in the order of :func:`breaker_reading`'s values."""

BREAKER_REFRESH_S = 5.0
"""Multiprocess mode: how often each process copies its breaker readings into the gauges."""

Reading = tuple[float | None, ...]


def breaker_reading(breaker: KeyBreaker) -> Reading:
    """One key's values of :data:`BREAKER_GAUGES` (``None``: no such series for the key).
    Safe from any thread: it only reads (a scrape racing the loop may see a call
    half-counted; the rates are clamped to 0–1)."""
    options = breaker.options
    failure_rate = slow_rate = failure_limit = slow_limit = None
    if breaker.window is not None:
        failure_rate, slow_rate = breaker.rates()
        failure_limit = float(options.failure_rate)
        if options.slow_call_rate is not None:
            slow_limit = float(options.slow_call_rate)
    top = options.reset_timeout_max_s
    grows = top is not None and top > options.reset_timeout_s
    return (
        failure_rate,
        slow_rate,
        float(breaker.break_s),
        failure_limit,
        slow_limit,
        float(top) if grows and top is not None else None,
    )


def _refresh_loop(ref: weakref.ref[BreakerGauges], pid: int) -> None:
    """Multiprocess mode: copy the readings into the gauges until the registry is gone."""
    while True:
        time.sleep(BREAKER_REFRESH_S)
        gauges = ref()
        if gauges is None or gauges._refresher_pid != pid:
            return
        gauges.refresh()
        del gauges


GaugeFactory = Callable[[str, str, tuple[str, ...], Any], Gauge]
_ALL: weakref.WeakSet[BreakerGauges] = weakref.WeakSet()


class BreakerGauges(Collector):
    """The breaker gauges of one registry: a collector computing them when it is scraped,
    or (multiprocess mode) ``livemax`` gauges made with ``gauge`` and refreshed from a daemon
    thread."""

    def __init__(self, registry: CollectorRegistry, gauge: GaugeFactory) -> None:
        self._watched: weakref.WeakSet[Breakers] = weakref.WeakSet()
        self._watch_lock = threading.Lock()
        self._refresh_lock = threading.Lock()
        # the test prometheus-client makes (at import) to pick its file-backed values
        self._multiprocess = any(
            name in os.environ for name in ("PROMETHEUS_MULTIPROC_DIR", "prometheus_multiproc_dir")
        )
        self._refresher_pid = 0
        self._gauges: list[Gauge] = []
        self._reported: set[str] = set()
        if self._multiprocess:
            self._gauges = [
                gauge(name, doc, ("breaker_key",), "livemax") for name, doc in BREAKER_GAUGES
            ]
        else:
            registry.register(self)
        _ALL.add(self)

    def _families(self) -> list[GaugeMetricFamily]:
        return [
            GaugeMetricFamily(f"toolrelay_{name}", doc, labels=("breaker_key",))
            for name, doc in BREAKER_GAUGES
        ]

    def describe(self) -> Iterator[GaugeMetricFamily]:
        return iter(self._families())

    def collect(self) -> Iterator[GaugeMetricFamily]:
        families = self._families()
        readings = self.readings()
        for key in sorted(readings):
            for family, value in zip(families, readings[key], strict=True):
                if value is not None:
                    family.add_metric((key,), value)
        return iter(families)

    def watch(self, breakers: Breakers) -> None:
        """Report ``breakers`` for as long as it lives (held weakly)."""
        with self._watch_lock:
            new = breakers not in self._watched
            self._watched.add(breakers)
        if self._multiprocess:
            self._start_refresher()
            if new:
                self.refresh()

    def readings(self) -> dict[str, Reading]:
        """Every watched key's :func:`breaker_reading` (the highest, per gauge, of a key
        several watched dispatchers share)."""
        with self._watch_lock:
            watched = list(self._watched)
        out: dict[str, Reading] = {}
        for breakers in watched:
            for breaker in list(breakers._breakers.values()):
                reading = breaker_reading(breaker)
                seen = out.get(breaker.key)
                if seen is not None:
                    reading = tuple(
                        b if a is None else a if b is None else max(a, b)
                        for a, b in zip(seen, reading, strict=True)
                    )
                out[breaker.key] = reading
        return out

    def refresh(self) -> None:
        """Multiprocess mode: copy the readings into the ``livemax`` gauges. Keys no longer
        watched drop their rates and break to 0 (a file-backed series cannot be removed)."""
        if not self._gauges:
            return
        with self._refresh_lock:
            readings = self.readings()
            for key, reading in readings.items():
                for gauge, value in zip(self._gauges, reading, strict=True):
                    if value is not None:
                        gauge.labels(key).set(value)
            for key in self._reported - readings.keys():
                for gauge in self._gauges[:3]:  # rates and break; settings stay
                    gauge.labels(key).set(0)
            self._reported = set(readings)

    def _start_refresher(self) -> None:
        pid = os.getpid()
        if self._refresher_pid == pid:
            return
        with self._watch_lock:
            if self._refresher_pid == pid:
                return
            self._refresher_pid = pid  # a forked child starts its own on its next watch
        threading.Thread(
            target=_refresh_loop,
            args=(weakref.ref(self), pid),
            name="toolrelay-breaker-metrics",
            daemon=True,
        ).start()


def _after_fork_in_child() -> None:
    """The parent's refresher thread did not survive the fork, and its locks may be held."""
    for gauges in list(_ALL):
        gauges._watch_lock = threading.Lock()
        gauges._refresh_lock = threading.Lock()
        if gauges._multiprocess and len(gauges._watched):
            gauges._start_refresher()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)
