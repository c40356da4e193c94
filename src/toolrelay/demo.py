"""``toolrelay demo``: an agent keeps answering while the services it depends on fail.

The demo is a chaos experiment (:data:`DEMO`, scaled to ``--duration``) that the experiment
runner plays: the stand-in upstream on loopback, the bundled plugins against it, and a
scripted model (deterministic for a seed) that holds the model slot for each turn and
issues tool calls, sometimes several at once, while the fault schedule makes the search
upstream hang, the weather upstream answer 5xx in bursts and a sync tool block. It ends
with its invariants' verdicts and an exit status.
"""

from __future__ import annotations

import copy
import json
import random
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

from prometheus_client import CollectorRegistry

from .chaos.definition import Experiment, Extras
from .chaos.record import Check, Record, Run
from .chaos.report_html import require_renderer, write_html
from .chaos.runner import play
from .contract import AuthContext
from .demo_view import DemoReport
from .dispatcher import Dispatcher
from .registry import ToolRegistry
from .result import ToolCall, ToolResult

__all__ = ["DEMO", "MIN_DURATION_S", "DemoOptions", "DemoReport", "run_demo"]

MIN_DURATION_S = 10.0
"""The shortest run ``toolrelay demo`` accepts: the schedule scales, the 1 s deadlines and 1.5 s
breaks do not (at 5 s the search breaker could not close after its outage)."""
SLOT_BUDGET_S = 3.0
FALLBACK = "web_search_backup"
TIMEOUT_SLACK_S = 0.05
CITIES = ["Oslo", "Berlin", "London", "Paris", "Tokyo", "Sydney", "Reykjavík", "Cairo"]
QUERIES = ["circuit breaker pattern", "open-meteo api", "anyio cancellation", "searxng json"]
CUSTOMERS = [f"c-{n}" for n in range(100)]

DEMO: dict[str, Any] = {
    "name": "toolrelay demo",
    "duration_s": 30.0,
    "settle_s": 0,
    "config": {
        "plugins": {
            "weather": {"base_url": "${upstream}", "geocoding_url": "${upstream}"},
            "websearch": {"base_url": "${upstream}"},
            "feeds": {"feeds": {"status": "${upstream}/feeds/rss.xml"}},
            # a second search service answers while the first is down (docs/fallbacks.md)
            "backup": {
                "module": "toolrelay_plugins.websearch",
                "base_url": "${upstream}/backup",
                "tool": FALLBACK,
            },
        },
        "tools": {"web_search": {"timeout_s": 1.0, "fallback": [FALLBACK]}},
        "keys": {
            "searxng": {
                "breaker": {"fail_max": 2, "reset_timeout_s": 1.5},
                "retry": {"max_attempts": 1},
            },
            "open-meteo": {
                "breaker": {"fail_max": 4, "reset_timeout_s": 1.5},
                "retry": {"max_attempts": 2},
            },
            "legacy-crm": {
                "breaker": {"fail_max": 2, "reset_timeout_s": 1.5},
                "bulkhead": {"max_concurrent": 4},
            },
            # the status feed has a slow tail (1 in 5 takes 1.5 s): hedged after 0.15 s
            "feeds": {"hedge": {"after_s": 0.15}, "retry": {"max_attempts": 1}},
        },
    },
    "upstream_faults": [
        {"path": "/feeds", "fault": "slow_tail", "seconds": 0.01, "tail": 0.2, "tail_seconds": 1.5}
    ],
    "workload": {
        "agents": 1,
        "slot_budget_s": SLOT_BUDGET_S,
        "think_s": [0.1, 0.3],
        # the scripted model's menu: a list argument is a choice, drawn per call
        "calls": [
            {"tool": "web_search", "args": {"query": QUERIES}},
            {"tool": "web_search", "args": {"query": QUERIES, "max_results": 3}},
            {"tool": "weather_current", "args": {"city": CITIES}},
            {"tool": "weather_forecast", "args": {"city": CITIES, "days": 3}},
            {"tool": "feed_latest", "args": {"feed": "status", "limit": 3}},
            {"tool": "crm_lookup", "args": {"customer": CUSTOMERS}},
        ],
    },
    # times for a 30 s run: the schedule scales with --duration
    "faults": [
        {"label": "search upstream hangs", "from_s": 8.1, "until_s": 18.0,
         "breaker_key": "searxng", "upstream_path": "/search", "upstream_fault": "hang"},
        {"label": "weather upstream answers 503 in bursts", "from_s": 12.0, "until_s": 14.1,
         "breaker_key": "open-meteo", "upstream_path": "/v1/forecast",
         "upstream_fault": "status", "rate": 0.6, "status": 503},
        {"label": "sync CRM tool blocks", "from_s": 18.9, "until_s": 21.9,
         "breaker_key": "legacy-crm", "switch": "crm"},
        {"label": "weather upstream answers 503 in bursts", "from_s": 21.9, "until_s": 24.0,
         "breaker_key": "open-meteo", "upstream_path": "/v1/forecast",
         "upstream_fault": "status", "rate": 0.6, "status": 503},
    ],
}  # fmt: skip
"""The demo's scenario as experiment data (the config, the menu, the fault schedule)."""


@dataclass
class DemoOptions:
    duration_s: float = 30.0
    seed: int = 1
    metrics_port: int = 9464
    otlp_endpoint: str | None = None
    json_path: Path | None = None
    html_path: Path | None = None
    live: bool | None = None
    """Rich live view; ``None`` means: when stdout is a terminal and rich is installed."""


class ScriptedModel:
    """Picks the tool calls of each turn from what ``specs()`` offers, like a model would."""

    def __init__(self, menu: list[dict[str, Any]], seed: int, dispatcher: Dispatcher) -> None:
        self.menu = menu
        self.random = random.Random(seed)
        self.dispatcher = dispatcher
        self.counter = 0

    def _call(self, item: dict[str, Any]) -> ToolCall:
        rng = self.random
        args = {k: rng.choice(v) if isinstance(v, list) else v for k, v in item["args"].items()}
        self.counter += 1
        return ToolCall(item["tool"], json.dumps(args), f"call_{self.counter}")

    def turn(self) -> list[ToolCall]:
        specs = self.dispatcher.specs(hide_fallbacks=True)
        offered = {spec["function"]["name"] for spec in specs}
        rng = self.random
        calls = []
        for _ in range(rng.choice([1, 2, 2, 3])):
            item = rng.choice(self.menu)
            if item["tool"] not in offered and rng.random() < 0.8:
                continue  # the model was told the tool is unavailable; mostly it listens
            calls.append(self._call(item))
        if "web_search" in offered and not any(c.name == "web_search" for c in calls):
            calls.append(self._call(self.menu[0]))
        return calls

    def pause(self, results: list[ToolResult]) -> float:
        return self.random.uniform(0.1, 0.3)


def demo_experiment(duration_s: float, seed: int) -> Experiment:
    """:data:`DEMO` for a run of ``duration_s`` (its fault schedule scaled) and ``seed``."""
    data = copy.deepcopy(DEMO)
    scale = duration_s / DEMO["duration_s"]
    data.update(duration_s=duration_s, seed=seed)
    for item in data["faults"]:
        item["from_s"] *= scale
        item["until_s"] *= scale
    blocking = threading.Event()

    def crm_lookup(args: dict[str, Any], ctx: AuthContext) -> dict[str, Any]:
        """A sync tool over a legacy client: blocks while its fault window is on."""
        started = time.monotonic()
        while blocking.is_set() and time.monotonic() - started < 3.0:
            time.sleep(0.02)
        return {"customer": args["customer"], "tier": "gold", "open_tickets": 2}

    def tools(registry: ToolRegistry) -> None:
        registry.tool(
            name="crm_lookup",
            description="Look a customer up in the legacy CRM.",
            parameters={
                "type": "object",
                "properties": {"customer": {"type": "string", "minLength": 1, "maxLength": 64}},
                "required": ["customer"],
                "additionalProperties": False,
            },
            timeout_s=0.8,
            breaker_key="legacy-crm",
        )(crm_lookup)

    extras = Extras(
        tools=tools,
        switches={"crm": blocking},
        model=lambda dispatcher, seed, agent: ScriptedModel(
            data["workload"]["calls"], seed, dispatcher
        ),
        checks=_checks,
    )
    return Experiment.parse(data, extras=extras)


def _checks(run: Run) -> list[Check]:
    report = DemoReport(run.duration_s, run.seed, run.record, SLOT_BUDGET_S)
    record = run.record
    hang = next(w for w in record.windows if w.fault.startswith("search"))
    start, end = hang.from_s, hang.until_s
    opened = [at for at, key, _, new in record.moves if key == "searxng" and new == "open"]
    closed = [at for at, key, _, new in record.moves if key == "searxng" and new == "closed"]
    opened_in = [at for at in opened if start <= at <= end + 1.0]
    closed_after = [at for at in closed if opened_in and at >= end]
    max_hold = max(report.slot_holds, default=0.0)
    overruns = report.overruns_ms
    max_overrun = max(overruns, default=0.0)
    # while search was down: from the outage's start until its breaker closed after it
    until = closed_after[0] if closed_after else run.duration_s
    served = [ok for at, by, ok in report.served if by == FALLBACK and start <= at < until]
    return [
        Check(
            "every call answered",
            record.calls == record.answered and record.calls > 0,
            f"{record.answered}/{record.calls} answered",
        ),
        Check(
            "no slot held beyond its budget",
            max_hold <= SLOT_BUDGET_S + TIMEOUT_SLACK_S,
            f"max hold {max_hold:.3f} s of {SLOT_BUDGET_S:.1f} s",
        ),
        Check(
            "every timeout answered within its deadline + 50 ms",
            max_overrun <= TIMEOUT_SLACK_S * 1000,
            f"{len(overruns)} timeouts, max overrun {max_overrun:.1f} ms",
        ),
        Check(
            "the search breaker opened during the outage and closed after it",
            bool(opened_in and closed_after),
            (
                f"opened at {opened_in[0]:.1f} s, closed at {closed_after[0]:.1f} s "
                f"(outage {start:.1f}–{end:.1f} s)"
                if opened_in and closed_after
                else f"opened at {opened}, closed at {closed} (outage {start:.1f}–{end:.1f} s)"
            ),
        ),
        Check(
            f"{FALLBACK} answered web_search calls while search was down",
            sum(served) > 0,
            f"{sum(served)} ok answers served by {FALLBACK} "
            f"({len(served) - sum(served)} failed) between {start:.1f} and {until:.1f} s",
        ),
        Check(
            "no exception escaped",
            not record.escaped,
            f"{len(record.escaped)} escaped" + (f": {record.escaped[0]}" if record.escaped else ""),
        ),
    ]


async def run_demo(
    options: DemoOptions, out: TextIO = sys.stdout, view: Any | None = None
) -> DemoReport:
    """Run the demo; ``view`` (see :mod:`toolrelay.demo_view`) renders progress."""
    from .telemetry import serve_metrics

    if options.html_path is not None:
        require_renderer()  # before the run, not after it
    experiment = demo_experiment(options.duration_s, options.seed)
    report = DemoReport(options.duration_s, options.seed, slot_budget_s=SLOT_BUDGET_S)
    provider = None
    if options.otlp_endpoint:
        from .telemetry.otlp import otlp_tracer_provider

        provider = otlp_tracer_provider(options.otlp_endpoint, "toolrelay-demo")
    metrics = CollectorRegistry()
    server = None
    if options.metrics_port:
        try:
            server = serve_metrics(options.metrics_port, registry=metrics)
            report.metrics_url = f"http://127.0.0.1:{server.server_port}/metrics"
        except OSError as exc:
            print(f"toolrelay: not serving /metrics: port {options.metrics_port}: "
                  f"{exc.strerror}", file=out)  # fmt: skip

    async def watch(record: Record, dispatcher: Dispatcher) -> None:
        report.record = record
        if view is not None:
            await view.run(report, dispatcher, record.t0)

    try:
        run = await play(experiment, metrics=metrics, tracer_provider=provider, view=watch)
    finally:
        if server is not None:
            server.shutdown()
            server.server_close()
        if provider is not None:
            provider.shutdown()
    report.record, report.verdicts, report.timeline = run.record, run.checks, run.timeline
    if options.json_path is not None:
        options.json_path.write_text(json.dumps(report.to_json(), indent=2) + "\n")
    if options.html_path is not None:
        write_html([report.to_json()], options.html_path)
    return report
