"""The experiment runner: plays an :class:`~toolrelay.chaos.definition.Experiment`.

It starts the stand-in upstream (unless ``upstream = false``), builds the dispatcher, runs
the agents and the fault schedule side by side for ``duration_s``, lets the last answers
settle, counts what leaked, and judges the invariants.
"""

from __future__ import annotations

import json
import random
import threading
from collections.abc import Callable, Coroutine
from contextlib import AsyncExitStack
from typing import Any

import anyio
from prometheus_client import CollectorRegistry

from ..config import parse_config
from ..contract import AuthContext
from ..dispatcher import Dispatcher
from ..faults import Fault
from ..registry import ToolRegistry
from ..result import ToolCall, ToolResult
from .checks import judge
from .definition import WINDOW_KEYS, Experiment, Model
from .record import Record, Run, outcome
from .timeline import REFUSALS, Timeline, Window
from .upstream import StandInUpstream

View = Callable[[Record, Dispatcher], Coroutine[Any, Any, None]]
"""Watches the run until cancelled (the demo's live view)."""

NOWHERE = "http://127.0.0.1:9"
"""``${upstream}`` in an experiment that runs without the stand-in upstream."""


async def play(
    experiment: Experiment,
    seed: int | None = None,
    *,
    metrics: CollectorRegistry | None = None,
    tracer_provider: Any = None,
    view: View | None = None,
) -> Run:
    """Run ``experiment`` (with ``seed`` in place of its own) and judge its invariants."""
    data, extras = experiment.data, experiment.extras
    seed = data.get("seed", 1) if seed is None else seed
    duration = float(data.get("duration_s", 10.0))
    metrics = CollectorRegistry() if metrics is None else metrics
    up: StandInUpstream | None = StandInUpstream(seed=seed) if data.get("upstream", True) else None
    threads_before = set(threading.enumerate())
    tasks_before = len(anyio.get_running_tasks())
    async with AsyncExitStack() as stack:
        if up is not None:
            await stack.enter_async_context(up)
            for standing in data.get("upstream_faults", []):
                up.set_fault(**standing)
        config = parse_config(_substitute(data["config"], NOWHERE if up is None else up.url))
        registry = None
        if extras.tools is not None:
            registry = ToolRegistry()
            extras.tools(registry)
        dispatcher = Dispatcher.from_config(
            config,
            overrides={"fault_seed": seed},
            registry=registry,
            metrics_registry=metrics,
            tracer_provider=tracer_provider,
            audit=None,
        )
        record = Record(anyio.current_time(), windows=[_window(f) for f in data.get("faults", [])])
        dispatcher.breakers.add_listener(
            lambda key, old, new: record.transitions.append(
                (record.now(), key, old, new, *_counters(dispatcher, key))
            )
        )
        dispatcher.add_observer(record.observe)
        try:
            async with anyio.create_task_group() as outer:
                if view is not None:
                    outer.start_soon(view, record, dispatcher)
                async with anyio.create_task_group() as tg:
                    tg.start_soon(_schedule, experiment, dispatcher, up, record)
                    for agent in range(int(data["workload"].get("agents", 1))):
                        model = (
                            _MenuModel(data["workload"], seed, agent)
                            if extras.model is None
                            else extras.model(dispatcher, seed, agent)
                        )
                        tg.start_soon(_agent, experiment, agent, model, dispatcher, record)
                outer.cancel_scope.cancel()
            await anyio.sleep(float(data.get("settle_s", 0.5)))
            calls_metric = _total(metrics, "toolrelay_tool_calls_total")
        finally:
            for switch in extras.switches.values():
                switch.clear()
            await dispatcher.aclose()
        requests = None if up is None else sum(up.stats["requests"].values())
    leaks = await _leaks(dispatcher, metrics, threads_before, tasks_before)
    run = Run(
        experiment.name,
        seed,
        duration,
        data,
        dispatcher,
        record,
        calls_metric,
        leaks,
        _timeline(duration, dispatcher, record, requests),
    )
    run.checks = (extras.checks or judge)(run)
    return run


def _timeline(
    duration: float, dispatcher: Dispatcher, record: Record, requests: int | None
) -> Timeline:
    timeline = Timeline(duration, upstream_requests=requests, windows=list(record.windows))
    for started, name, result, deadline in record.answers:
        timeline.answer(started, name, outcome(result), result.duration_s, deadline)
    timeline.breaker_keys = {tool.decl.name: tool.decl.key for tool in dispatcher.registry.tools()}
    timeline.transitions = record.moves
    timeline.attempts = sum(result not in REFUSALS for _, _, result in record.attempts)
    return timeline


async def _schedule(
    experiment: Experiment, dispatcher: Dispatcher, up: StandInUpstream | None, record: Record
) -> None:
    data, switches = experiment.data, experiment.extras.switches
    events: list[tuple[float, bool, dict[str, Any]]] = []
    for item in data.get("faults", []):
        events += [(item["from_s"], True, item), (item["until_s"], False, item)]
    ids: dict[int, int] = {}
    for at, on, item in sorted(events, key=lambda e: (e[0], e[1])):
        await anyio.sleep(max(0.0, at - record.now()))
        if on and not record.failures_at_start:
            for key in data.get("invariants", {}).get("breakers", []):
                record.failures_at_start[key] = dispatcher.breakers.get(key).failures_recorded
        spec = {k: v for k, v in item.items() if k not in WINDOW_KEYS}
        if "switch" in spec:
            if on:
                switches[spec["switch"]].set()
            else:
                switches[spec["switch"]].clear()
        elif "upstream_path" in spec:
            if up is None:
                continue
            path = spec.pop("upstream_path")
            if on:
                spec.pop("tool", None)
                spec.pop("breaker_key", None)
                up.set_fault(path, spec.pop("upstream_fault"), **spec)
            else:
                up.clear_faults(path)
        elif on:
            ids[id(item)] = dispatcher.faults.add(Fault.from_dict(spec))
        else:
            dispatcher.faults.remove(ids.pop(id(item), -1))


class _MenuModel:
    """Each turn, ``calls_per_turn`` calls drawn from the workload's weighted menu."""

    def __init__(self, workload: dict[str, Any], seed: int, agent: int) -> None:
        self.random = random.Random(seed * 1000 + agent)
        self.agent = agent
        self.menu = workload["calls"]
        self.weights = [float(c.get("weight", 1)) for c in self.menu]
        self.per_turn = workload.get("calls_per_turn", [1, 2])
        self.think = workload.get("think_s", [0.02, 0.1])
        self.honour_retry_after = bool(workload.get("honour_retry_after", False))
        self.turns = 0

    def turn(self) -> list[ToolCall]:
        rng = self.random
        picks = rng.choices(self.menu, self.weights, k=rng.randint(*self.per_turn))
        self.turns += 1
        return [
            ToolCall(p["tool"], json.dumps(p.get("args", {})), f"a{self.agent}-t{self.turns}-{i}")
            for i, p in enumerate(picks)
        ]

    def pause(self, results: list[ToolResult]) -> float:
        pause = self.random.uniform(*self.think)
        if self.honour_retry_after:  # wait as long as asked, or more
            pause = max([pause, *(r.retry_after_s or 0.0 for r in results)])
        return pause


async def _agent(
    experiment: Experiment, agent: int, model: Model, dispatcher: Dispatcher, record: Record
) -> None:
    duration = float(experiment.data.get("duration_s", 10.0))
    slot = dispatcher.model_slot(float(experiment.data["workload"].get("slot_budget_s", 5.0)))
    slot.listeners.append(lambda lease: record.holds.append((lease.elapsed(), lease.budget_s)))
    ctx = AuthContext(user_id=f"agent-{agent}", tenant_id="chaos")
    while record.now() < duration:
        calls = model.turn()
        record.turns += 1
        record.calls += len(calls)
        started = record.now()
        try:
            async with slot.hold() as lease:
                left = lease.remaining()
                results = await dispatcher.dispatch_many(calls, ctx, slot=lease)
        except Exception as exc:  # an invariant, not a crash: count it
            record.escaped.append(f"{type(exc).__name__}: {exc}"[:200])
            continue
        for call, result in zip(calls, results, strict=True):
            tool = dispatcher.registry.resolve(call.name)
            timeout = tool.decl.timeout_s if tool is not None else left
            record.answers.append((started, call.name, result, min(timeout, left)))
        await anyio.sleep(model.pause(results))


def _substitute(value: Any, url: str) -> Any:
    if isinstance(value, str):
        return value.replace("${upstream}", url)
    if isinstance(value, dict):
        return {k: _substitute(v, url) for k, v in value.items()}
    if isinstance(value, list):
        return [_substitute(v, url) for v in value]
    return value


def _window(item: dict[str, Any]) -> Window:
    if "label" in item:
        label = item["label"]
    elif "upstream_path" in item:
        label = f"upstream {item['upstream_path']}: {item['upstream_fault']}"
    elif "tool" in item:
        label = f"{item.get('kind', 'fault')} on tool {item['tool']}"
    else:
        label = f"{item.get('kind', 'fault')} on breaker key {item.get('breaker_key')}"
    return Window(label, item["from_s"], item["until_s"], item.get("tool"), item.get("breaker_key"))


def _counters(dispatcher: Dispatcher, key: str) -> tuple[int, int, int]:
    breaker = dispatcher.breakers.get(key)
    return breaker.admitted, breaker.trials_admitted, breaker.failures_recorded


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
