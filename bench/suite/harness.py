"""The shared harness: settings, rows and their targets, interleaved rounds timed in CPU
time with paired ratios, and the no-op tool with the dispatchers every benchmark builds."""

from __future__ import annotations

import gc
import math
import statistics
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio
import anyio.lowlevel
from prometheus_client import CollectorRegistry

from toolrelay import AuthContext, Dispatcher, DispatcherOptions, ToolRegistry, ToolResult

HERE = Path(__file__).resolve().parents[1]  # bench/: gateway.py, breaker_servers.py beside it
SKIP_BENCH = "skipped (pip install '.[bench]')"

CTX = AuthContext(user_id="u1", tenant_id="t1")
SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {"city": {"type": "string", "maxLength": 64}},
    "required": ["city"],
    "additionalProperties": False,
}
ARGS = '{"city": "Oslo"}'
PARSED = {"city": "Oslo"}
FLOOR_S = 0.001  # latency floor of the healthy-call p99 / unloaded ratios (asyncio: 1 ms)
COST_CLOCK = time.process_time
"""What a compared cost is timed with: the process's CPU time, not the wall clock. On a
shared machine a round's wall time also counts the slices other processes took meanwhile,
landing at random in one case or another; the CPU time leaves them out."""

Case = Callable[[], Awaitable[Any]]


# -- settings and rows ------------------------------------------------------------------
@dataclass(frozen=True)
class Settings:
    quick: bool
    rounds: int
    calls: int
    warmup: int
    memory_calls: int
    memory_warmup: int
    inflight: int
    floods: int
    async_flood: int = 1000
    sync_flood: int = 200
    flood_timeout_s: float = 0.2
    flood_spread_s: float = 0.1
    scale_tools: int = 10_000
    breaker_calls: int = 20_000
    """admit + record pairs per case and round (the breaker window rows)"""
    p99_rounds: int = 21
    p99_round_s: float = 0.5
    """each case's share of a round in the slowed-Redis p99 row"""
    transitions: int = 100
    """transitions timed in the replica convergence row"""

    @classmethod
    def make(cls, quick: bool) -> Settings:
        if quick:
            return cls(
                True, 5, 300, 100, 20_000, 5_000, 10_000, 1,
                breaker_calls=10_000, p99_rounds=3, p99_round_s=0.25, transitions=20,
            )  # fmt: skip
        return cls(False, 21, 2000, 500, 1_000_000, 50_000, 10_000, 3)


@dataclass
class Row:
    bench: str
    name: str
    value: float | None = None
    unit: str = "×"
    """"×", "ms", "MB", "calls/s", "slots", or "+µs" (a signed difference per call)."""
    target: str = ""
    passed: bool | None = None
    """True/False against the target; None for context rows, skips and errors."""
    context: str = ""
    status: str = ""
    """Overrides the computed status ("skipped …", "ERROR")."""
    in_force: bool = True
    """False: the target is judged and shown, but ``--check`` ignores it: a target whose
    ``--quick`` figure is noise, in a quick run; a flood's latency targets when other
    processes kept its event loop waiting for a CPU."""

    @property
    def verdict(self) -> str:
        if self.status:
            return self.status
        if self.passed is None:
            return "info"
        if not self.in_force:
            return "ok (not checked)" if self.passed else "miss (not checked)"
        return "ok" if self.passed else "MISS"

    @property
    def fails_check(self) -> bool:
        """A target in force that was missed, or a benchmark that failed."""
        return self.status == "ERROR" or (self.passed is False and self.in_force)

    def shown(self) -> str:
        if self.value is None:
            return "—"
        if self.unit == "×":
            return f"{self.value:.2f}×"
        if self.unit == "calls/s":
            return f"{self.value:,.0f} calls/s"
        if self.unit == "MB":
            return f"{self.value:.2f} MB"
        if self.unit == "slots":
            return f"{self.value:.0f} slots"
        if self.unit == "+µs":
            return f"{self.value:+.2f} µs"
        return f"{self.value:.2f} {self.unit}"


def us(seconds: float) -> str:
    return f"{seconds * 1e6:.2f} µs"


def ms(seconds: float) -> str:
    return f"{seconds * 1e3:.2f} ms"


def percentile(values: Sequence[float], q: float) -> float:
    """Nearest-rank percentile (q in 0..100)."""
    ordered = sorted(values)
    index = max(0, math.ceil(q / 100 * len(ordered)) - 1)
    return ordered[index]


def paired_ratio(top: Sequence[float], bottom: Sequence[float]) -> float:
    """Median of the per-round ratios top/bottom (both measured in the same round)."""
    return statistics.median(a / b for a, b in zip(top, bottom, strict=True))


def paired_difference(top: Sequence[float], bottom: Sequence[float]) -> float:
    """Median of the per-round differences top − bottom (both measured in the same round)."""
    return statistics.median(a - b for a, b in zip(top, bottom, strict=True))


async def interleave(
    cases: dict[str, Case], rounds: int, calls: int, warmup: int
) -> dict[str, list[float]]:
    """Seconds per call of each case, one sample per round; order alternates each round."""
    names = list(cases)
    for fn in cases.values():
        for _ in range(warmup):
            await fn()
    samples: dict[str, list[float]] = {name: [] for name in names}
    for index in range(rounds):
        for name in names if index % 2 == 0 else reversed(names):
            fn = cases[name]
            gc.collect()
            # let the loop run once: asyncio drops cancelled timers (every deadline's
            # CancelScope arms one) only when it iterates, and these loops never yield
            await anyio.lowlevel.checkpoint()
            started = COST_CLOCK()
            for _ in range(calls):
                await fn()
            samples[name].append((COST_CLOCK() - started) / calls)
    return samples


def medians(samples: dict[str, list[float]]) -> dict[str, float]:
    return {name: statistics.median(values) for name, values in samples.items()}


def interleave_sync(
    cases: dict[str, Callable[[int], None]], rounds: int, calls: int, warmup: int
) -> dict[str, list[float]]:
    """:func:`interleave` for synchronous cases: ``fn(n)`` makes ``n`` calls in a loop."""
    names = list(cases)
    for fn in cases.values():
        fn(warmup)
    samples: dict[str, list[float]] = {name: [] for name in names}
    for index in range(rounds):
        for name in names if index % 2 == 0 else reversed(names):
            gc.collect()
            started = COST_CLOCK()
            cases[name](calls)
            samples[name].append((COST_CLOCK() - started) / calls)
    return samples


# -- the tool and the dispatchers -------------------------------------------------------
async def noop(args: dict[str, Any], ctx: AuthContext) -> dict[str, Any]:
    return {"city": args["city"]}


def sdk_provider() -> Any:
    """An OTel SDK TracerProvider recording every span into a BatchSpanProcessor that
    exports to nowhere (the SDK's own work, without any I/O)."""
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter, SpanExportResult

    class Discard(SpanExporter):
        def export(self, spans: Any) -> SpanExportResult:
            return SpanExportResult.SUCCESS

    provider = TracerProvider()
    provider.add_span_processor(BatchSpanProcessor(Discard()))
    return provider


def noop_registry() -> ToolRegistry:
    registry = ToolRegistry()
    registry.tool(name="noop", parameters=SCHEMA, breaker_key="svc")(noop)
    return registry


def dispatcher(registry: ToolRegistry, *, tracing: str = "api", **settings: Any) -> Dispatcher:
    """``tracing``: "off" (no telemetry at all), "api" (metrics on a fresh registry, tracing
    API with no SDK configured) or "sdk" (metrics, and an SDK provider recording spans).
    ``settings``: :class:`DispatcherOptions` fields (``keys=…``, ``storage=…``) and the
    dispatcher's live keyword arguments, told apart by name."""
    fields = {name: settings.pop(name) for name in DispatcherOptions.model_fields & settings.keys()}
    options = DispatcherOptions(**fields)
    if tracing == "off":
        return Dispatcher(registry, options.replace(telemetry=False), **settings)
    provider = sdk_provider() if tracing == "sdk" else None
    return Dispatcher(
        registry,
        options,
        metrics_registry=CollectorRegistry(),
        tracer_provider=provider,
        **settings,
    )


def dispatch_case(d: Dispatcher, name: str = "noop", expect: str | None = None) -> Case:
    async def run() -> Any:
        return await d.dispatch(name, ARGS, CTX, call_id="call_1")

    run.expect = expect  # type: ignore[attr-defined]
    return run


async def sanity(cases: dict[str, Case]) -> None:
    """Every dispatch case answers as it should before anything is timed."""
    for name, fn in cases.items():
        result = await fn()
        if not isinstance(result, ToolResult):
            continue
        expect = getattr(fn, "expect", None)
        if (result.error_type if expect is not None else result.ok) != (expect or True):
            raise RuntimeError(f"case {name!r} answered {result.to_model()}, expected {expect}")
