"""``isolation="process"`` in telemetry: a worker process killed at a deadline is counted
(``toolrelay_worker_processes_killed_total``) and is an event on the call's span."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import anyio
import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from prometheus_client import CollectorRegistry

import isolated_tools as tools
from helpers import wait_until
from toolrelay import Dispatcher, ToolRegistry

pytestmark = pytest.mark.anyio

ANY = {"type": "object"}
KILLED = "toolrelay_worker_processes_killed_total"


def build(hang_s: float = 0.3) -> tuple[Dispatcher, InMemorySpanExporter, CollectorRegistry]:
    registry = ToolRegistry()
    # one key: ``describe`` warms a worker, so ``hang``'s short deadline is spent in the
    # handler and not in starting the forkserver (which would not be a kill)
    registry.tool(name="describe", parameters=ANY, isolation="process", breaker_key="legacy",
                  timeout_s=30)(tools.describe)  # fmt: skip
    registry.tool(name="hang", parameters=ANY, isolation="process", breaker_key="legacy",
                  timeout_s=hang_s)(tools.hang)  # fmt: skip
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    metrics = CollectorRegistry()
    dispatcher = Dispatcher(registry, tracer_provider=provider, metrics_registry=metrics)
    return dispatcher, exporter, metrics


def killed(metrics: CollectorRegistry, key: str) -> float | None:
    return metrics.get_sample_value(KILLED, {"breaker_key": key})


def event_names(exporter: InMemorySpanExporter, tool: str) -> list[str]:
    (span,) = [s for s in exporter.get_finished_spans() if s.name == f"execute_tool {tool}"]
    return [e.name for e in span.events]


async def test_a_kill_at_the_deadline_is_counted_and_on_the_span() -> None:
    dispatcher, exporter, metrics = build()
    async with dispatcher:
        warm = await dispatcher.dispatch("describe", {})
        assert warm.ok, warm.to_model()
        assert killed(metrics, "legacy") is None  # no series before the first kill
        assert event_names(exporter, "describe") == []
        result = await dispatcher.dispatch("hang", {})
        assert result.to_model()["error_type"] == "timeout"
        assert killed(metrics, "legacy") == 1
        (span,) = [s for s in exporter.get_finished_spans() if s.name == "execute_tool hang"]
        (event,) = [e for e in span.events if e.name == "toolrelay.worker.killed"]
        assert dict(event.attributes or {}) == {"toolrelay.breaker_key": "legacy"}
        assert "toolrelay.worker.abandoned" not in event_names(exporter, "hang")
        assert dispatcher.workers.abandoned() == {}  # no thread: the gauge stays empty
        abandoned = {"breaker_key": "legacy"}
        assert metrics.get_sample_value("toolrelay_abandoned_workers", abandoned) is None
        assert (await dispatcher.dispatch("describe", {})).ok  # a fresh worker, warm
        again = await dispatcher.dispatch("hang", {})  # killed too
        assert again.to_model()["error_type"] == "timeout"
        # two kills, counted once each (the answered calls killed nothing)
        assert killed(metrics, "legacy") == 2 == dispatcher.processes.killed()["legacy"]


async def test_a_kill_at_the_hosts_cancellation_is_counted_too(tmp_path: Path) -> None:
    dispatcher, exporter, metrics = build(hang_s=30)
    pidfile = tmp_path / "pid"
    answered: list[Any] = []

    async def call() -> None:
        answered.append(await dispatcher.dispatch("hang", {"pidfile": str(pidfile)}))

    async with dispatcher:
        async with anyio.create_task_group() as tg:
            tg.start_soon(call)
            await wait_until(pidfile.exists, 30)  # the worker runs the call
            tg.cancel_scope.cancel()
        assert answered == []  # no answer: the cancellation went on
        assert killed(metrics, "legacy") == 1
        assert "toolrelay.worker.killed" in event_names(exporter, "hang")
        assert dispatcher.processes.processes() == {"legacy": 0}  # gone, its place free
