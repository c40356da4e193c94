"""Soak: 100,000 calls with mixed faults — every call answered, metrics exact, memory flat.

Runs on asyncio only (a soak measures the library, not the backend; the other suites run
both) in batches of 500 concurrent calls through ``dispatch_many``. Faults: injected
latency, hangs, errors, exceptions and bad output (``toolrelay.Fault``), handlers that time
out (10–20 ms deadlines), sync handlers abandoned at their deadline, a breaker that keeps
opening, full bulkheads, approvals, and caller mistakes.
"""

from __future__ import annotations

import gc
import itertools
import logging
import os
import random
import time
from collections import Counter
from collections.abc import Iterator
from typing import Any

import anyio
import pytest
from prometheus_client import CollectorRegistry

from helpers import key_policy, wait_until
from toolrelay import (
    AuthContext,
    BreakerOptions,
    BulkheadOptions,
    Dispatcher,
    DispatcherOptions,
    ErrorType,
    Fault,
    KeyPolicy,
    Profile,
    RetryOptions,
    ToolCall,
    ToolDeclaration,
    ToolRegistry,
    ToolResult,
)

pytestmark = [pytest.mark.anyio, pytest.mark.soak]

TOTAL_CALLS = 100_000
BATCH = 500
WARM_UP_CALLS = 20_000
MAX_RSS_GROWTH = 20 * 1024 * 1024
SEED = 1_000_003
ANY = {"type": "object", "properties": {"n": {"type": "integer"}}}
REGISTERED = ("fast", "faulty", "slow", "brittle", "legacy", "edit")
MIX: tuple[tuple[str, int], ...] = (  # tool (or mistake) and weight
    ("fast", 30),
    ("faulty", 25),
    ("slow", 12),
    ("brittle", 12),
    ("legacy", 5),
    ("edit", 8),
    ("bad_json", 3),
    ("bad_schema", 3),
    ("unknown", 2),
)


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture
def quiet_toolrelay() -> Iterator[None]:
    """100,000 failures would be thousands of log records with tracebacks kept by pytest's
    log capture — memory of the test harness, not of the library."""
    logger = logging.getLogger("toolrelay")
    level = logger.level
    logger.setLevel(logging.CRITICAL)
    try:
        yield
    finally:
        logger.setLevel(level)


def rss_bytes() -> int:
    with open("/proc/self/statm") as statm:
        resident_pages = int(statm.read().split()[1])
    return resident_pages * os.sysconf("SC_PAGE_SIZE")


def build(rng: random.Random) -> tuple[Dispatcher, CollectorRegistry, list[dict[str, Any]]]:
    registry = ToolRegistry()

    @registry.tool(name="fast", parameters=ANY, breaker_key="svc-a", timeout_s=1.0)
    async def fast(args: dict[str, Any], ctx: AuthContext) -> dict[str, Any]:
        return {"n": args.get("n"), "user": ctx.user_id}

    @registry.tool(name="faulty", parameters=ANY, breaker_key="svc-b", timeout_s=0.015)
    async def faulty(args: dict[str, Any], ctx: AuthContext) -> dict[str, Any]:
        return {"n": args.get("n")}

    @registry.tool(name="slow", parameters=ANY, breaker_key="svc-c", timeout_s=0.012)
    async def slow(args: dict[str, Any], ctx: AuthContext) -> str:
        await anyio.sleep(rng.uniform(0, 0.025))  # about half miss the deadline
        return "slow"

    @registry.tool(name="brittle", parameters=ANY, breaker_key="svc-d", timeout_s=0.02)
    async def brittle(args: dict[str, Any], ctx: AuthContext) -> str:
        if rng.random() < 0.6:
            raise RuntimeError("upstream down")
        return "fine"

    @registry.tool(name="legacy", parameters=ANY, breaker_key="svc-e", timeout_s=0.015)
    def legacy(args: dict[str, Any], ctx: AuthContext) -> str:
        time.sleep(args.get("n", 0) % 20 / 1000)  # 0–19 ms on a worker thread
        return "legacy"

    @registry.tool(name="edit", parameters=ANY, risk="write", breaker_key="svc-f")
    async def edit(args: dict[str, Any], ctx: AuthContext) -> str:
        return "edited"

    def approver(call: ToolCall, decl: ToolDeclaration, ctx: AuthContext) -> bool:
        return rng.random() < 0.5

    audit: list[dict[str, Any]] = []
    metrics = CollectorRegistry()
    fast_retries: dict[str, Any] = {
        "max_attempts": 3,
        "backoff_initial_s": 0.002,
        "backoff_max_s": 0.004,
    }
    dispatcher = Dispatcher(
        registry,
        DispatcherOptions(
            profiles={"reader": Profile(max_risk="read")},
            keys={
                "svc-a": key_policy(reset_timeout_s=0.05, max_concurrent=256, **fast_retries),
                "svc-b": key_policy(fail_max=8, reset_timeout_s=0.02, **fast_retries),
                "svc-c": KeyPolicy(
                    breaker=BreakerOptions(fail_max=1_000_000),
                    retry=RetryOptions(max_attempts=1),
                    bulkhead=BulkheadOptions(max_concurrent=256),
                ),
                "svc-d": KeyPolicy(
                    breaker=BreakerOptions(fail_max=3, reset_timeout_s=0.01),
                    retry=RetryOptions(max_attempts=1),
                ),
                "svc-e": KeyPolicy(
                    breaker=BreakerOptions(fail_max=1_000_000),
                    retry=RetryOptions(max_attempts=1),
                    bulkhead=BulkheadOptions(max_concurrent=16),
                ),
            },
            faults=[
                Fault(kind="latency", tool="fast", rate=0.05, latency_s=0.001, jitter_s=0.004),
                Fault(kind="hang", breaker_key="svc-b", rate=0.04),
                Fault(kind="error", breaker_key="svc-b", rate=0.06, message="upstream 503"),
                Fault(kind="error", tool="faulty", rate=0.03, retryable=False, error_type="denied"),
                Fault(kind="exception", breaker_key="svc-b", rate=0.03),
                Fault(kind="bad_output", tool="faulty", rate=0.02),
            ],
            fault_seed=SEED,
        ),
        approver=approver,
        metrics_registry=metrics,
        audit=audit.append,
    )
    return dispatcher, metrics, audit


NAMES = [name for name, _ in MIX]
CUM_WEIGHTS = list(itertools.accumulate(weight for _, weight in MIX))  # as choices() sums them
ERROR_TYPES = set(ErrorType)


def make_batch(rng: random.Random, batch: int) -> list[ToolCall]:
    calls = []
    for i in range(BATCH):
        kind = rng.choices(NAMES, cum_weights=CUM_WEIGHTS)[0]
        call_id = f"{batch}-{i}"
        if kind == "bad_json":
            calls.append(ToolCall("fast", '{"n": ', call_id))
        elif kind == "bad_schema":
            calls.append(ToolCall("fast", {"n": "not a number"}, call_id))
        elif kind == "unknown":
            calls.append(ToolCall(f"nope_{i % 7}", "{}", call_id))
        else:
            calls.append(ToolCall(kind, {"n": rng.randrange(1000)}, call_id))
    return calls


def metric_counts(metrics: CollectorRegistry, name: str, suffix: str) -> Counter[tuple[str, str]]:
    counts: Counter[tuple[str, str]] = Counter()
    for metric in metrics.collect():
        if metric.name != name:
            continue
        for sample in metric.samples:
            if sample.name == name + suffix:
                counts[(sample.labels["tool"], sample.labels["outcome"])] += int(sample.value)
    return counts


@pytest.mark.usefixtures("quiet_toolrelay")
async def test_a_hundred_thousand_calls_with_faults() -> None:
    rng = random.Random(SEED)
    dispatcher, metrics, audit = build(rng)
    observed: Counter[tuple[str, str]] = Counter()
    risky_calls = 0
    answered = 0
    rss_after_warm_up = 0
    started = time.perf_counter()
    for batch in range(TOTAL_CALLS // BATCH):
        calls = make_batch(rng, batch)
        profile = "reader" if batch % 5 == 4 else None  # every fifth batch: edit is off-limits
        ctx = AuthContext(user_id=f"u{batch % 13}", tenant_id=f"t{batch % 3}")
        results = await dispatcher.dispatch_many(calls, ctx, profile=profile)
        assert len(results) == len(calls)  # every call answered, in order
        for call, result in zip(calls, results, strict=True):
            assert isinstance(result, ToolResult) and result.call_id == call.call_id
            assert result.ok or result.error_type in ERROR_TYPES
            label = call.name if call.name in REGISTERED else "_unknown"
            observed[(label, "ok" if result.ok else str(result.error_type))] += 1
            risky_calls += call.name == "edit"
        answered += len(results)
        if answered == WARM_UP_CALLS:
            gc.collect()
            rss_after_warm_up = rss_bytes()
    elapsed = time.perf_counter() - started

    assert answered == TOTAL_CALLS
    calls_total = metric_counts(metrics, "toolrelay_tool_calls", "_total")
    assert sum(calls_total.values()) == TOTAL_CALLS
    assert calls_total == observed
    assert metric_counts(metrics, "toolrelay_tool_call_duration_seconds", "_count") == observed
    # The faults really happened: every kind of answer is in the mix.
    outcomes = {outcome for _, outcome in observed}
    expected = {"ok", *(str(e) for e in ErrorType)} - {"internal_error", "needs_approval"}
    assert outcomes == expected, (sorted(outcomes), observed)
    for tool, outcome in (
        ("faulty", "timeout"),  # injected hangs, cut at the 15 ms deadline
        ("slow", "timeout"),  # handlers past their 12 ms deadline
        ("legacy", "timeout"),  # sync threads abandoned at their deadline
        ("legacy", "overloaded"),  # … and holding their places meanwhile
        ("brittle", "circuit_open"),  # a breaker that keeps opening
    ):
        assert observed[(tool, outcome)] > 0, (tool, outcome)
    assert len(audit) == risky_calls  # one audit line per write call, whatever happened
    for tool in REGISTERED:
        assert metrics.get_sample_value("toolrelay_tool_inflight", {"tool": tool}) == 0
    assert set(dispatcher.bulkhead.in_flight().values()) <= {0}
    await wait_until(lambda: dispatcher.workers.live().get("svc-e", 0) == 0)
    assert dispatcher.workers.abandoned().get("svc-e", 0) == 0

    gc.collect()
    growth = rss_bytes() - rss_after_warm_up
    by_outcome = [Counter({outcome: n}) for (_, outcome), n in observed.items()]
    print(  # shown with -s: the soak's own numbers
        f"\nsoak: {TOTAL_CALLS} calls in {elapsed:.1f} s, RSS growth after warm-up "
        f"{growth / 1024 / 1024:.1f} MiB, outcomes {dict(sum(by_outcome, Counter()))}"
    )
    assert growth < MAX_RSS_GROWTH, f"RSS grew {growth / 1024 / 1024:.1f} MiB"
