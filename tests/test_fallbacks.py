"""Fallback tools (issue 20, item 4): who may answer instead, when, and with how much time."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import anyio
import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from prometheus_client import CollectorRegistry

from helpers import wait_until
from toolrelay import (
    AuthContext,
    BulkheadOptions,
    Dispatcher,
    DispatcherOptions,
    KeyPolicy,
    Profile,
    ToolError,
    ToolRegistry,
)
from toolrelay.chaos.experiment import Experiment, Run, play
from toolrelay.registry import RegistrationError

pytestmark = pytest.mark.anyio
EXAMPLES = Path(__file__).resolve().parent.parent / "examples" / "experiments"
QUERY = {"type": "object", "properties": {"q": {"type": "string"}}, "required": ["q"]}
OTHER_SCHEMA = {
    "type": "object",
    "properties": {"query": {"type": "string"}},
    "required": ["query"],
}


class Service:
    """A tool handler whose behaviour a test sets; it records the calls it got, the time
    each had left before its deadline and that deadline."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.mode = "ok"
        self.calls = 0
        self.left: list[float] = []
        self.deadlines: list[float] = []

    async def __call__(self, args: dict[str, Any], ctx: AuthContext) -> Any:
        self.calls += 1
        self.deadlines.append(anyio.current_effective_deadline())
        self.left.append(self.deadlines[-1] - anyio.current_time())
        if self.mode == "overloaded":
            raise ToolError("busy", error_type="overloaded", retryable=True)
        if self.mode == "early_timeout":  # an upstream's own timeout, before ours
            await anyio.sleep(0.2)
            raise ToolError("upstream timed out", error_type="timeout", retryable=True)
        if self.mode == "hang":
            await anyio.sleep(60)
        if self.mode == "error":
            raise ToolError(f"{self.name} broke", retryable=True)
        return {"from": self.name, "q": args.get("q")}


def build(
    fallback: tuple[str, ...] = ("backup", "backup2"),
    *,
    primary_timeout_s: float = 2.0,
    idempotent: bool | None = None,
    backup_schema: dict[str, Any] = QUERY,
    profiles: dict[str, Profile] | None = None,
    metrics: CollectorRegistry | None = None,
    provider: TracerProvider | None = None,
    breakers: dict[str, KeyPolicy] | None = None,
) -> tuple[Dispatcher, dict[str, Service]]:
    registry = ToolRegistry()
    services = {name: Service(name) for name in ("search", "backup", "backup2")}
    registry.tool(
        name="search", description="Search.", parameters=QUERY, breaker_key="primary",
        timeout_s=primary_timeout_s, fallback=fallback, idempotent=idempotent,
    )(services["search"])  # fmt: skip
    registry.tool(
        name="backup", description="Search, elsewhere.", parameters=backup_schema,
        breaker_key="backup", timeout_s=10.0,
    )(services["backup"])  # fmt: skip
    registry.tool(
        name="backup2", description="Search, a third place.", parameters=QUERY,
        breaker_key="backup2", timeout_s=10.0,
    )(services["backup2"])  # fmt: skip
    dispatcher = Dispatcher(
        registry,
        DispatcherOptions(profiles=profiles or {}, keys=breakers or {}),
        audit=None,
        metrics_registry=metrics or CollectorRegistry(),
        tracer_provider=provider,
    )
    return dispatcher, services


async def test_open_breaker_is_answered_by_the_fallback() -> None:
    dispatcher, services = build()
    dispatcher.breakers.force_open("primary")
    before = anyio.current_time()
    result = await dispatcher.dispatch("search", '{"q": "x"}', call_id="c1")
    after = anyio.current_time()
    assert result.ok and result.data == {"from": "backup", "q": "x"}
    assert result.served_by == "backup" and result.tool == "search" and result.call_id == "c1"
    assert result.to_model() == {"ok": True, "data": result.data, "served_by": "backup"}
    assert services["search"].calls == 0
    # a fast-fail spends none of the primary's time: the fallback has all of it (2 s)
    assert before + 2.0 <= services["backup"].deadlines[0] <= after + 2.0


async def test_the_envelope_key_is_absent_without_a_fallback() -> None:
    dispatcher, _ = build()
    result = await dispatcher.dispatch("search", '{"q": "x"}')
    assert result.ok and result.served_by is None
    assert result.to_model() == {"ok": True, "data": {"from": "search", "q": "x"}}
    dispatcher.breakers.force_open("backup")
    dispatcher.breakers.force_open("backup2")
    dispatcher.breakers.force_open("primary")
    answer = (await dispatcher.dispatch("search", '{"q": "x"}')).to_model()
    assert answer["error_type"] == "circuit_open" and "served_by" not in answer


async def test_overloaded_bulkhead_goes_to_the_fallback() -> None:
    config = {"primary": KeyPolicy(bulkhead=BulkheadOptions(max_concurrent=1, wait_s=0.0))}
    dispatcher, services = build(breakers=config)
    services["search"].mode = "hang"
    async with anyio.create_task_group() as tg:
        tg.start_soon(dispatcher.dispatch, "search", '{"q": "slow"}')
        await wait_until(lambda: services["search"].calls == 1)  # the one place is taken
        result = await dispatcher.dispatch("search", '{"q": "x"}')
        tg.cancel_scope.cancel()
    assert result.ok and result.served_by == "backup" and result.data["from"] == "backup"


async def test_overloaded_answer_goes_to_the_fallback() -> None:
    dispatcher, services = build()
    services["search"].mode = "overloaded"
    result = await dispatcher.dispatch("search", '{"q": "x"}')
    assert result.ok and result.served_by == "backup"
    assert services["search"].calls == 1


async def test_early_timeout_goes_to_the_fallback_with_the_time_left() -> None:
    dispatcher, services = build(primary_timeout_s=1.0)
    services["search"].mode = "early_timeout"
    result = await dispatcher.dispatch("search", '{"q": "x"}')
    assert result.ok and result.served_by == "backup"
    # the primary's deadline (its 1 s less the 0.2 s it used), not backup's own 10 s
    assert services["backup"].deadlines == pytest.approx(services["search"].deadlines)
    (left,) = services["backup"].left
    assert 0 < left <= 0.8


async def test_timeout_at_the_deadline_leaves_no_time_for_a_fallback() -> None:
    dispatcher, services = build(primary_timeout_s=0.2)
    services["search"].mode = "hang"
    result = await dispatcher.dispatch("search", '{"q": "x"}')
    assert result.error_type == "timeout" and result.served_by is None
    assert services["backup"].calls == 0


async def test_a_spent_model_slot_leaves_no_time_for_a_fallback() -> None:
    dispatcher, services = build(primary_timeout_s=5.0)
    services["search"].mode = "hang"
    slot = dispatcher.model_slot(budget_s=0.2)
    async with slot.hold() as lease:
        result = await dispatcher.dispatch("search", '{"q": "x"}', slot=lease)
    assert result.error_type == "timeout" and result.served_by is None
    assert services["backup"].calls == 0


async def test_the_slot_bounds_the_fallback_too() -> None:
    dispatcher, services = build(primary_timeout_s=5.0)
    dispatcher.breakers.force_open("primary")
    slot = dispatcher.model_slot(budget_s=0.5)
    async with slot.hold() as lease:
        result = await dispatcher.dispatch("search", '{"q": "x"}', slot=lease)
    assert result.served_by == "backup"
    assert services["backup"].left[0] <= 0.5


async def test_an_open_fallback_is_passed_over_for_the_next() -> None:
    dispatcher, services = build()
    dispatcher.breakers.force_open("primary")
    dispatcher.breakers.force_open("backup")
    result = await dispatcher.dispatch("search", '{"q": "x"}')
    assert result.ok and result.served_by == "backup2"
    assert services["backup"].calls == 0


async def test_an_overloaded_fallback_is_passed_over_for_the_next() -> None:
    dispatcher, services = build()
    dispatcher.breakers.force_open("primary")
    services["backup"].mode = "overloaded"
    result = await dispatcher.dispatch("search", '{"q": "x"}')
    assert result.ok and result.served_by == "backup2"


async def test_a_fallback_the_caller_may_not_use_is_skipped() -> None:
    profiles = {
        "no-backup": Profile(allow={"search", "backup2"}),
        "search-only": Profile(allow={"search"}),
        "backups-only": Profile(allow={"backup", "backup2"}),
    }
    dispatcher, services = build(profiles=profiles)
    dispatcher.breakers.force_open("primary")
    served = await dispatcher.dispatch("search", '{"q": "x"}', profile="no-backup")
    assert served.served_by == "backup2" and services["backup"].calls == 0
    alone = await dispatcher.dispatch("search", '{"q": "x"}', profile="search-only")
    assert alone.error_type == "circuit_open" and alone.served_by is None
    # no way to a fallback through a tool the caller may not call
    refused = await dispatcher.dispatch("search", '{"q": "x"}', profile="backups-only")
    assert refused.error_type == "tool_policy" and refused.served_by is None
    assert services["backup"].calls == 0 and services["backup2"].calls == 1


async def test_arguments_that_do_not_fit_a_fallback_skip_it() -> None:
    dispatcher, services = build(backup_schema=OTHER_SCHEMA)
    dispatcher.breakers.force_open("primary")
    result = await dispatcher.dispatch("search", '{"q": "x"}')
    assert result.served_by == "backup2" and services["backup"].calls == 0


async def test_no_healthy_fallback_gives_the_primarys_answer() -> None:
    dispatcher, services = build()
    for key in ("primary", "backup", "backup2"):
        dispatcher.breakers.force_open(key)
    result = await dispatcher.dispatch("search", '{"q": "x"}')
    assert result.error_type == "circuit_open" and result.served_by is None
    assert result.message.startswith("search is paused") and result.retry_after_s is not None
    assert result.breaker_key == "primary"
    assert sum(service.calls for service in services.values()) == 0


async def test_a_fallback_that_ran_and_failed_gives_its_own_answer() -> None:
    dispatcher, services = build()
    dispatcher.breakers.force_open("primary")
    services["backup"].mode = "error"
    result = await dispatcher.dispatch("search", '{"q": "x"}')
    assert result.error_type == "tool_error" and result.served_by == "backup"
    assert result.to_model()["served_by"] == "backup" and services["backup2"].calls == 0


async def test_other_failures_are_not_handed_to_a_fallback() -> None:
    dispatcher, services = build()
    services["search"].mode = "error"
    result = await dispatcher.dispatch("search", '{"q": "x"}')
    assert result.error_type == "tool_error" and result.served_by is None
    invalid = await dispatcher.dispatch("search", '{"nope": 1}')
    assert invalid.error_type == "validation_error" and invalid.served_by is None
    assert services["backup"].calls == 0


async def test_a_non_idempotent_tool_never_falls_back_after_a_timeout() -> None:
    dispatcher, services = build(idempotent=False)
    services["search"].mode = "early_timeout"
    result = await dispatcher.dispatch("search", '{"q": "x"}')
    assert result.error_type == "timeout" and result.served_by is None
    assert services["backup"].calls == 0
    # an open breaker is safe: the tool never ran
    dispatcher.breakers.force_open("primary")
    fast = await dispatcher.dispatch("search", '{"q": "x"}')
    assert fast.ok and fast.served_by == "backup"


async def test_cancellation_during_a_fallback_propagates() -> None:
    dispatcher, services = build()
    dispatcher.breakers.force_open("primary")
    services["backup"].mode = "hang"
    results = []

    async def call() -> None:
        results.append(await dispatcher.dispatch("search", '{"q": "x"}'))

    async with anyio.create_task_group() as tg:
        tg.start_soon(call)
        await wait_until(lambda: services["backup"].calls == 1)  # inside the fallback
        tg.cancel_scope.cancel()
    assert results == []
    assert services["backup"].calls == 1 and services["backup2"].calls == 0
    assert dispatcher.breakers.get("backup").failures_recorded == 0


async def test_a_fallbacks_own_fallbacks_are_not_followed() -> None:
    registry = ToolRegistry()
    calls: list[str] = []

    def tool(name: str, other: str) -> None:
        async def handler(args: dict[str, Any], ctx: AuthContext) -> str:
            calls.append(name)
            return name

        registry.tool(name=name, parameters=QUERY, fallback=[other])(handler)

    tool("a", "b")
    tool("b", "a")  # a cycle is allowed: it can never run
    dispatcher = Dispatcher(registry, audit=None, metrics_registry=CollectorRegistry())
    dispatcher.breakers.force_open("a")
    assert (await dispatcher.dispatch("a", '{"q": "x"}')).served_by == "b"
    dispatcher.breakers.force_open("b")
    result = await dispatcher.dispatch("a", '{"q": "x"}')
    assert result.error_type == "circuit_open" and result.served_by is None
    assert calls == ["b"]


async def test_specs_can_hide_fallbacks_and_keep_a_covered_primary() -> None:
    dispatcher, _ = build()
    names = [spec["function"]["name"] for spec in dispatcher.specs()]
    assert names == ["search", "backup", "backup2"]
    assert [s["function"]["name"] for s in dispatcher.specs(hide_fallbacks=True)] == ["search"]
    dispatcher.breakers.force_open("primary")  # a fallback answers for it: still listed
    assert [s["name"] for s in dispatcher.specs(format="mcp", hide_fallbacks=True)] == ["search"]
    dispatcher.breakers.force_open("backup")
    dispatcher.breakers.force_open("backup2")
    assert dispatcher.specs(hide_fallbacks=True) == []
    marked = dispatcher.specs(unavailable="mark", hide_fallbacks=True)
    assert marked[0]["function"]["description"].startswith("[unavailable: paused by an operator]")


def test_registration_refuses_bad_fallbacks() -> None:
    registry = ToolRegistry()

    def handler(args: dict[str, Any], ctx: AuthContext) -> None:
        return None

    with pytest.raises(RegistrationError, match="its own fallback"):
        registry.tool(name="loop", parameters=QUERY, fallback=["loop"])(handler)
    with pytest.raises(RegistrationError, match="list of tool names"):
        registry.tool(name="one", parameters=QUERY, fallback="backup")(handler)
    with pytest.raises(RegistrationError, match="not a tool name"):
        registry.tool(name="bad", parameters=QUERY, fallback=["no spaces"])(handler)
    with pytest.raises(RegistrationError, match="twice"):
        registry.tool(name="dup", parameters=QUERY, fallback=["x", "x"])(handler)
    registry.tool(name="later", parameters=QUERY, fallback=["not_yet_registered"])(handler)
    registry.override("later", fallback=["other"])
    assert registry.resolve("later").decl.fallback == ("other",)  # type: ignore[union-attr]
    with pytest.raises(RegistrationError, match="its own fallback"):
        registry.override("later", fallback=["later"])
    assert registry.resolve("later").decl.fallback == ("other",)  # type: ignore[union-attr]


async def test_an_unknown_fallback_is_skipped() -> None:
    dispatcher, services = build(fallback=("nowhere", "backup2"))
    dispatcher.breakers.force_open("primary")
    result = await dispatcher.dispatch("search", '{"q": "x"}')
    assert result.served_by == "backup2" and services["backup2"].calls == 1


async def test_telemetry_counts_fallbacks_and_names_the_server() -> None:
    metrics = CollectorRegistry()
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    dispatcher, _ = build(metrics=metrics, provider=provider)
    dispatcher.breakers.force_open("primary")
    dispatcher.breakers.force_open("backup")
    await dispatcher.dispatch("search", '{"q": "x"}')

    def value(name: str, **labels: str) -> float | None:
        return metrics.get_sample_value(name, labels)

    fallbacks = "toolrelay_fallbacks_total"
    assert value(fallbacks, tool="search", fallback="backup", result="circuit_open") == 1
    assert value(fallbacks, tool="search", fallback="backup2", result="ok") == 1
    assert value("toolrelay_tool_calls_total", tool="search", outcome="ok") == 1
    assert value("toolrelay_tool_calls_total", tool="backup2", outcome="ok") is None
    # every refusal counted on its own key, though the call's answer is ok
    assert value("toolrelay_breaker_rejected_total", breaker_key="primary") == 1
    assert value("toolrelay_breaker_rejected_total", breaker_key="backup") == 1
    assert value("toolrelay_tool_attempts_total", tool="backup2", result="ok") == 1
    (span,) = exporter.get_finished_spans()
    assert span.name == "execute_tool search"
    assert span.attributes is not None
    assert span.attributes["toolrelay.fallback.served_by"] == "backup2"
    tried = [e.attributes for e in span.events if e.name == "toolrelay.fallback"]
    assert [dict(a or {}) for a in tried] == [
        {"toolrelay.fallback.tool": "backup", "toolrelay.fallback.result": "circuit_open"},
        {"toolrelay.fallback.tool": "backup2", "toolrelay.fallback.result": "ok"},
    ]


# -- the experiment, side by side (short form; the full run is in docs/fallbacks.md) ----------
def short(name: str) -> Experiment:
    data = copy.deepcopy(Experiment.load(EXAMPLES / f"{name}.toml").data)
    data["duration_s"] = 6
    data["faults"][0].update(from_s=1.5, until_s=4.5)  # down for 3 s instead of 10
    return Experiment.parse(data)


def ok_share(report: Run, start: float, end: float) -> tuple[float, float]:
    """The share of ok answers to calls started during [start, end), and over the run."""
    answers = report.timeline.answers
    during = [a for a in answers if start <= a.started_s < end]
    share = sum(a.outcome == "ok" for a in during) / len(during)
    return share, sum(a.outcome == "ok" for a in answers) / len(answers)


def test_experiment_outage_with_and_without_a_fallback(capsys: pytest.CaptureFixture[str]) -> None:
    with_fallback = anyio.run(play, short("search_fallback"))
    without = anyio.run(play, short("search_no_fallback"))
    assert with_fallback.ok and without.ok, [
        (v.name, v.figure) for r in (with_fallback, without) for v in r.checks if not v.ok
    ]
    during_on, total_on = ok_share(with_fallback, 1.5, 4.5)
    during_off, total_off = ok_share(without, 1.5, 4.5)
    with capsys.disabled():
        print(
            f"\nsearch down 3 of 6 s: ok answers with the fallback {during_on:.1%} during the "
            f"outage ({total_on:.1%} overall, {with_fallback.record.calls} calls); without "
            f"{during_off:.1%} during ({total_off:.1%} overall, {without.record.calls} calls)"
        )
    assert during_on >= 0.95 and total_on >= 0.95
    assert during_off <= 0.1  # the outage's share is lost without it
    assert total_off < 1 - 0.4 * (3 / 6)
