"""What a dispatch costs: over a bare call, an open breaker's answer, with 10,000 tools,
sequential throughput on one core, typed handlers against ``(args, ctx)`` handlers."""

from __future__ import annotations

import itertools
import os
import statistics
import time
from typing import Any

from toolrelay import (
    AuthContext,
    BreakerOptions,
    Dispatcher,
    KeyPolicy,
    ToolRegistry,
)

from .harness import (
    ARGS,
    CTX,
    PARSED,
    SCHEMA,
    Case,
    Row,
    Settings,
    dispatch_case,
    dispatcher,
    interleave,
    medians,
    ms,
    noop,
    noop_registry,
    paired_ratio,
    sanity,
    us,
)


# -- overhead ------------------------------------------------------------------------
async def bench_overhead(s: Settings) -> list[Row]:
    registry = noop_registry()

    async def bare() -> Any:
        return await noop(PARSED, CTX)

    cases = {
        "bare": bare,
        "api": dispatch_case(dispatcher(registry)),
        "off": dispatch_case(dispatcher(registry, tracing="off")),
    }
    await sanity(cases)
    samples = await interleave(cases, s.rounds, s.calls, s.warmup)
    m = medians(samples)
    return [
        Row(
            "overhead",
            "dispatch (metrics + tracing API) / bare call",
            paired_ratio(samples["api"], samples["bare"]),
            context=f"bare {us(m['bare'])}, dispatch {us(m['api'])}: "
            f"+{us(m['api'] - m['bare'])} per call",
        ),
        Row(
            "overhead",
            "dispatch, telemetry off / bare call",
            paired_ratio(samples["off"], samples["bare"]),
            context=f"dispatch {us(m['off'])}: +{us(m['off'] - m['bare'])} per call",
        ),
    ]


# -- fast-fail -----------------------------------------------------------------------
async def bench_fastfail(s: Settings) -> list[Row]:
    registry = noop_registry()
    registry.tool(name="noop_open", parameters=SCHEMA, breaker_key="down")(noop)
    d = dispatcher(registry, keys={"down": KeyPolicy(breaker=BreakerOptions(reset_timeout_s=3600))})
    d.breakers.force_open("down")
    cases = {
        "ok": dispatch_case(d),
        "open": dispatch_case(d, "noop_open", expect="circuit_open"),
    }
    await sanity(cases)
    samples = await interleave(cases, s.rounds, s.calls, s.warmup)
    m = medians(samples)
    ratio = paired_ratio(samples["open"], samples["ok"])
    return [
        Row(
            "fastfail",
            "open-breaker answer / successful dispatch",
            ratio,
            target="≤ 0.5×",
            passed=ratio <= 0.5,
            context=f"circuit_open {us(m['open'])}, ok {us(m['ok'])}",
        )
    ]


# -- scale ---------------------------------------------------------------------------
async def bench_scale(s: Settings) -> list[Row]:
    def build(n: int) -> tuple[ToolRegistry, list[str], float]:
        registry = ToolRegistry()
        started = time.perf_counter()
        for i in range(n):
            registry.tool(name=f"tool_{i:05d}", parameters=SCHEMA, breaker_key="svc")(noop)
        took = time.perf_counter() - started
        step = n // 10
        return registry, [f"tool_{i:05d}" for i in range(0, n, step)], took

    small, small_names, _ = build(10)
    big, big_names, register_s = build(s.scale_tools)

    def cycling(d: Dispatcher, names: list[str]) -> Case:
        turn = itertools.cycle(names)

        async def run() -> Any:
            return await d.dispatch(next(turn), ARGS, CTX, call_id="call_1")

        return run

    small_d, big_d = dispatcher(small), dispatcher(big)
    cases = {"small": cycling(small_d, small_names), "big": cycling(big_d, big_names)}
    await sanity(cases)
    samples = await interleave(cases, s.rounds, s.calls, s.warmup)
    m = medians(samples)
    ratio = paired_ratio(samples["big"], samples["small"])

    started = time.perf_counter()
    first = big_d.specs()
    first_s = time.perf_counter() - started
    assert len(first) == s.scale_tools
    times = []
    for _ in range(3 if s.quick else 7):
        started = time.perf_counter()
        big_d.specs()
        times.append(time.perf_counter() - started)
    steady = statistics.median(times)
    return [
        Row(
            "scale",
            f"dispatch with {s.scale_tools:,} tools / with 10 tools",
            ratio,
            target="≤ 1.1×",
            passed=ratio <= 1.1,
            in_force=not s.quick,  # 10 % is within a quick run's noise
            context=f"{us(m['big'])} vs {us(m['small'])}",
        ),
        Row(
            "scale",
            f"specs() of {s.scale_tools:,} tools",
            steady * 1e3,
            unit="ms",
            context=f"first call {ms(first_s)} (compiles every schema); "
            f"registering them took {ms(register_s)}",
        ),
    ]


# -- throughput ----------------------------------------------------------------------
async def bench_throughput(s: Settings) -> list[Row]:
    cpu = min(os.sched_getaffinity(0))
    os.sched_setaffinity(0, {cpu})  # before the SDK starts its export thread
    registry = noop_registry()
    cases = {
        "api": dispatch_case(dispatcher(registry)),
        "sdk": dispatch_case(dispatcher(registry, tracing="sdk")),
    }
    await sanity(cases)
    m = medians(await interleave(cases, s.rounds, s.calls, s.warmup))
    return [
        Row(
            "throughput",
            "sequential dispatches/s on one core, metrics + tracing API",
            1 / m["api"],
            unit="calls/s",
            context=f"{us(m['api'])} per call; pinned to CPU {cpu}",
        ),
        Row(
            "throughput",
            "sequential dispatches/s on one core, metrics + OTel SDK recording",
            1 / m["sdk"],
            unit="calls/s",
            context=f"{us(m['sdk'])} per call (span export thread on the same core)",
        ),
    ]


# -- typed tools ------------------------------------------------------------------------
async def bench_typed(s: Settings) -> list[Row]:
    """A typed handler (schema inferred from its signature, keyword arguments) against the
    ``(args, ctx)`` handler with the same hand-written schema, through the same dispatcher."""
    from typing import Annotated

    from pydantic import Field

    from toolrelay import CallContext

    async def city_typed(city: str) -> dict[str, str]:
        return {"city": city}

    async def city_contexts(city: str, auth: AuthContext, call: CallContext) -> dict[str, str]:
        return {"city": city, "user": auth.user_id or "", "tool": call.tool}

    # this module's annotations are strings naming names it does not import: set objects
    city_typed.__annotations__ = {
        "city": Annotated[str, Field(max_length=64)],
        "return": dict[str, str],
    }
    city_contexts.__annotations__ = {
        **city_typed.__annotations__,
        "auth": AuthContext,
        "call": CallContext,
    }
    registry = noop_registry()
    registry.tool(name="typed", breaker_key="svc")(city_typed)
    registry.tool(name="contexts", breaker_key="svc")(city_contexts)
    inferred = registry.resolve("typed")
    if inferred is None or dict(inferred.decl.parameters) != SCHEMA:
        raise RuntimeError(f"the typed tool's schema is not SCHEMA: {inferred}")
    d = dispatcher(registry, tracing="off")
    cases = {
        "dict": dispatch_case(d),
        "typed": dispatch_case(d, "typed"),
        "contexts": dispatch_case(d, "contexts"),
    }
    await sanity(cases)
    samples = await interleave(cases, s.rounds, s.calls, s.warmup)
    m = medians(samples)
    ratio = paired_ratio(samples["typed"], samples["dict"])
    return [
        Row(
            "typed",
            "typed handler (inferred schema, keyword arguments) / (args, ctx) handler",
            ratio,
            target="≤ 1.15×",
            passed=ratio <= 1.15,
            context=f"dispatch, telemetry off: dict {us(m['dict'])}, typed {us(m['typed'])}",
        ),
        Row(
            "typed",
            "typed handler taking AuthContext and CallContext / (args, ctx) handler",
            paired_ratio(samples["contexts"], samples["dict"]),
            context=f"{us(m['contexts'])}: CallContext.current() built per call",
        ),
    ]
