"""Small plugins and helpers shared by the tests (real code, no mocks)."""

from __future__ import annotations

import importlib.util
import sys
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Any

from toolrelay import (
    AuthContext,
    BreakerOptions,
    BudgetOptions,
    BulkheadOptions,
    Dispatcher,
    DispatcherOptions,
    HedgeOptions,
    KeyPolicy,
    RetryOptions,
    ToolDeclaration,
)
from toolrelay.config import RENAMED

if TYPE_CHECKING:
    from toolrelay.chaos.experiment import Experiment, Run

OBJ = {"type": "object", "properties": {}, "additionalProperties": False}
CITY = {
    "type": "object",
    "properties": {"city": {"type": "string", "minLength": 1, "maxLength": 40}},
    "required": ["city"],
    "additionalProperties": False,
}


def key_policy(**settings: Any) -> KeyPolicy:
    """A :class:`KeyPolicy` from settings named as in one flat table (``fail_max``,
    ``max_attempts``, ``hedge_after_s``, …: :data:`toolrelay.config.RENAMED`), for tests
    that sweep settings of several strategies at once."""
    parts: dict[str, dict[str, Any]] = {}
    for name, value in settings.items():
        part, field = RENAMED[name]
        parts.setdefault(part, {})[field] = value
    return KeyPolicy(**{part: _PARTS[part](**fields) for part, fields in parts.items()})


LIVE = {
    "approver",
    "audit",
    "observers",
    "metrics_registry",
    "tracer_provider",
    "meter_provider",
    "clock",
}
"""The keyword arguments of ``Dispatcher`` that are live objects, not options."""


def dispatcher_with(registry: Any, **settings: Any) -> Dispatcher:
    """``Dispatcher(registry, DispatcherOptions(...), live=...)`` from one set of keywords:
    :data:`LIVE` ones are the dispatcher's, the others :class:`DispatcherOptions` fields
    (for test helpers that take both)."""
    live = {name: settings.pop(name) for name in LIVE & settings.keys()}
    return Dispatcher(registry, DispatcherOptions(**settings), **live)


_PARTS: dict[str, Any] = {
    "breaker": BreakerOptions,
    "retry": RetryOptions,
    "hedge": HedgeOptions,
    "bulkhead": BulkheadOptions,
    "budget": BudgetOptions,
}


class MutablePlugin:
    """A plugin whose declarations an operator can change at run time."""

    def __init__(self, decls: Sequence[ToolDeclaration]) -> None:
        self.decls = list(decls)
        self.calls: list[tuple[str, dict[str, Any], AuthContext]] = []

    def describe(self) -> list[ToolDeclaration]:
        return list(self.decls)

    async def execute(self, name: str, args: dict[str, Any], ctx: AuthContext) -> Any:
        self.calls.append((name, args, ctx))
        return {"tool": name, "args": args}


class SyncPlugin(MutablePlugin):
    def execute(self, name: str, args: dict[str, Any], ctx: AuthContext) -> Any:  # type: ignore[override]
        self.calls.append((name, args, ctx))
        return {"tool": name, "sync": True}


async def wait_until(predicate: Callable[[], bool], limit_s: float = 5.0) -> None:
    """Poll until ``predicate()`` holds (state changed by other tasks or threads)."""
    import anyio

    with anyio.fail_after(limit_s):
        while not predicate():  # noqa: ASYNC110
            await anyio.sleep(0.005)


@asynccontextmanager
async def entered_together(*managers: AbstractAsyncContextManager[Any]) -> AsyncIterator[list[Any]]:
    """Enter independent async context managers at once, each in a task of its own (so that
    the servers they start start side by side, not one after another), and yield what
    each one gave, in order; all are exited when the block ends. An error entering any of
    them ends the block with it."""
    import anyio

    values: list[Any] = [None] * len(managers)
    entered = [anyio.Event() for _ in managers]
    done = anyio.Event()

    async def hold(index: int, manager: AbstractAsyncContextManager[Any]) -> None:
        async with manager as value:
            values[index] = value
            entered[index].set()
            await done.wait()

    async with anyio.create_task_group() as tg:
        for index, manager in enumerate(managers):
            tg.start_soon(hold, index, manager)
        for event in entered:
            await event.wait()
        try:
            yield values
        finally:
            done.set()


EXPERIMENTS = Path(__file__).resolve().parent.parent / "examples" / "experiments"


def load_script(path: Path, name: str) -> ModuleType:
    """A script that is not in a package (an experiment, a benchmark) as module ``name``,
    registered in ``sys.modules`` (its dataclasses resolve their annotations there)."""
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def load_experiment(name: str) -> ModuleType:
    """``examples/experiments/NAME.py`` as a module (the scripts are not a package)."""
    return load_script(EXPERIMENTS / f"{name}.py", f"experiment_{name}")


# -- the short dependency-hang experiment, run once per session -----------------------------------
SHORT_HANG_FAULT = (1.5, 3.5)  # the search service hangs from 1.5 s to 3.5 s of a 5 s run


def short_hang(name: str | None = None, **breaker: Any) -> Experiment:
    """``dependency_hang.toml`` in 5 s: the search service hangs 1.5–3.5 s. ``breaker``
    overrides the ``searxng`` breaker's settings, ``name`` the experiment's name. The
    deadline slack is that of a loaded CI machine (1 s): the runs that share it judge
    the breaker, not the host's scheduling."""
    import copy

    from toolrelay.chaos.experiment import Experiment

    data = copy.deepcopy(Experiment.load(EXPERIMENTS / "dependency_hang.toml").data)
    data["duration_s"] = 5
    data["faults"][0].update(from_s=SHORT_HANG_FAULT[0], until_s=SHORT_HANG_FAULT[1])
    data["steady_state"]["min_calls"] = 5
    data["invariants"]["deadline_slack_ms"] = 1000  # 250 was passed once by a cut call
    data["config"]["keys"]["searxng"]["breaker"].update(breaker)
    if name is not None:
        data["name"] = name
    return Experiment.parse(data)


_SHORT_HANG_REPORTS: dict[bool, Run] = {}


def short_hang_report(*, breaker: bool) -> Run:
    """The report of ``short_hang()`` (``breaker=True``) or of the same run named "no
    breaker" with ``fail_max`` out of reach: each run once per test session, whichever
    test file asks first (test_experiments, test_browser). Reports are read, never changed.
    Runs in a thread of its own, so that a caller holding an event loop (Playwright's sync
    API) can ask too."""
    if breaker not in _SHORT_HANG_REPORTS:
        from concurrent.futures import ThreadPoolExecutor

        import anyio

        from toolrelay.chaos.experiment import play

        experiment = short_hang() if breaker else short_hang("no breaker", fail_max=1_000_000)
        with ThreadPoolExecutor(1) as pool:
            future = pool.submit(lambda: anyio.run(play, experiment))
            _SHORT_HANG_REPORTS[breaker] = future.result()
    return _SHORT_HANG_REPORTS[breaker]


@asynccontextmanager
async def http_session(url: str, **options: Any) -> AsyncIterator[Any]:
    """An initialized MCP SDK ``ClientSession`` over streamable HTTP (``options``: its
    callbacks), with the long read timeout a gateway test needs."""
    import httpx2
    from mcp import ClientSession
    from mcp.client.streamable_http import streamable_http_client

    async with (
        httpx2.AsyncClient(timeout=httpx2.Timeout(30.0, read=60.0)) as http,
        streamable_http_client(url, http_client=http) as (read, write),
        ClientSession(read, write, **options) as session,
    ):
        await session.initialize()
        yield session
