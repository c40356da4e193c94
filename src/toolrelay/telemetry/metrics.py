"""Prometheus metrics, on a ``CollectorRegistry`` the host passes in.

Names, types and labels are the contract of ``docs/telemetry.md``. Metrics are created
once per registry (several dispatchers may share one) and label children are bound once
per label set, so the hot path does no label lookups. Gauges carry a multiprocess mode,
so hosts running several worker processes (``PROMETHEUS_MULTIPROC_DIR``) aggregate them.
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Callable
from typing import Any

from prometheus_client import REGISTRY, CollectorRegistry, Counter, Gauge, Histogram

__all__ = ["DURATION_BUCKETS", "UNKNOWN_TOOL", "Metrics"]

UNKNOWN_TOOL = "_unknown"
"""The ``tool`` label of calls naming a tool nobody registered (never the made-up name)."""

DURATION_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
OVERRUN_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0)
SLOT_BUCKETS = (0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 20.0, 30.0, 60.0, 120.0, 300.0)
STATES = ("closed", "open", "half_open")

Add = Callable[[float], None]


def adder(child: Any) -> Add:
    """A fast ``inc(amount)`` for a bound counter or gauge child.

    The public ``inc`` re-checks, on every call, things that cannot change for a bound
    child (observability, sign); the hot path calls the child's value store directly
    (prometheus-client's own ``MutexValue``/``MultiProcessValue``), falling back to the
    public method if a future release moves it.
    """
    value = getattr(child, "_value", None)
    inc = getattr(value, "inc", None)
    return inc if callable(inc) else child.inc  # type: ignore[no-any-return]


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
        self._call_children: dict[tuple[str, str], tuple[Add, Any, Add]] = {}
        self._inflight_children: dict[str, Add] = {}
        self._attempt_children: dict[tuple[str, str], Add] = {}
        self._key_children: dict[tuple[int, str], Add] = {}

    def call_children(self, tool: str, outcome: str) -> tuple[Add, Any, Add]:
        """(calls adder, duration histogram, attempts adder) for one label set, bound once."""
        entry = self._call_children.get((tool, outcome))
        if entry is None:
            entry = (
                adder(self.calls.labels(tool, outcome)),
                self.duration.labels(tool, outcome),
                adder(self.attempts.labels(tool, outcome)),
            )
            self._call_children[(tool, outcome)] = entry
        return entry

    def attempt_child(self, tool: str, result: str) -> Add:
        add = self._attempt_children.get((tool, result))
        if add is None:
            add = self._attempt_children[(tool, result)] = adder(self.attempts.labels(tool, result))
        return add

    def key_child(self, metric: Any, key: str) -> Add:
        """The adder of a ``{breaker_key}`` counter, bound once."""
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
