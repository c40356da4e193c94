"""Telemetry: one span and a set of Prometheus metrics per call, as an observer.

:class:`Telemetry` is the outermost stage of the pipeline (it opens the span, so the
handler's own spans are its children, and counts the answer), an observer of stage events
(retries, breaker transitions, faults, abandoned threads, killed worker processes) and a
listener of breakers, worker pools, model slots and the shared breaker storage. Stages hold
no telemetry code.
"""

from __future__ import annotations

import os
import time
from collections.abc import Awaitable
from typing import TYPE_CHECKING, Any

import anyio
from opentelemetry import context, trace
from opentelemetry.metrics import MeterProvider
from prometheus_client import CollectorRegistry

from .._version import __version__
from ..events import (
    AttemptEnded,
    ConcurrencyLimitUpdated,
    Event,
    FallbackEnded,
    FaultInjected,
    HedgeEnded,
    LoopBlocked,
    RetryBudgetExhausted,
    RetryScheduled,
    WorkerKilled,
)
from ..outcome import Outcome
from ..redact import Redactor
from .metrics import UNKNOWN_TOOL, Metrics
from .semconv import execute_tool_duration, tool_attributes
from .tracing import add_event, finish

if TYPE_CHECKING:
    from ..breakers import Breakers
    from ..pipeline import Invocation, Next
    from ..registry import ToolRegistry
    from ..slot import SlotLease

__all__ = ["Metrics", "Telemetry", "serve_metrics"]


class Telemetry:
    __slots__ = ("_checked_at", "_tracing", "capture_content", "genai", "metrics", "provider",
                 "redact", "registry", "tracer")  # fmt: skip

    def __init__(
        self,
        registry: ToolRegistry,
        *,
        metrics_registry: CollectorRegistry | None = None,
        tracer_provider: trace.TracerProvider | None = None,
        capture_content: bool = False,
        redact: Redactor | None = None,
        meter_provider: MeterProvider | None = None,
    ) -> None:
        self.registry = registry
        self.redact = Redactor() if redact is None else redact
        self.metrics = Metrics.on(metrics_registry)
        self.provider = tracer_provider
        self.tracer = trace.get_tracer("toolrelay", __version__, tracer_provider=tracer_provider)
        self._tracing = False
        self._checked_at = -1.0
        self.capture_content = capture_content
        self.genai = execute_tool_duration(meter_provider)

    def label(self, name: Any) -> str:
        return name if isinstance(name, str) and self.registry.owns(name) else UNKNOWN_TOOL

    def tracing(self) -> bool:
        """Is anyone collecting spans? Re-checked at most once a second until one is (a
        global provider can be set later); without one no span is even started."""
        if self._tracing:
            return True
        now = time.monotonic()
        if now - self._checked_at < 1.0:
            return False
        self._checked_at = now
        provider = self.provider or trace.get_tracer_provider()
        self._tracing = not isinstance(
            provider, trace.ProxyTracerProvider | trace.NoOpTracerProvider
        )
        return self._tracing

    # -- the outermost stage ------------------------------------------------------------
    def __call__(self, call_next: Next, inv: Invocation) -> Awaitable[Outcome]:
        # a tool found as the call came in names its series; else the name, if known now
        tool = inv.name if inv.tool is not None else self.label(inv.name)
        return self._measure(call_next, inv, tool, self.tracing())

    async def _measure(self, call_next: Next, inv: Invocation, tool: str, traced: bool) -> Outcome:
        """Count the call and, when ``traced``, record its span (current while the call runs,
        so the handler's spans are its children). ``start_as_current_span`` by hand: its two
        generator-based context managers cost ~3 µs a call (``bench/run.py``)."""
        span = self.tracer.start_span(f"execute_tool {tool}") if traced else None
        token = None if span is None else context.attach(trace.set_span_in_context(span))
        try:
            metrics = self.metrics
            inflight = metrics.inflight_child(tool)
            started = time.perf_counter()
            inflight(1)
            try:
                out = await call_next(inv)
            finally:
                inflight(-1)
            ended = time.perf_counter()
            elapsed = ended - started
            outcome = "ok" if out.ok else str(out.error_type)
            asked = inv if out.request is None else out.request  # the call as it ran
            if tool == UNKNOWN_TOOL and asked.tool is not None:
                tool = asked.tool.decl.name  # registered during this very call
            count, histogram, count_attempt, exemplars = metrics.call_children(tool, outcome)
            count(1)
            # the last attempt (earlier ones were counted as they were retried); after a
            # fallback answered, the primary's and the fallback's: _fallback_ended
            key = asked.key
            attempts = out.attempts or asked.attempts
            if attempts and out.served_by is None:
                count_attempt(1)
                rejected = metrics.rejected.get(outcome)
                if rejected is not None and key is not None:
                    metrics.child(rejected, key)(1)
            exemplar = None
            if span is not None and span.is_recording():
                decl = None if asked.tool is None else asked.tool.decl
                redact = self.redact
                # an unknown name is the model's text: redacted (bounded; finish cuts to 128)
                name = decl.name if decl is not None else redact(str(inv.name)[:1024])
                content = None
                if self.capture_content:  # opted in: redaction runs on every captured call
                    content = (redact.value(asked.args or inv.raw_args), redact.value(out.data))
                finish(
                    span, name, inv.call_id, decl.description if decl else None, key,
                    attempts, outcome, out.message if out.ok else redact(out.message),
                    content,
                )  # fmt: skip
                if exemplars.due(elapsed, ended):
                    exemplar = {"trace_id": format(span.get_span_context().trace_id, "032x")}
            histogram.observe(elapsed, exemplar)
            genai = self.genai.histogram
            if genai is None and ended >= self.genai.next_check:
                genai = self.genai.check(ended)
            if genai is not None:
                genai.record(elapsed, tool_attributes(tool, outcome))
            if outcome == "timeout" and asked.deadline != float("inf"):
                metrics.overrun.observe(max(0.0, anyio.current_time() - asked.deadline))
            return out
        finally:
            if span is not None and token is not None:
                context.detach(token)
                span.end()

    # -- observers and listeners --------------------------------------------------------
    def observe(self, inv: Invocation, event: Event) -> None:
        """Stage events: metrics, and span events on the call's span. Attempts are counted
        without ``AttemptEnded`` (the commonest event): a retried one when its retry is
        scheduled, the last from the call's answer."""
        if type(event) is AttemptEnded and event.attempt == 1:
            return
        if isinstance(event, RetryScheduled):
            tool = self.label(inv.name)
            self.metrics.retries.labels(tool).inc()
            self.metrics.child(self.metrics.attempts, tool, event.error_type)(1)
        elif isinstance(event, FaultInjected):
            self.metrics.faults.labels(self.label(inv.name), event.fault).inc()
        elif isinstance(event, ConcurrencyLimitUpdated):
            self.metrics.concurrency_limit.labels(event.breaker_key).set(event.limit)
            self.metrics.concurrency_in_flight.labels(event.breaker_key).set(event.in_flight)
            self.metrics.concurrency_limit_min.labels(event.breaker_key).set(event.min_limit)
        elif isinstance(event, HedgeEnded):
            self.metrics.hedges.labels(event.breaker_key, event.result).inc()
        elif isinstance(event, RetryBudgetExhausted):
            self.metrics.budget_exhausted.labels(event.breaker_key, event.kind).inc()
        elif isinstance(event, FallbackEnded):
            self._fallback_ended(inv, event)
        elif isinstance(event, WorkerKilled):
            self.metrics.child(self.metrics.processes_killed, event.breaker_key)(1)
        elif isinstance(event, LoopBlocked):
            self.metrics.loop_blocked.labels(self.label(inv.name)).inc(event.seconds)
        if self._tracing:
            span = trace.get_current_span()
            if span.is_recording():
                add_event(span, event)

    def _fallback_ended(self, inv: Invocation, event: FallbackEnded) -> None:
        """``toolrelay_fallbacks_total``, the fallback's last attempt (its call has no span
        or call count of its own) and, when it answered, the primary's."""
        metrics = self.metrics
        tool = self.label(inv.name)
        fallback = self.label(event.fallback)
        metrics.fallbacks.labels(tool, fallback, event.result).inc()
        ended = [(fallback, event.breaker_key, event.result, event.attempts)]
        if event.served:
            ended.append((tool, inv.key, event.primary, inv.attempts))
        for name, key, result, attempts in ended:
            if not attempts:
                continue
            metrics.child(metrics.attempts, name, result)(1)
            rejected = metrics.rejected.get(result)
            if rejected is not None and key is not None:
                metrics.child(rejected, key)(1)
        if self._tracing:
            span = trace.get_current_span()
            if span.is_recording():
                span.add_event(
                    "toolrelay.fallback",
                    {
                        "toolrelay.fallback.tool": fallback,
                        "toolrelay.fallback.result": event.result,
                    },
                )
                if event.served:
                    span.set_attribute("toolrelay.fallback.served_by", fallback)

    def breaker_transition(self, key: str, old: str, new: str) -> None:
        self.metrics.transitions.labels(key, old, new).inc()
        self.metrics.set_breaker_state(key, new)

    def breaker_seen(self, key: str, state: str) -> None:
        """A ``Breakers.on_create`` hook: a key's breaker was created."""
        self.metrics.set_breaker_state(key, state)

    def watch_breakers(self, breakers: Breakers) -> None:
        """Report ``breakers``' failure and slow-call rates and break durations (computed at
        scrape time; held weakly: a dispatcher that is garbage-collected drops out)."""
        self.metrics.breakers.watch(breakers)

    def workers_changed(self, key: str, abandoned: int) -> None:
        self.metrics.abandoned.labels(key).set(abandoned)

    def slot_released(self, lease: SlotLease) -> None:
        self.metrics.slot_hold.observe(lease.elapsed())
        self.metrics.slot_budget.set(lease.budget_s)

    def storage_changed(self, up: bool) -> None:
        self.metrics.storage_up.set(1 if up else 0)

    def storage_rejected(self, key: str, field: str) -> None:
        self.metrics.storage_rejected.labels(key, field).inc()


def serve_metrics(
    port: int = 9464, host: str = "127.0.0.1", registry: CollectorRegistry | None = None
) -> Any:
    """Serve ``/metrics`` from a daemon thread, for hosts without a web server.

    In prometheus-client multiprocess mode (``PROMETHEUS_MULTIPROC_DIR`` set) the metrics
    of every worker process are aggregated. Returns the server; ``server.shutdown()`` stops
    it and ``server.server_port`` tells the port (useful with ``port=0``).
    """
    from prometheus_client import REGISTRY, start_http_server

    if registry is None:
        registry = REGISTRY
        if os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
            from prometheus_client import multiprocess

            registry = CollectorRegistry()
            multiprocess.MultiProcessCollector(registry)  # type: ignore[no-untyped-call]
    server, _thread = start_http_server(port, host, registry)
    return server
