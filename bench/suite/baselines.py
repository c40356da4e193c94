"""toolrelay against what a user would otherwise write: the naive stack composed by hand
from the same packages (and what recording spans costs beyond it), and the OpenAI Agents
SDK's ``function_tool``."""

from __future__ import annotations

import importlib
import importlib.metadata
import json
import statistics
import time
from collections.abc import Awaitable, Callable
from typing import Any

import anyio
import anyio.lowlevel
from prometheus_client import CollectorRegistry

from toolrelay import AuthContext

from .harness import (
    ARGS,
    CTX,
    PARSED,
    SCHEMA,
    SKIP_BENCH,
    Case,
    Row,
    Settings,
    dispatch_case,
    dispatcher,
    interleave,
    medians,
    noop,
    noop_registry,
    paired_ratio,
    sanity,
    sdk_provider,
    us,
)

# -- the naive stack -----------------------------------------------------------------
NAIVE_VALIDATORS = {"jsonschema": "pure-Python jsonschema", "jsonschema_rs": "jsonschema-rs"}


def naive_stack(
    validation: str = "jsonschema",
) -> Callable[[str, str, AuthContext], Awaitable[dict[str, Any]]]:
    """What a user would compose by hand from the same packages. ``validation``: the
    validator package, "jsonschema" (pure Python) or "jsonschema_rs" (what toolrelay uses);
    either way a ``Draft202012Validator`` built once, whose ``validate`` raises."""
    import pybreaker
    from prometheus_client import Counter, Histogram
    from tenacity import (
        AsyncRetrying,
        retry_if_exception_type,
        stop_after_attempt,
        wait_exponential_jitter,
    )

    package: Any = importlib.import_module(validation)
    invalid: Any = package.ValidationError
    validator = package.Draft202012Validator(SCHEMA)
    breaker = pybreaker.CircuitBreaker(fail_max=5, reset_timeout=30)
    tracer = sdk_provider().get_tracer("naive")
    metrics = CollectorRegistry()
    calls = Counter("tool_calls", "Tool calls.", ("tool", "outcome"), registry=metrics)
    duration = Histogram(
        "tool_call_duration_seconds", "Call time.", ("tool", "outcome"), registry=metrics
    )
    tools = {"noop": (noop, 10.0)}

    class Retryable(Exception):
        pass

    async def naive_dispatch(name: str, raw: str, ctx: AuthContext) -> dict[str, Any]:
        started = time.perf_counter()
        fn, timeout_s = tools[name]
        with tracer.start_as_current_span(f"execute_tool {name}") as span:
            span.set_attribute("gen_ai.operation.name", "execute_tool")
            span.set_attribute("gen_ai.tool.name", name)
            try:
                args = json.loads(raw)
                validator.validate(args)
                with anyio.fail_after(timeout_s):
                    async for attempt in AsyncRetrying(
                        stop=stop_after_attempt(3),
                        wait=wait_exponential_jitter(initial=0.05, max=2.0),
                        retry=retry_if_exception_type((Retryable, TimeoutError)),
                        reraise=True,
                    ):
                        with attempt, breaker.calling():
                            data = await fn(args, ctx)
                answer = {"ok": True, "data": data}
                outcome = "ok"
            except invalid as exc:
                answer = {"ok": False, "error_type": "validation_error", "message": exc.message}
                outcome = "validation_error"
            except pybreaker.CircuitBreakerError:
                answer = {"ok": False, "error_type": "circuit_open"}
                outcome = "circuit_open"
            except TimeoutError:
                answer = {"ok": False, "error_type": "timeout"}
                outcome = "timeout"
            except Exception as exc:
                answer = {"ok": False, "error_type": "tool_error", "message": type(exc).__name__}
                outcome = "tool_error"
            span.set_attribute("toolrelay.outcome", outcome)
        calls.labels(name, outcome).inc()
        duration.labels(name, outcome).observe(time.perf_counter() - started)
        return answer

    return naive_dispatch


EXTRAS_NAME = (
    "tracing extras: (toolrelay, SDK recording − tracing API) / one bare SDK span around "
    "the same dispatch"
)
EXTRAS_LIMIT = 1.25


async def bench_naive(s: Settings) -> list[Row]:
    try:
        import jsonschema  # noqa: F401
        import jsonschema_rs  # noqa: F401
        import opentelemetry.sdk  # noqa: F401
    except ImportError:
        return [Row("naive", EXTRAS_NAME, target=f"≤ {EXTRAS_LIMIT}×", status=SKIP_BENCH)]
    naives = {kind: naive_stack(kind) for kind in NAIVE_VALIDATORS}
    for naive in naives.values():
        assert (await naive("noop", ARGS, CTX))["ok"]
        assert (await naive("noop", '{"city": 5}', CTX))["error_type"] == "validation_error"
    registry = noop_registry()

    def by_hand(kind: str) -> Case:
        naive = naives[kind]

        async def run() -> Any:
            return await naive("noop", ARGS, CTX)

        return run

    tracer = sdk_provider().get_tracer("ceiling")

    async def span_only() -> Any:
        with tracer.start_as_current_span("execute_tool noop"):
            return await noop(PARSED, CTX)

    async def bare() -> Any:
        return await noop(PARSED, CTX)

    api = dispatch_case(dispatcher(registry))

    async def around() -> Any:  # the same dispatch (tracing API only) inside one bare span
        with tracer.start_as_current_span("execute_tool noop"):
            return await api()

    cases = {
        "jsonschema": by_hand("jsonschema"),
        "jsonschema_rs": by_hand("jsonschema_rs"),
        "sdk": dispatch_case(dispatcher(registry, tracing="sdk")),
        "api": api,
        "span": span_only,
        "bare": bare,
        "around": around,
    }
    await sanity(cases)
    samples = await interleave(cases, s.rounds, s.calls, s.warmup)
    m = medians(samples)
    # what recording costs toolrelay beyond the tracing API, in bare spans (the bare call
    # is taken off the span case); every figure of a round is from that round
    span_s = [a - b for a, b in zip(samples["span"], samples["bare"], strict=True)]
    extras_s = [a - b for a, b in zip(samples["sdk"], samples["api"], strict=True)]
    extras = paired_ratio(extras_s, span_s)
    per_round = sorted(a / b for a, b in zip(extras_s, span_s, strict=True))
    spread = f"{per_round[len(per_round) // 4]:.2f}–{per_round[-1 - len(per_round) // 4]:.2f}"
    rows = []
    for kind, label in NAIVE_VALIDATORS.items():
        rows.append(
            Row(
                "naive",
                f"naive stack ({label}) / toolrelay (OTel SDK recording)",
                paired_ratio(samples[kind], samples["sdk"]),
                context=f"naive {us(m[kind])}, toolrelay {us(m['sdk'])}; "
                f"{paired_ratio(samples[kind], samples['api']):.2f}× toolrelay with the "
                f"tracing API only ({us(m['api'])}); "
                f"{paired_ratio(samples[kind], samples['span']):.2f}× one bare SDK span, "
                "the most any wrapper recording a span could reach",
            )
        )
    around_s = [a - b for a, b in zip(samples["around"], samples["api"], strict=True)]
    in_place = paired_ratio(extras_s, around_s)
    rows.append(
        Row(
            "naive",
            EXTRAS_NAME,
            in_place,
            target=f"≤ {EXTRAS_LIMIT}×",
            passed=in_place <= EXTRAS_LIMIT,
            in_force=not s.quick,  # a quick run's 5 rounds of 300 calls swing ±0.5 here
            context=f"+{us(statistics.median(extras_s))} per call recording "
            f"({us(m['sdk'])} vs {us(m['api'])}) against +{us(statistics.median(around_s))} "
            "for one bare span (`start_as_current_span`, no attributes) around the same "
            f"dispatch (tracing API only); per-round interquartile range {spread}",
        )
    )
    rows.append(
        Row(
            "naive",
            "tracing extras against one bare SDK span timed alone (a tight loop)",
            extras,
            context=f"one bare span timed in a tight loop costs {us(statistics.median(span_s))}"
            f", {paired_ratio(around_s, span_s):.2f}× less than the same span amid a "
            "dispatch's code and objects (cache-warm SDK code); a span with no attributes "
            "reads about 1.5× here, so this row is context, not a target",
        )
    )
    return rows


# -- the OpenAI Agents SDK ------------------------------------------------------------
async def bench_agents(s: Settings) -> list[Row]:
    try:
        from typing import Annotated

        from agents import function_tool, set_tracing_disabled
        from agents.tool import invoke_function_tool
        from agents.tool_context import ToolContext
        from pydantic import Field
    except ImportError:
        name = "toolrelay / OpenAI Agents SDK function_tool"
        return [Row("agents", name, target="≤ 2×", status=SKIP_BENCH)]
    set_tracing_disabled(True)

    async def city_noop(city: str) -> dict[str, Any]:
        """Echo the city."""
        return {"city": city}

    # the same constraint as SCHEMA; set as objects, since this module's annotations are
    # strings that the SDK would resolve in the module's globals
    city_noop.__annotations__ = {
        "city": Annotated[str, Field(max_length=64)],
        "return": dict[str, Any],
    }

    # ``timeout`` is function_tool's parameter (FunctionTool.timeout_seconds). The SDK
    # enforces it in invoke_function_tool (asyncio.wait_for on a new task), the path its
    # Runner takes; on_invoke_tool alone parses, validates and calls, with no timeout.
    tool = function_tool(city_noop, name_override="noop", timeout=10.0)
    assert tool.timeout_seconds == 10.0

    def tool_context() -> Any:
        return ToolContext(None, tool_name="noop", tool_call_id="call_1", tool_arguments=ARGS)

    async def sdk_timed() -> Any:
        return await invoke_function_tool(
            function_tool=tool, context=tool_context(), arguments=ARGS
        )

    async def sdk_plain() -> Any:
        return await tool.on_invoke_tool(tool_context(), ARGS)

    for fn in (sdk_timed, sdk_plain):
        got = await fn()
        if got != PARSED:
            raise RuntimeError(f"the Agents SDK tool answered {got!r}")
    registry = noop_registry()
    cases = {
        "toolrelay": dispatch_case(dispatcher(registry)),
        "timed": sdk_timed,
        "plain": sdk_plain,
    }
    await sanity(cases)
    samples = await interleave(cases, s.rounds, s.calls, s.warmup)
    m = medians(samples)
    timed = paired_ratio(samples["toolrelay"], samples["timed"])
    version = importlib.metadata.version("openai-agents")
    return [
        Row(
            "agents",
            "toolrelay / Agents SDK invoke_function_tool (timeout enforced)",
            timed,
            target="≤ 2×",
            passed=timed <= 2,
            context=f"toolrelay {us(m['toolrelay'])}, openai-agents {version} {us(m['timed'])}",
        ),
        Row(
            "agents",
            "toolrelay / Agents SDK on_invoke_tool alone (no timeout)",
            paired_ratio(samples["toolrelay"], samples["plain"]),
            context=f"on_invoke_tool {us(m['plain'])} (ToolContext built per call)",
        ),
    ]
