"""Prometheus metrics, on a ``CollectorRegistry`` the host passes in.

Names, types and labels are the contract of ``docs/telemetry.md``. Metrics are created
once per registry (several dispatchers may share one) and label children are bound once
per label set, so the hot path does no label lookups. Gauges carry a multiprocess mode,
so hosts running several worker processes (``PROMETHEUS_MULTIPROC_DIR``) aggregate them.

The breaker gauges read from the breakers' windows (failure and slow-call rates, the current
break) cost the dispatch path nothing: a collector computes them at scrape time from every
:class:`~toolrelay.breakers.Breakers` watched on the registry (held weakly, so a dispatcher
that is garbage-collected drops out). In multiprocess mode a scrape never reaches the worker
processes, so each process copies them into ``livemax`` gauges every
:data:`BREAKER_REFRESH_S` seconds instead, from a daemon thread.
"""

from __future__ import annotations

import math
import os
import threading
import time
import weakref
from bisect import bisect_left
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

from prometheus_client import REGISTRY, CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

if TYPE_CHECKING:
    from ..breakers import Breakers, KeyBreaker

__all__ = [
    "BREAKER_GAUGES",
    "BREAKER_REFRESH_S",
    "DURATION_BUCKETS",
    "EXEMPLAR_INTERVAL_S",
    "UNKNOWN_TOOL",
    "ExemplarGate",
    "Metrics",
    "adder",
]

UNKNOWN_TOOL = "_unknown"
"""The ``tool`` label of calls naming a tool nobody registered (never the made-up name)."""

DURATION_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
OVERRUN_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0)
SLOT_BUCKETS = (0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 20.0, 30.0, 60.0, 120.0, 300.0)
STATES = ("closed", "open", "half_open")

Add = Callable[[float], None]


def adder(child: Counter | Gauge) -> Add:
    """``child.inc`` of a bound counter or gauge child, without its per-call checks.

    The one place toolrelay reaches past prometheus-client's public API, for the four updates
    every dispatch makes (in-flight up and down, calls, attempts). The public ``inc``
    re-checks on every call what cannot change for a bound child (that it has label values,
    the gauge's mode, a counter's sign: toolrelay never adds a negative amount to one); that
    is ~1.5 µs of a ~28 µs dispatch on the bench machine, a fifth of telemetry's share. This
    calls the child's value store (``MutexValue``, or the file-backed value in multiprocess
    mode), falling back to the public ``inc`` if a release moves it. What it relies on, that
    an amount added there is what ``generate_latest`` reports in both modes, is pinned by
    ``tests/test_telemetry.py::test_adder_writes_what_prometheus_client_reports``.
    """
    inc = getattr(getattr(child, "_value", None), "inc", None)
    return inc if callable(inc) else child.inc


EXEMPLAR_INTERVAL_S = 1.0
"""How often, at most, one bucket of one ``{tool, outcome}`` duration series takes a new
exemplar (see :class:`ExemplarGate`)."""


class ExemplarGate:
    """Which observations of one ``{tool, outcome}`` duration series carry an exemplar.

    Prometheus keeps one exemplar per histogram bucket, the latest, so attaching one to
    every observation is work thrown away (formatting the trace id and validating the
    exemplar cost more than the observation itself). An observation carries one when its
    bucket has taken none for :data:`EXEMPLAR_INTERVAL_S`: the first call of every series
    (a failure's outcome is a series of its own), the first call to reach a bucket (a slow
    call's bucket is seldom reached) and then at most one a second per bucket. A bucket's
    exemplar is thus never from a call more than that interval older than its latest one.
    ``now`` is any monotonic clock in seconds (the dispatch's ``perf_counter``); callers
    racing from several threads may at worst attach one more or one fewer.
    """

    __slots__ = ("_interval_s", "_next")

    def __init__(self) -> None:
        self._interval_s = EXEMPLAR_INTERVAL_S
        self._next = [-math.inf] * (len(DURATION_BUCKETS) + 1)  # the last: +Inf

    def due(self, seconds: float, now: float) -> bool:
        bucket = bisect_left(DURATION_BUCKETS, seconds)  # Prometheus buckets are ``le``
        if now < self._next[bucket]:
            return False
        self._next[bucket] = now + self._interval_s
        return True


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
"""Gauges per ``breaker_key`` read from the breakers (names without the ``toolrelay_`` prefix,
help text), in the order of :func:`breaker_reading`'s values."""

BREAKER_REFRESH_S = 5.0
"""Multiprocess mode: how often each process copies its breaker readings into the gauges."""

Reading = tuple[float | None, ...]
CallChildren = tuple[Add, Histogram, Add, ExemplarGate]


def _multiprocess() -> bool:
    """The test prometheus-client makes (at import) to pick its file-backed values."""
    return "PROMETHEUS_MULTIPROC_DIR" in os.environ or "prometheus_multiproc_dir" in os.environ


def breaker_reading(breaker: KeyBreaker) -> Reading:
    """One key's values of :data:`BREAKER_GAUGES` (``None``: no such series for the key).

    Safe from any thread: it only reads (a time window is *peeked*, never advanced), so a
    scrape racing the event loop may see a call half-counted; the rates are clamped to 0–1.
    Like :meth:`KeyBreaker.rates`, other replicas' counts (shared storage) are included.
    """
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


class _BreakerCollector(Collector):
    """The breaker gauges of one registry, computed when it is scraped."""

    def __init__(self, metrics: Metrics) -> None:
        self._metrics = weakref.ref(metrics)

    def _families(self) -> list[GaugeMetricFamily]:
        return [
            GaugeMetricFamily(f"toolrelay_{name}", doc, labels=("breaker_key",))
            for name, doc in BREAKER_GAUGES
        ]

    def describe(self) -> Iterator[GaugeMetricFamily]:
        return iter(self._families())

    def collect(self) -> Iterator[GaugeMetricFamily]:
        families = self._families()
        metrics = self._metrics()
        readings = {} if metrics is None else metrics.breaker_readings()
        for key in sorted(readings):
            for family, value in zip(families, readings[key], strict=True):
                if value is not None:
                    family.add_metric((key,), value)
        return iter(families)


def _refresh_loop(ref: weakref.ref[Metrics], pid: int) -> None:
    """Multiprocess mode: copy the readings into the gauges until the registry is gone."""
    while True:
        time.sleep(BREAKER_REFRESH_S)
        metrics = ref()
        if metrics is None or metrics._refresher_pid != pid:
            return
        metrics.refresh_breaker_gauges()
        del metrics


_BY_REGISTRY: weakref.WeakKeyDictionary[CollectorRegistry, Metrics] = weakref.WeakKeyDictionary()
_LOCK = threading.Lock()


class Metrics:
    """Every toolrelay metric on one registry. Get it with :meth:`on`."""

    @classmethod
    def on(cls, registry: CollectorRegistry | None = None) -> Metrics:
        registry = REGISTRY if registry is None else registry
        with _LOCK:
            metrics = _BY_REGISTRY.get(registry)
            if metrics is None:
                metrics = _BY_REGISTRY[registry] = cls(registry)
            return metrics

    def __init__(self, registry: CollectorRegistry) -> None:
        def counter(name: str, doc: str, labels: tuple[str, ...]) -> Counter:
            return Counter(name, doc, labels, namespace="toolrelay", registry=registry)

        def gauge(name: str, doc: str, labels: tuple[str, ...], mode: Any) -> Gauge:
            return Gauge(
                name, doc, labels, namespace="toolrelay", registry=registry,
                multiprocess_mode=mode,
            )  # fmt: skip

        self.calls = counter("tool_calls", "Tool calls answered, by outcome.", ("tool", "outcome"))
        self.duration = Histogram(
            "tool_call_duration_seconds",
            "Time from dispatch to answer.",
            ("tool", "outcome"),
            namespace="toolrelay",
            registry=registry,
            buckets=DURATION_BUCKETS,
        )
        self.attempts = counter(
            "tool_attempts", "Attempts made (retries included), by result.", ("tool", "result")
        )
        self.retries = counter("tool_retries", "Retries scheduled after a failure.", ("tool",))
        self.inflight = gauge("tool_inflight", "Calls being dispatched now.", ("tool",), "livesum")
        self.breaker_state = gauge(
            "breaker_state",
            "Breaker state per key: one series per state, the current one is 1.",
            ("breaker_key", "state"),
            "livemax",
        )
        self.transitions = counter(
            "breaker_transitions",
            "Breaker state transitions.",
            ("breaker_key", "from_state", "to_state"),
        )
        self.breaker_rejected = counter(
            "breaker_rejected", "Attempts refused by an open breaker.", ("breaker_key",)
        )
        self.bulkhead_rejected = counter(
            "bulkhead_rejected", "Attempts refused by a full bulkhead.", ("breaker_key",)
        )
        self.abandoned = gauge(
            "abandoned_workers",
            "Sync handler threads abandoned at a deadline and still running.",
            ("breaker_key",),
            "livesum",
        )
        self.processes_killed = counter(
            "worker_processes_killed",
            'Worker processes (isolation="process") killed at a deadline or a cancellation.',
            ("breaker_key",),
        )
        self.overrun = Histogram(
            "deadline_overrun_seconds",
            "For timeouts: answer time minus the call's deadline.",
            namespace="toolrelay",
            registry=registry,
            buckets=OVERRUN_BUCKETS,
        )
        self.slot_hold = Histogram(
            "slot_hold_seconds",
            "How long a model slot was held.",
            namespace="toolrelay",
            registry=registry,
            buckets=SLOT_BUCKETS,
        )
        self.slot_budget = gauge(
            "slot_budget_seconds", "Budget of the most recent model slot hold.", (), "livemax"
        )
        self.faults = counter("faults_injected", "Chaos faults injected.", ("tool", "fault"))
        self.storage_up = gauge(
            "breaker_storage_up",
            "1 when shared breaker storage answers (or none is configured), 0 when degraded.",
            (),
            "livemin",
        )
        self.storage_up.set(1)
        self.hedges = counter(
            "hedges",
            "Hedged attempts: won (its answer was used), lost, or skipped (not started).",
            ("breaker_key", "hedge"),
        )
        self.budget_exhausted = counter(
            "retry_budget_exhausted",
            "Retries or hedges not made because the key's retry budget was spent.",
            ("breaker_key", "kind"),
        )
        self.fallbacks = counter(
            "fallbacks",
            "Fallback tools tried for a call, by their answer (ok or the error_type).",
            ("tool", "fallback", "result"),
        )
        self.concurrency_limit = gauge(
            "concurrency_limit",
            'The adaptive concurrency limit of a key (max_concurrent = "adaptive").',
            ("breaker_key",),
            "livesum",
        )
        self.concurrency_in_flight = gauge(
            "concurrency_in_flight",
            "The most calls in flight on an adaptive key during its latest window.",
            ("breaker_key",),
            "livesum",
        )
        self.concurrency_limit_min = gauge(
            "concurrency_limit_min",
            "The lowest the adaptive concurrency limit of a key may go (adaptive_min).",
            ("breaker_key",),
            "livesum",
        )
        self._watched: weakref.WeakSet[Breakers] = weakref.WeakSet()
        self._watch_lock = threading.Lock()
        self._refresh_lock = threading.Lock()
        self._multiprocess = _multiprocess()
        self._refresher_pid = 0
        self._breaker_gauges: list[Gauge] = []
        self._reported: set[str] = set()
        if self._multiprocess:
            self._breaker_gauges = [
                gauge(name, doc, ("breaker_key",), "livemax") for name, doc in BREAKER_GAUGES
            ]
        else:
            registry.register(_BreakerCollector(self))
        self._call_children: dict[tuple[str, str], CallChildren] = {}
        self._inflight_children: dict[str, Add] = {}
        self._attempt_children: dict[tuple[str, str], Add] = {}
        self._key_children: dict[tuple[int, str], Add] = {}

    def call_children(self, tool: str, outcome: str) -> CallChildren:
        """(calls adder, duration histogram, attempts adder, the duration's exemplar gate) for
        one label set, bound once."""
        entry = self._call_children.get((tool, outcome))
        if entry is None:
            entry = (
                adder(self.calls.labels(tool, outcome)),
                self.duration.labels(tool, outcome),
                adder(self.attempts.labels(tool, outcome)),
                ExemplarGate(),
            )
            self._call_children[(tool, outcome)] = entry
        return entry

    def attempt_child(self, tool: str, result: str) -> Add:
        add = self._attempt_children.get((tool, result))
        if add is None:
            add = self._attempt_children[(tool, result)] = adder(self.attempts.labels(tool, result))
        return add

    def key_child(self, metric: Any, key: str) -> Add:
        """The :func:`adder` of a ``{breaker_key}`` counter's child, bound once."""
        add = self._key_children.get((id(metric), key))
        if add is None:
            add = self._key_children[(id(metric), key)] = adder(metric.labels(key))
        return add

    def inflight_child(self, tool: str) -> Add:
        add = self._inflight_children.get(tool)
        if add is None:
            add = self._inflight_children[tool] = adder(self.inflight.labels(tool))
        return add

    def set_breaker_state(self, key: str, state: str) -> None:
        for name in STATES:
            self.breaker_state.labels(key, name).set(1 if name == state else 0)

    # -- breaker gauges (read at scrape time) ---------------------------------------------
    def watch(self, breakers: Breakers) -> None:
        """Report ``breakers`` in the breaker gauges for as long as it lives (held weakly;
        watching it again does nothing)."""
        with self._watch_lock:
            new = breakers not in self._watched
            self._watched.add(breakers)
        if self._multiprocess:
            self._start_refresher()
            if new:
                self.refresh_breaker_gauges()

    def breaker_readings(self) -> dict[str, Reading]:
        """Every watched key's :func:`breaker_reading`; a key several watched dispatchers
        share reports, per gauge, the highest value."""
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

    def refresh_breaker_gauges(self) -> None:
        """Multiprocess mode: copy the readings into the ``livemax`` gauges. Keys no longer
        watched (their dispatcher is gone) drop their rates and break to 0 (the series of a
        file-backed gauge cannot be removed), so they neither show a stale break nor alert."""
        if not self._breaker_gauges:
            return
        with self._refresh_lock:
            readings = self.breaker_readings()
            for key, reading in readings.items():
                for gauge, value in zip(self._breaker_gauges, reading, strict=True):
                    if value is not None:
                        gauge.labels(key).set(value)
            for key in self._reported - readings.keys():
                for gauge in self._breaker_gauges[:3]:  # rates and break; settings stay
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
    """A forked worker (multiprocess mode) refreshes its own copy of the breaker gauges; the
    parent's refresher thread did not survive the fork, and its locks may have been held."""
    for metrics in list(_BY_REGISTRY.values()):
        metrics._watch_lock = threading.Lock()
        metrics._refresh_lock = threading.Lock()
        if metrics._multiprocess and len(metrics._watched):
            metrics._start_refresher()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)
