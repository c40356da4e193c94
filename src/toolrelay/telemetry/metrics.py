"""Prometheus metrics, on a ``CollectorRegistry`` the host passes in.

Names, types and labels are the contract of ``docs/telemetry.md``. Metrics are created
once per registry (several dispatchers may share one) and label children are bound once
per label set, so the hot path does no label lookups. Gauges carry a multiprocess mode,
so hosts running several worker processes (``PROMETHEUS_MULTIPROC_DIR``) aggregate them.

The gauges read from the breakers' windows are :mod:`.breaker_gauges`'.
"""

from __future__ import annotations

import functools
import math
import threading
import weakref
from bisect import bisect_left
from collections.abc import Callable
from typing import Any

from prometheus_client import REGISTRY, CollectorRegistry, Counter, Gauge, Histogram

from .._compat.prometheus_client import value_inc
from .breaker_gauges import BreakerGauges

UNKNOWN_TOOL = "_unknown"
"""The ``tool`` label of calls naming a tool nobody registered (never the made-up name)."""

DURATION_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
OVERRUN_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0)
SLOT_BUCKETS = (0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 20.0, 30.0, 60.0, 120.0, 300.0)
STATES = ("closed", "open", "half_open")

Add = Callable[[float], None]


def adder(child: Counter | Gauge) -> Add:
    """``child.inc`` of a bound counter or gauge child, without its per-call checks.

    The public ``inc`` re-checks on every call what cannot change for a bound child: ~1.5 µs
    of a ~28 µs dispatch, for the four updates every dispatch makes (see
    :func:`toolrelay._compat.prometheus_client.value_inc`). That the amount added is what
    ``generate_latest`` reports, in both modes, is pinned by
    ``tests/test_telemetry.py::test_adder_writes_what_prometheus_client_reports``.
    """
    inc = value_inc(child)
    return child.inc if inc is None else inc


EXEMPLAR_INTERVAL_S = 1.0


class ExemplarGate:
    """Which observations of one ``{tool, outcome}`` duration series carry an exemplar.

    Prometheus keeps only the latest exemplar per bucket, and making one costs more than
    the observation, so a bucket takes one only when it has taken none for
    :data:`EXEMPLAR_INTERVAL_S`: the first call of every series and of every bucket, then at
    most one a second per bucket. ``now`` is any monotonic clock in seconds.
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


CallChildren = tuple[Add, Histogram, Add, ExemplarGate]


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
        counter = functools.partial(Counter, namespace="toolrelay", registry=registry)
        histogram = functools.partial(Histogram, namespace="toolrelay", registry=registry)

        def gauge(name: str, doc: str, labels: tuple[str, ...], mode: Any) -> Gauge:
            return Gauge(
                name, doc, labels, namespace="toolrelay", registry=registry,
                multiprocess_mode=mode,
            )  # fmt: skip

        self.calls = counter("tool_calls", "Tool calls answered, by outcome.", ("tool", "outcome"))
        self.duration = histogram(
            "tool_call_duration_seconds",
            "Time from dispatch to answer.",
            ("tool", "outcome"),
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
        self.loop_blocked = counter(
            "loop_blocked_seconds",
            "Seconds async handlers held the event loop in steps of 20 ms or more.",
            ("tool",),
        )
        self.overrun = histogram(
            "deadline_overrun_seconds",
            "For timeouts: answer time minus the call's deadline.",
            (),
            buckets=OVERRUN_BUCKETS,
        )
        self.slot_hold = histogram(
            "slot_hold_seconds", "How long a model slot was held.", (), buckets=SLOT_BUCKETS
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
        self.storage_rejected = counter(
            "breaker_storage_rejected",
            "Values read from the shared breaker storage and refused (not written by toolrelay).",
            ("breaker_key", "field"),
        )
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
        self.rejected = {
            "circuit_open": self.breaker_rejected,
            "overloaded": self.bulkhead_rejected,
        }
        """An attempt's answer → the counter of attempts its key refused that way."""
        self.breakers = BreakerGauges(registry, gauge)
        """The gauges read from the breakers (``watch`` a dispatcher's breakers there)."""
        self._adders: dict[tuple[object, ...], Add] = {}
        self._call_children: dict[tuple[str, str], CallChildren] = {}
        self._inflight_children: dict[str, Add] = {}

    def child(self, metric: Counter | Gauge, *labels: str) -> Add:
        """The :func:`adder` of ``metric``'s child for ``labels``, bound once: the hot path
        does no label lookups."""
        add = self._adders.get((id(metric), *labels))
        if add is None:
            add = self._adders[(id(metric), *labels)] = adder(metric.labels(*labels))
        return add

    def call_children(self, tool: str, outcome: str) -> CallChildren:
        """(calls adder, duration histogram, attempts adder, the duration's exemplar gate)."""
        entry = self._call_children.get((tool, outcome))
        if entry is None:
            entry = self._call_children[(tool, outcome)] = (
                self.child(self.calls, tool, outcome),
                self.duration.labels(tool, outcome),
                self.child(self.attempts, tool, outcome),
                ExemplarGate(),
            )
        return entry

    def inflight_child(self, tool: str) -> Add:  # every dispatch: a plain lookup
        add = self._inflight_children.get(tool)
        if add is None:
            add = self._inflight_children[tool] = adder(self.inflight.labels(tool))
        return add

    def set_breaker_state(self, key: str, state: str) -> None:
        for name in STATES:
            self.breaker_state.labels(key, name).set(1 if name == state else 0)
