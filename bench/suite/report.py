"""The report: the text table a run prints, and bench/RESULTS.md (machine, table, method)."""

from __future__ import annotations

import importlib
import importlib.metadata
import os
import platform
import time
from collections.abc import Sequence

from .deadline import BARE_SHARE_LIMIT
from .flood import CPU_WAIT_LIMIT_S
from .harness import (
    ARGS,
    FLOOR_S,
    HERE,
    Row,
    Settings,
)

PACKAGES = (
    "toolrelay",
    "anyio",
    "pybreaker",
    "tenacity",
    "jsonschema-rs",
    "jsonschema",
    "opentelemetry-api",
    "opentelemetry-sdk",
    "prometheus-client",
    "pydantic",
    "openai-agents",
)


def machine() -> list[tuple[str, str]]:
    cpu = "unknown"
    try:
        with open("/proc/cpuinfo") as info:
            for line in info:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    versions = []
    for package in PACKAGES:
        try:
            versions.append(f"{package} {importlib.metadata.version(package)}")
        except importlib.metadata.PackageNotFoundError:
            versions.append(f"{package} (not installed)")
    load = ", ".join(f"{x:.2f}" for x in os.getloadavg())
    return [
        ("CPU", cpu),
        ("cores", f"{os.cpu_count()} ({len(os.sched_getaffinity(0))} usable)"),
        ("load average at start", load),
        ("OS", f"{platform.system()} {platform.release()}"),
        ("Python", f"{platform.python_implementation()} {platform.python_version()}"),
        ("event loop", "asyncio (anyio)"),
        ("packages", "; ".join(versions)),
    ]


HEADERS = ("benchmark", "result", "target", "status", "context")


def cells(row: Row) -> tuple[str, str, str, str, str]:
    return (row.name, row.shown(), row.target or "—", row.verdict, row.context)


def text_table(rows: Sequence[Row]) -> str:
    table = [HEADERS, *(cells(r) for r in rows)]
    widths = [max(len(line[i]) for line in table) for i in range(4)]
    lines = []
    for index, line in enumerate(table):
        head = "  ".join(
            cell.ljust(widths[i]) if i in (0, 3) else cell.rjust(widths[i])
            for i, cell in enumerate(line[:4])
        )
        lines.append(f"{head}  {line[4]}".rstrip())
        if index == 0:
            lines.append("-" * (sum(widths) + 2 * len(widths) + len(HEADERS[4])))
    return "\n".join(lines)


def markdown(rows: Sequence[Row], settings: Settings, wall_s: float, command: str) -> str:
    """bench/RESULTS.md: ``command`` (how the suite was run), the machine, the table and the
    method."""
    out = ["# toolrelay benchmark results", ""]
    out.append(f"`{command}` on {time.strftime('%Y-%m-%d %H:%M %Z')}, {wall_s:.0f} s in all.")
    out += ["", "## Machine", ""]
    out += [f"- **{key}**: {value}" for key, value in machine()]
    out += ["", "## Results", ""]
    out.append("| " + " | ".join(HEADERS) + " |")
    out.append("|---|---:|---|---|---|")
    for row in rows:
        out.append("| " + " | ".join(c.replace("|", "\\|") for c in cells(row)) + " |")
    out += [
        "",
        "## Method",
        "",
        "Each benchmark runs in a fresh interpreter, in its own session, on asyncio. Compared "
        f"costs are measured side by side: {settings.rounds} interleaved rounds of "
        f"{settings.calls} sequential calls per case (order alternating round by round, a "
        "warm-up first), each round timed in the process's CPU time (`time.process_time`: "
        "the slices other processes take meanwhile are left out); a ratio is the median of "
        "the per-round ratios, an absolute figure the median per call. The tool is "
        "a no-op `async def` with a one-property JSON Schema, called with "
        f'`{ARGS}`. "Tracing API" means no OpenTelemetry SDK is configured; "OTel SDK '
        'recording" means a `TracerProvider` with a `BatchSpanProcessor` exporting to '
        "nowhere. Metrics always go to a fresh `CollectorRegistry`.",
        "",
        "- **naive stack**: `json.loads`, a `Draft202012Validator` built once (one row with "
        "the pure-Python `jsonschema`, one with `jsonschema_rs`, which toolrelay uses), "
        "`anyio.fail_after`, tenacity `AsyncRetrying(stop_after_attempt(3), "
        "wait_exponential_jitter)`, `pybreaker.CircuitBreaker.calling()`, an SDK span with "
        "three attributes and a prometheus-client counter and histogram. Context only: one "
        "bare SDK span costs about a seventh of the naive stack, so no wrapper that records a "
        "span can be much more than 7× faster than it.",
        "- **tracing extras**: what recording costs toolrelay beyond the tracing API, in "
        "bare spans: per round (toolrelay with the SDK recording − toolrelay with the "
        "tracing API) / (one bare `start_as_current_span` around toolrelay's dispatch with "
        "the tracing API − that dispatch), the median of the per-round ratios; the cases "
        "share the rounds. 1.0 would be one span's cost and nothing more. The same extras "
        "against a bare span timed alone in a tight loop are shown as context: that span's "
        "SDK code stays cache-warm and costs about half what it costs amid a dispatch.",
        "- **Agents SDK**: `function_tool(timeout=…)` is enforced by `invoke_function_tool` "
        "(the Runner's path: `asyncio.wait_for` on a new task); `on_invoke_tool` alone "
        "enforces no timeout. A `ToolContext` is built per call, as the Runner does.",
        f"- **deadline**: {settings.async_flood} concurrent calls to an `async` tool that "
        f"never returns and {settings.sync_flood} to a `def` tool blocked on "
        f"`threading.Event.wait` (released after), `timeout_s={settings.flood_timeout_s}`. "
        f"The checked floods arrive evenly over {settings.flood_spread_s * 1e3:g} ms "
        f"({settings.async_flood / settings.flood_spread_s:,.0f} calls/s for the async "
        "flood, in 1 ms steps), so every call is in flight at once before the first "
        "deadline; the stress floods start every call in one event-loop iteration, which "
        "stalls everything else in the process for the whole launch (~35 µs a call here, "
        "most of it starting the task and the pipeline up to the handler's first await), "
        "so they are reported, not checked. Lateness = `perf_counter()` after `dispatch` "
        "returns − (start + timeout_s). Healthy calls (one `await anyio.sleep(0)`) on "
        "another breaker key are launched open-loop, one per ms, each timed from when it "
        "was due; p99 over the flood window against the p99 of the same probe over an "
        "unloaded window of 0.3 s just before the flood (a ratio per flood, the median of "
        f"them), both floored at {FLOOR_S * 1e3:g} ms (asyncio's epoll waits have 1 ms "
        "resolution). The checked async flood is judged on toolrelay's own share: each of "
        "its floods is paired with the same flood on bare anyio in the same run "
        "(`json.loads` and `anyio.fail_after` around the handler, the healthy call one "
        "checkpoint; the order alternating pair by pair), and the target "
        f"(≤ {BARE_SHARE_LIMIT:g}×) is on the median of the per-pair ratios of the two "
        "healthy-p99 ratios, so what the machine does to the event loop counts on both "
        "sides. The event loop runs at real-time priority (`SCHED_FIFO`, the lowest "
        "level; the threads it starts inherit it) where the OS permits, so that what is "
        "measured is toolrelay's share of the loop, not the other processes' share of the "
        "CPU (`--normal-priority` to not); how long the loop waited for a CPU is read from "
        "`/proc/thread-self/schedstat`, and a flood's targets are not checked if it waited "
        f"more than {CPU_WAIT_LIMIT_S * 1e3:g} ms. The 'neighbour' rows repeat the checked "
        "async flood beside a CPU-bound process (in its own session): on the other CPU at "
        "the checked floods' priority, then on the loop's own CPU with both at the normal "
        "priority (a quick run: this one only), each beside the same flood without toolrelay "
        "(`anyio.fail_after` around "
        "the handler). The "
        "garbage collector's pauses during each flood are recorded (`gc.callbacks`); the "
        "'collector paused' rows repeat the checked floods with `gc.disable()`, to show "
        "what is toolrelay's and what is CPython's. The first sync flood starts the key's "
        "worker threads, the later ones reuse them. Once every sync handler has returned, "
        "the key's worker slots should all be free.",
        "- **memory**: RSS from `/proc/self/statm` after `gc.collect()`, after a warm-up of "
        f"{settings.memory_warmup:,} calls; 1 call in 10 fails validation, 1 in 50 names an "
        "unknown tool (a new name each time), every call has its own call id, and the loop "
        "yields to the event loop every 100 calls (asyncio frees the cancelled timer that "
        "each call's deadline armed only when the loop iterates: a loop that never yields "
        "keeps ~200 B per call). Peak RSS is "
        "`ru_maxrss` after parking the in-flight calls on an `anyio.Event`.",
        "- **throughput**: the worker process is pinned to one CPU (`sched_setaffinity`), "
        "the SDK's export thread included; calls/s is 1 / the CPU time per call.",
        "- **breakers**: the window rows time `KeyBreaker.admit()` + `record()` in a plain "
        f"loop ({settings.breaker_calls:,} pairs per case and round, interleaved as above, 1 "
        "call in 20 a failure; `failure_rate=1.0`, so every failure computes the rate but "
        "none opens the breaker); the result is the median of the per-round differences "
        "from the consecutive counter. The Redis rows start a private `redis-server` on a "
        "loopback port (skipped without one, or without the `redis` package). A shared "
        "dispatcher's link syncs every 0.2 s on its own threads; a row's dispatchers share "
        "one process, so every case runs beside every link's threads. The slowed row puts "
        "tests/slow_proxy.py's `SlowProxy` (+40 ms on every command; link timeout 1 s) "
        "before one dispatcher's Redis and times back-to-back healthy dispatches, "
        f"{settings.p99_round_s:g} s per case and round ({settings.p99_rounds} rounds); the "
        "ratio is the median of the per-round p99 ratios, and the row is an error unless the "
        "slowed link synced meanwhile and both links stayed up. Convergence: replica A "
        "forces its breaker open and closed in turn, replica B (its own link, the same "
        "server) is polled with `anyio.sleep(0.0005)` until it reports the state; beside it, "
        "when the update reached B's inbox (stamped on B's listener thread).",
        "",
        "`--check` fails on a missed target in force, or a benchmark error. Every target is "
        'in force unless its status says "(not checked)": in a `--quick` run, tracing '
        "extras, the 10,000-tool scale, the slowed-Redis p99 and the flood latencies (one "
        "flood) are noise and only shown; in any run, a flood's latency targets when its "
        f"event loop waited more than {CPU_WAIT_LIMIT_S * 1e3:g} ms for a CPU.",
        "",
    ]
    history = HERE / "OPTIMISATIONS.md"
    if history.exists():  # the hand-kept log of what each optimisation bought
        out += [history.read_text(encoding="utf-8").rstrip(), ""]
    return "\n".join(out)
