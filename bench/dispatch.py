"""Per-call cost of ``Dispatcher.dispatch`` against a bare call of the same handler.

Cases run side by side in interleaved rounds; the table shows medians per call and the
ratio to the bare call, so the figures hold on a noisy shared machine.

    python bench/dispatch.py [--rounds 15] [--calls 2000] [--backend asyncio|trio]
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Awaitable, Callable
from typing import Any

import anyio
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter, SpanExportResult
from prometheus_client import CollectorRegistry

from toolrelay import (
    AuthContext,
    BreakerOptions,
    Dispatcher,
    DispatcherOptions,
    KeyPolicy,
    ToolRegistry,
)

CTX = AuthContext(user_id="u1", tenant_id="t1")
SCHEMA = {
    "type": "object",
    "properties": {"city": {"type": "string", "maxLength": 64}},
    "required": ["city"],
    "additionalProperties": False,
}
ARGS = '{"city": "Oslo"}'

Case = Callable[[], Awaitable[Any]]


def build() -> tuple[dict[str, Case], Case]:
    registry = ToolRegistry()

    async def noop(args: dict[str, Any], ctx: AuthContext) -> dict[str, Any]:
        return {"city": args["city"]}

    registry.tool(name="noop", parameters=SCHEMA, breaker_key="svc")(noop)
    registry.tool(name="noop_open", parameters=SCHEMA, breaker_key="down")(noop)
    breakers = {"down": KeyPolicy(breaker=BreakerOptions(reset_timeout_s=3600))}

    bare_dispatcher = Dispatcher(registry, DispatcherOptions(keys=breakers, telemetry=False))
    api_dispatcher = Dispatcher(
        registry, DispatcherOptions(keys=breakers), metrics_registry=CollectorRegistry()
    )
    provider = TracerProvider()
    provider.add_span_processor(BatchSpanProcessor(_Discard()))
    sdk_dispatcher = Dispatcher(
        registry,
        DispatcherOptions(keys=breakers),
        metrics_registry=CollectorRegistry(),
        tracer_provider=provider,
    )
    for d in (bare_dispatcher, api_dispatcher, sdk_dispatcher):
        d.breakers.force_open("down")
    parsed = {"city": "Oslo"}

    async def bare() -> Any:
        return await noop(parsed, CTX)

    def ok(dispatcher: Dispatcher) -> Case:
        async def run() -> Any:
            return await dispatcher.dispatch("noop", ARGS, CTX, call_id="c1")

        return run

    def fast_fail(dispatcher: Dispatcher) -> Case:
        async def run() -> Any:
            return await dispatcher.dispatch("noop_open", ARGS, CTX, call_id="c1")

        return run

    cases: dict[str, Case] = {
        "closed breaker, telemetry off": ok(bare_dispatcher),
        "closed breaker, metrics + tracing API only": ok(api_dispatcher),
        "closed breaker, metrics + OTel SDK recording": ok(sdk_dispatcher),
        "open breaker fast-fail, telemetry off": fast_fail(bare_dispatcher),
        "open breaker fast-fail, metrics + API only": fast_fail(api_dispatcher),
    }
    return cases, bare


class _Discard(SpanExporter):
    def export(self, spans: Any) -> SpanExportResult:
        return SpanExportResult.SUCCESS


async def measure(calls: int, rounds: int) -> dict[str, float]:
    cases, bare = build()
    everything = {"bare call": bare, **cases}
    samples: dict[str, list[float]] = {name: [] for name in everything}
    for fn in everything.values():  # warm up
        for _ in range(200):
            await fn()
    for _ in range(rounds):
        for name, fn in everything.items():
            start = time.perf_counter()
            for _ in range(calls):
                await fn()
            samples[name].append((time.perf_counter() - start) / calls)
    return {name: statistics.median(values) for name, values in samples.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--calls", type=int, default=2000)
    parser.add_argument("--backend", default="asyncio", choices=["asyncio", "trio"])
    opts = parser.parse_args()
    medians = anyio.run(measure, opts.calls, opts.rounds, backend=opts.backend)
    base = medians["bare call"]
    print(f"backend: {opts.backend}; {opts.rounds} interleaved rounds of {opts.calls} calls")
    print(f"{'case':<48}{'µs/call':>10}{'× bare':>10}{'overhead µs':>13}")
    for name, value in medians.items():
        over = (value - base) * 1e6
        print(f"{name:<48}{value * 1e6:>10.2f}{value / base:>10.1f}{over:>13.2f}")


if __name__ == "__main__":
    main()
