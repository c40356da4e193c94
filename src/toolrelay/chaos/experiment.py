"""``toolrelay chaos run EXPERIMENT.toml``: a workload, a fault schedule, invariant verdicts.

An experiment names the toolrelay config under test (inline, the same schema as
``toolrelay.toml``; ``${upstream}`` stands for the stand-in upstream's URL), a workload of N
concurrent agent loops each holding its own model slot, a steady-state hypothesis, a fault
schedule — on the wire (the stand-in upstream) or in the pipeline (fault injection) — and
the invariants to hold. Each invariant is reported with its measured figure; the exit
status is 1 when one is violated.
"""

from __future__ import annotations

import json
import math
import random
import sys
import threading
import tomllib
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

import anyio
import jsonschema_rs
from prometheus_client import CollectorRegistry

from ..breakers import KeyBreaker
from ..config import ConfigError, parse_config
from ..contract import AuthContext
from ..dispatcher import Dispatcher
from ..faults import Fault
from ..result import ToolCall, ToolResult
from .timeline import Timeline, Window
from .upstream import Upstream

__all__ = ["EXPERIMENT_SCHEMA", "Experiment", "ExperimentReport", "main", "run_experiment"]

_SECONDS = {"type": "number", "minimum": 0}
EXPERIMENT_SCHEMA: dict[str, Any] = {
    "type": "object",
    "additionalProperties": False,
    "required": ["name", "config", "workload"],
    "properties": {
        "name": {"type": "string"},
        "description": {"type": "string"},
        "seed": {"type": "integer"},
        "duration_s": {"type": "number", "exclusiveMinimum": 0, "maximum": 3600},
        "settle_s": _SECONDS,
        "config": {"type": "object"},
        "upstream": {"type": "boolean"},
        "workload": {
            "type": "object",
            "additionalProperties": False,
            "required": ["calls"],
            "properties": {
                "agents": {"type": "integer", "minimum": 1, "maximum": 200},
                "slot_budget_s": {"type": "number", "exclusiveMinimum": 0},
                "think_s": {"type": "array", "items": _SECONDS, "minItems": 2, "maxItems": 2},
                "honour_retry_after": {"type": "boolean"},
                "calls_per_turn": {
                    "type": "array",
                    "items": {"type": "integer", "minimum": 1},
                    "minItems": 2,
                    "maxItems": 2,
                },
                "calls": {
                    "type": "array",
                    "minItems": 1,
                    "items": {
                        "type": "object",
                        "additionalProperties": False,
                        "required": ["tool"],
                        "properties": {
                            "tool": {"type": "string"},
                            "args": {"type": "object"},
                            "weight": {"type": "number", "exclusiveMinimum": 0},
                        },
                    },
                },
            },
        },
        "steady_state": {
            "type": "object",
            "additionalProperties": False,
            "properties": {
                "max_error_ratio": {"type": "number", "minimum": 0, "maximum": 1},
                "min_calls": {"type": "integer", "minimum": 0},
            },
        },
        "faults": {
            "type": "array",
            "items": {
                "type": "object",
                "required": ["from_s", "until_s"],
                "properties": {
                    "from_s": _SECONDS,
                    "until_s": _SECONDS,
                    "upstream_path": {"type": "string", "pattern": "^/"},
                    "upstream_fault": {"type": "string"},
                },
            },
        },
        "invariants": {
            "type": "object",
            "additionalProperties": False,
            "properties": {
                "deadline_slack_ms": _SECONDS,
                "breakers": {"type": "array", "items": {"type": "string"}},
                "no_leaks": {"type": "boolean"},
            },
        },
    },
}
_VALIDATOR = jsonschema_rs.Draft202012Validator(EXPERIMENT_SCHEMA, offline=True)


@dataclass
class Experiment:
    name: str
    data: dict[str, Any]
    path: Path | None = None

    @classmethod
    def load(cls, path: str | Path) -> Experiment:
        file = Path(path)
        try:
            data = tomllib.loads(file.read_text(encoding="utf-8"))
        except OSError as exc:
            raise ConfigError(f"{file}: cannot read ({exc.strerror or exc})") from None
        except tomllib.TOMLDecodeError as exc:
            raise ConfigError(f"{file}: not valid TOML: {exc}") from None
        return cls.parse(data, file)

    @classmethod
    def parse(cls, data: dict[str, Any], path: Path | None = None) -> Experiment:
        errors = [
            f"{'.'.join(str(p) for p in e.instance_path) or '(top level)'}: {e.message}"
            for e in _VALIDATOR.iter_errors(data)
        ]
        if errors:
            raise ConfigError(f"{path or 'experiment'}: {'; '.join(errors[:5])}")
        try:
            for item in data.get("faults", []):
                if "upstream_path" not in item:
                    spec = {k: v for k, v in item.items() if k not in ("from_s", "until_s")}
                    Fault.from_dict(spec)
                elif "upstream_fault" not in item:
                    raise ValueError("an upstream fault needs upstream_fault")
        except (TypeError, ValueError) as exc:
            raise ConfigError(f"{path or 'experiment'}: faults: {exc}") from None
        return cls(str(data["name"]), data, path)


@dataclass
class Verdict:
    name: str
    ok: bool
    figure: str


@dataclass
class ExperimentReport:
    name: str
    seed: int
    duration_s: float
    calls: int = 0
    answers: int = 0
    escaped: list[str] = field(default_factory=list)
    outcomes: Counter[str] = field(default_factory=Counter)
    verdicts: list[Verdict] = field(default_factory=list)
    timeline: Timeline | None = None

    @property
    def ok(self) -> bool:
        return all(v.ok for v in self.verdicts)

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "seed": self.seed,
            "duration_s": self.duration_s,
            "calls": self.calls,
            "answers": self.answers,
            "outcomes": dict(self.outcomes),
            "exceptions_escaped": self.escaped,
            "invariants": [v.__dict__ for v in self.verdicts],
            "ok": self.ok,
            "timeline": (self.timeline or Timeline(self.duration_s)).to_json(),
        }


def _substitute(value: Any, url: str) -> Any:
    if isinstance(value, str):
        return value.replace("${upstream}", url)
    if isinstance(value, dict):
        return {k: _substitute(v, url) for k, v in value.items()}
    if isinstance(value, list):
        return [_substitute(v, url) for v in value]
    return value


@dataclass
class _Watch:
    """What the runner records while the experiment runs."""

    t0: float
    transitions: list[tuple[float, str, str, str, int, int, int]] = field(default_factory=list)
    failures_at_start: dict[str, int] = field(default_factory=dict)
    attempts: list[tuple[float, str, str]] = field(default_factory=list)
    answers: list[tuple[float, str, ToolResult, float]] = field(default_factory=list)
    holds: list[tuple[float, float]] = field(default_factory=list)

    def now(self) -> float:
        return anyio.current_time() - self.t0


class _Runner:
    def __init__(self, experiment: Experiment, seed: int | None) -> None:
        self.data = experiment.data
        self.name = experiment.name
        self.seed = self.data.get("seed", 1) if seed is None else seed
        self.duration = float(self.data.get("duration_s", 10.0))
        self.settle = float(self.data.get("settle_s", 0.5))
        self.workload = self.data["workload"]
        self.random = random.Random(self.seed)

    async def run(self) -> ExperimentReport:
        report = ExperimentReport(self.name, self.seed, self.duration)
        up: Upstream | None = Upstream(seed=self.seed) if self.data.get("upstream", True) else None
        threads_before = set(threading.enumerate())
        tasks_before = len(anyio.get_running_tasks())
        if up is not None:
            await up.__aenter__()
        requests = None
        try:
            url = up.url if up is not None else "http://127.0.0.1:9"
            config = parse_config(_substitute(self.data["config"], url))
            metrics = CollectorRegistry()
            dispatcher = Dispatcher.from_config(
                config, metrics_registry=metrics, fault_seed=self.seed, audit=None
            )
            watch = _Watch(anyio.current_time())
            dispatcher.breakers.add_listener(
                lambda key, old, new: watch.transitions.append(
                    (watch.now(), key, old, new, *_counters(dispatcher.breakers.get(key)))
                )
            )
            dispatcher.observers = (
                *dispatcher.observers,
                lambda inv, event: _on_event(watch, inv, event),
            )
            try:
                async with anyio.create_task_group() as tg:
                    tg.start_soon(self._schedule, dispatcher, up, watch)
                    for agent in range(int(self.workload.get("agents", 1))):
                        tg.start_soon(self._agent, agent, dispatcher, watch, report)
                await anyio.sleep(self.settle)
                calls_metric = _total(metrics, "toolrelay_tool_calls_total")
            finally:
                await dispatcher.aclose()
        finally:
            if up is not None:
                requests = sum(up.stats["requests"].values())
                await up.__aexit__(None, None, None)
        leaks = await _leaks(dispatcher, metrics, threads_before, tasks_before)
        report.verdicts = _judge(self, dispatcher, watch, report, calls_metric, leaks)
        report.timeline = self._timeline(dispatcher, watch, requests)
        return report

    def _timeline(self, dispatcher: Dispatcher, watch: _Watch, requests: int | None) -> Timeline:
        timeline = Timeline(self.duration, upstream_requests=requests)
        for started, name, result, deadline in watch.answers:
            outcome = "ok" if result.ok else str(result.error_type)
            timeline.answer(started, name, outcome, result.duration_s, deadline)
        for call in self.workload["calls"]:
            tool = dispatcher.registry.resolve(call["tool"])
            if tool is not None:
                timeline.breaker_keys[call["tool"]] = tool.decl.key
        timeline.transitions = [(t[0], t[1], t[2], t[3]) for t in watch.transitions]
        for _, _, attempt in watch.attempts:
            timeline.attempt(attempt)
        timeline.windows = [
            Window(_fault_label(f), f["from_s"], f["until_s"], f.get("tool"), f.get("breaker_key"))
            for f in self.data.get("faults", [])
        ]
        return timeline

    async def _schedule(self, dispatcher: Dispatcher, up: Upstream | None, watch: _Watch) -> None:
        events: list[tuple[float, bool, dict[str, Any]]] = []
        for item in self.data.get("faults", []):
            events += [(item["from_s"], True, item), (item["until_s"], False, item)]
        ids: dict[int, int] = {}
        for at, on, item in sorted(events, key=lambda e: (e[0], e[1])):
            await anyio.sleep(max(0.0, at - watch.now()))
            if on and not watch.failures_at_start:
                for key in self.data.get("invariants", {}).get("breakers", []):
                    watch.failures_at_start[key] = dispatcher.breakers.get(key).failures_recorded
            if "upstream_path" in item:
                if up is None:
                    continue
                if on:
                    params = {
                        k: v
                        for k, v in item.items()
                        if k not in ("from_s", "until_s", "upstream_path", "upstream_fault")
                    }
                    up.set_fault(item["upstream_path"], item["upstream_fault"], **params)
                else:
                    up.clear_faults(item["upstream_path"])
            else:
                spec = {k: v for k, v in item.items() if k not in ("from_s", "until_s")}
                if on:
                    ids[id(item)] = dispatcher.faults.add(Fault.from_dict(spec))
                else:
                    dispatcher.faults.remove(ids.pop(id(item), -1))

    async def _agent(
        self, agent: int, dispatcher: Dispatcher, watch: _Watch, report: ExperimentReport
    ) -> None:
        rng = random.Random(self.seed * 1000 + agent)
        menu = self.workload["calls"]
        weights = [float(c.get("weight", 1)) for c in menu]
        low, high = self.workload.get("calls_per_turn", [1, 2])
        think = self.workload.get("think_s", [0.02, 0.1])
        slot = dispatcher.model_slot(float(self.workload.get("slot_budget_s", 5.0)))
        slot.listeners.append(lambda lease: watch.holds.append((lease.elapsed(), lease.budget_s)))
        ctx = AuthContext(user_id=f"agent-{agent}", tenant_id="chaos")
        turn = 0
        while watch.now() < self.duration:
            picks = rng.choices(menu, weights, k=rng.randint(low, high))
            turn += 1
            calls = [
                ToolCall(p["tool"], json.dumps(p.get("args", {})), f"a{agent}-t{turn}-{i}")
                for i, p in enumerate(picks)
            ]
            report.calls += len(calls)
            started = watch.now()
            try:
                async with slot.hold() as lease:
                    left = lease.remaining()
                    results = await dispatcher.dispatch_many(calls, ctx, slot=lease)
            except Exception as exc:
                report.escaped.append(f"{type(exc).__name__}: {exc}"[:200])
                continue
            report.answers += len(results)
            for call, result in zip(calls, results, strict=True):
                tool = dispatcher.registry.resolve(call.name)
                timeout = tool.decl.timeout_s if tool is not None else left
                watch.answers.append((started, call.name, result, min(timeout, left)))
                report.outcomes["ok" if result.ok else str(result.error_type)] += 1
            pause = rng.uniform(*think)
            if self.workload.get("honour_retry_after", False):  # wait as long as asked, or more
                pause = max([pause, *(r.retry_after_s or 0.0 for r in results)])
            await anyio.sleep(pause)


def _fault_label(item: dict[str, Any]) -> str:
    if "upstream_path" in item:
        return f"upstream {item['upstream_path']}: {item['upstream_fault']}"
    target = f"tool {item['tool']}" if "tool" in item else f"breaker key {item.get('breaker_key')}"
    return f"{item.get('kind', 'fault')} on {target}"


def _counters(breaker: KeyBreaker) -> tuple[int, int, int]:
    return breaker.admitted, breaker.trials_admitted, breaker.failures_recorded


def _on_event(watch: _Watch, inv: Any, event: Any) -> None:
    from ..events import AttemptEnded

    if isinstance(event, AttemptEnded) and inv.key is not None:
        watch.attempts.append((watch.now(), inv.key, event.result))


def _total(metrics: CollectorRegistry, name: str) -> float:
    return sum(
        sample.value
        for metric in metrics.collect()
        for sample in metric.samples
        if sample.name == name
    )


def _pool_thread(thread: threading.Thread) -> bool:
    """An idle thread of anyio's, trio's or asyncio's own pools: kept for reuse, not leaked."""
    name = thread.name
    return (
        type(thread).__name__ == "WorkerThread"
        or name.startswith("Trio thread")
        or name.startswith("asyncio_")  # the loop's default executor (name resolution)
    )


async def _leaks(
    dispatcher: Dispatcher,
    metrics: CollectorRegistry,
    threads: set[threading.Thread],
    tasks: int,
) -> dict[str, float]:
    abandoned = sum(dispatcher.workers.abandoned().values())

    def running_handlers() -> int:
        return sum(dispatcher.workers.live().values()) - abandoned

    with anyio.move_on_after(5):
        while running_handlers() > 0:  # noqa: ASYNC110 (worker threads end it)
            await anyio.sleep(0.05)
    strays = [t for t in threading.enumerate() if t not in threads and not _pool_thread(t)]
    return {
        "inflight": _total(metrics, "toolrelay_tool_inflight"),
        "bulkhead": float(sum(dispatcher.bulkhead.in_flight().values())),
        "threads": float(len(strays) + max(0, running_handlers())),
        "tasks": float(max(0, len(anyio.get_running_tasks()) - tasks)),
        "abandoned": float(abandoned),
    }


def _judge(
    runner: _Runner,
    dispatcher: Dispatcher,
    watch: _Watch,
    report: ExperimentReport,
    calls_metric: float,
    leaks: dict[str, float],
) -> list[Verdict]:
    settings = runner.data.get("invariants", {})
    slack = float(settings.get("deadline_slack_ms", 50.0)) / 1000
    verdicts = [
        Verdict(
            "every call answered",
            not report.escaped and report.calls == report.answers == calls_metric,
            f"calls {report.calls}, answers {report.answers}, tool_calls_total "
            f"{calls_metric:.0f}, exceptions {len(report.escaped)}",
        )
    ]
    late = [a for a in watch.answers if a[2].duration_s > a[3] + slack]
    worst = max((a[2].duration_s - a[3] for a in watch.answers), default=0.0)
    verdicts.append(
        Verdict(
            f"every answer within its deadline + {slack * 1000:.0f} ms",
            not late,
            f"{len(late)} late of {len(watch.answers)}; worst {worst * 1000:+.1f} ms vs deadline",
        )
    )
    faults = runner.data.get("faults", [])
    outage = (
        (min(f["from_s"] for f in faults), max(f["until_s"] for f in faults)) if faults else None
    )
    for key in settings.get("breakers", []):
        verdicts += _breaker_verdicts(key, dispatcher, watch, outage)
    over = [h for h in watch.holds if h[0] > h[1] + slack]
    longest = max((h[0] - h[1] for h in watch.holds), default=-math.inf)
    verdicts.append(
        Verdict(
            "slot hold never beyond budget",
            not over,
            f"{len(watch.holds)} holds, {len(over)} over; closest {longest * 1000:+.1f} ms",
        )
    )
    steady = runner.data.get("steady_state")
    if steady is not None and outage is not None:
        before = [a for a in watch.answers if a[0] + a[2].duration_s < outage[0]]
        errors = sum(not a[2].ok for a in before)
        ratio = errors / len(before) if before else 1.0
        limit = float(steady.get("max_error_ratio", 0.0))
        verdicts.append(
            Verdict(
                "steady state before the faults",
                len(before) >= int(steady.get("min_calls", 1)) and ratio <= limit,
                f"error ratio {ratio:.3f} over {len(before)} calls (≤ {limit})",
            )
        )
    if settings.get("no_leaks", True):
        clean = leaks["inflight"] == 0 and leaks["bulkhead"] == 0 and leaks["threads"] == 0
        verdicts.append(
            Verdict(
                "no leaked tasks, threads or in-flight calls",
                clean and leaks["tasks"] == 0,
                f"in-flight {leaks['inflight']:.0f}, bulkhead {leaks['bulkhead']:.0f}, "
                f"threads {leaks['threads']:.0f} (+{leaks['abandoned']:.0f} abandoned, "
                f"counted), tasks {leaks['tasks']:.0f}",
            )
        )
    return verdicts


def _breaker_verdicts(
    key: str, dispatcher: Dispatcher, watch: _Watch, outage: tuple[float, float] | None
) -> list[Verdict]:
    config = dispatcher.breaker_config(key)
    moves = [t for t in watch.transitions if t[1] == key]
    start, end = outage if outage is not None else (0.0, math.inf)
    opened = next((t for t in moves if t[3] == "open" and t[0] >= start), None)
    at_start = watch.failures_at_start.get(key, 0)
    counted = (opened[6] if opened else dispatcher.breakers.get(key).failures_recorded) - at_start
    verdicts = [
        Verdict(
            f"{key}: breaker opened within fail_max failures of the outage",
            opened is not None and counted <= config.fail_max,
            (
                f"opened at {opened[0]:.2f} s after {counted} failures (fail_max {config.fail_max})"
                if opened
                else f"never opened ({counted} failures from {start:.1f} s)"
            ),
        )
    ]
    # While not closed, only half-open trials may be admitted: the closed-state admission
    # counter must not move between an open and the next close, and each half-open period
    # admits at most half_open_max_calls trials.
    leaked = 0
    trials_over = 0
    for index, move in enumerate(moves):
        if move[3] == "closed":
            continue
        nxt = moves[index + 1] if index + 1 < len(moves) else None
        admitted_after = nxt[4] if nxt else dispatcher.breakers.get(key).admitted
        if move[3] == "open":
            leaked += admitted_after - move[4]
        if move[3] == "half_open":
            trials = (nxt[5] if nxt else dispatcher.breakers.get(key).trials_admitted) - move[5]
            trials_over += max(0, trials - config.half_open_max_calls)
    rejected = sum(1 for a in watch.attempts if a[1] == key and a[2] == "circuit_open")
    verdicts.append(
        Verdict(
            f"{key}: fast-failed while open, only half-open trials reached the service",
            opened is not None and leaked == 0 and trials_over == 0 and rejected > 0,
            f"{rejected} fast-fails, {leaked} admitted while open, "
            f"{trials_over} trials over the half-open limit",
        )
    )
    closed = next((t for t in moves if t[3] == "closed" and t[0] >= end), None)
    verdicts.append(
        Verdict(
            f"{key}: breaker closed after recovery",
            closed is not None and opened is not None,
            f"closed at {closed[0]:.2f} s (faults ended {end:.1f} s)"
            if closed
            else f"not closed after {end:.1f} s; state {dispatcher.breakers.state(key)}",
        )
    )
    return verdicts


async def run_experiment(experiment: Experiment, seed: int | None = None) -> ExperimentReport:
    """Run one experiment and judge its invariants."""
    return await _Runner(experiment, seed).run()


def print_report(report: ExperimentReport, out: TextIO | None = None) -> None:
    """Print the verdicts to ``out`` (``sys.stdout`` as it is when called)."""
    out = sys.stdout if out is None else out
    try:
        from rich.console import Console
        from rich.table import Table
    except ImportError:
        Console = None  # type: ignore[assignment,misc]
    title = f"{report.name} — {report.duration_s:g} s, seed {report.seed}, {report.calls} calls"
    if Console is not None and out.isatty():
        table = Table(title=title)
        for column in ("", "invariant", "measured"):
            table.add_column(column)
        for v in report.verdicts:
            table.add_row("[green]PASS[/]" if v.ok else "[bold red]FAIL[/]", v.name, v.figure)
        Console(file=out).print(table)
    else:
        print(title, file=out)
        for v in report.verdicts:
            print(f"  {'PASS' if v.ok else 'FAIL'}  {v.name}: {v.figure}", file=out)
    outcomes = ", ".join(f"{k} {n}" for k, n in report.outcomes.most_common())
    print(f"outcomes: {outcomes}", file=out)
    print("all invariants hold" if report.ok else "an invariant was violated", file=out)


def main(
    path: Path,
    *,
    json_path: Path | None = None,
    seed: int | None = None,
    html_path: Path | None = None,
    compare: Path | None = None,
) -> int:
    """``toolrelay chaos run``: exit 0 when every invariant holds (in both runs), 1 otherwise.

    ``compare`` runs a second experiment after the first: the JSON report is then
    ``{"runs": [first, second], "ok": ...}`` and the HTML report shows both on one time axis.
    """
    experiments = [Experiment.load(p) for p in (path, compare) if p is not None]
    if html_path is not None:
        from .report_html import require_renderer

        require_renderer()  # before the run, not after it
    reports = []
    for experiment in experiments:
        reports.append(anyio.run(run_experiment, experiment, seed))
        print_report(reports[-1])
    data = [report.to_json() for report in reports]
    if json_path is not None:
        document = data[0] if len(data) == 1 else {"runs": data, "ok": all(r.ok for r in reports)}
        json_path.write_text(json.dumps(document, indent=2) + "\n")
    if html_path is not None:
        from .report_html import write_html

        write_html(data, html_path)
    return 0 if all(r.ok for r in reports) else 1
