"""``isolation="process"``: sync tools that really stop (issue 20, item 5).

The tools live in ``isolated_tools`` (module-level functions a worker process imports by
name). Process ids are read from ``/proc`` (psutil is not installed): a process that is
gone has no ``/proc/<pid>``, and a zombie would still have one.
"""

from __future__ import annotations

import functools
import json
import logging
import os
import subprocess
import sys
import textwrap
import threading
import time
import types
from pathlib import Path
from typing import Any

import anyio
import pytest

import isolated_tools as tools
from helpers import wait_until
from toolrelay import (
    AuthContext,
    BulkheadOptions,
    Dispatcher,
    DispatcherOptions,
    KeyPolicy,
    RegistrationError,
    RetryOptions,
    ToolRegistry,
    ToolResult,
)
from toolrelay.events import Event, WorkerAbandoned, WorkerKilled
from toolrelay.isolation import pool as isolation_pool
from toolrelay.pipeline import Invocation

pytestmark = pytest.mark.anyio

ANY = {"type": "object"}
ROOT = Path(__file__).resolve().parent.parent
TESTS = Path(__file__).resolve().parent


def exists(pid: int) -> bool:
    """Is there a process (a zombie included) with this id?"""
    return Path(f"/proc/{pid}").exists()


def alive(pid: int) -> bool:
    """Is the process running (not gone, not a zombie waiting to be reaped)?"""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def _parents_and_states() -> dict[int, tuple[int, str]]:
    table = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            table[int(entry.name)] = (int(fields[1]), fields[0])
    return table


def worker_processes() -> set[int]:
    """Live processes whose parent is a child of this process: the worker processes, whose
    parent is the forkserver (nothing else in these tests starts grandchildren)."""
    table = _parents_and_states()
    children = {pid for pid, (ppid, _) in table.items() if ppid == os.getpid()}
    return {pid for pid, (ppid, state) in table.items() if ppid in children and state != "Z"}


class Events:
    def __init__(self) -> None:
        self.seen: list[Event] = []

    def __call__(self, inv: Invocation, event: Event) -> None:
        self.seen.append(event)


def registry_with(**tools_: Any) -> ToolRegistry:
    """A registry with ``name=(function, options)`` tools, all ``isolation="process"``."""
    registry = ToolRegistry()
    for name, (fn, options) in tools_.items():
        registry.tool(name=name, parameters=ANY, isolation="process", **options)(fn)
    return registry


def pid_from(path: Path) -> int:
    return int(path.read_text())


# -- what reaches the worker -----------------------------------------------------------------
async def test_arguments_auth_and_call_context_reach_the_worker() -> None:
    # a cold worker process imports toolrelay first: over 5 s was seen on a loaded machine
    registry = registry_with(describe=(tools.describe, {"timeout_s": 60, "breaker_key": "k1"}))
    ctx = AuthContext(
        user_id="ada", tenant_id="acme", roles=frozenset({"b", "a"}), attributes={"plan": "pro"}
    )
    async with Dispatcher(registry, DispatcherOptions(telemetry=False)) as dispatcher:
        before = time.monotonic()
        result = await dispatcher.dispatch("describe", {"q": [1, "x", None]}, ctx, call_id="c-1")
        assert result.ok, result.to_model()
        data = result.data
        assert data["pid"] != os.getpid()
        assert data["args"] == {"q": [1, "x", None]}
        assert (data["user_id"], data["tenant_id"], data["roles"]) == ("ada", "acme", ["a", "b"])
        assert data["attributes"] == {"plan": "pro"}
        call = data["call"]
        assert (call["tool"], call["call_id"], call["attempt"], call["breaker_key"]) == (
            "describe", "c-1", 1, "k1",
        )  # fmt: skip
        # the deadline is on time.monotonic()'s clock, the same in every process
        assert before + 60 - 1 < call["deadline"] <= before + 60 + 0.5
        assert 0 < call["time_left"] <= 60
        # the answer is JSON through and through
        assert json.loads(json.dumps(result.to_model())) == result.to_model()
        # the worker is reused: the same process answers the next call
        again = await dispatcher.dispatch("describe", {}, ctx)
        assert again.data["pid"] == data["pid"]


async def test_a_typed_tool_runs_in_a_worker_with_its_contexts() -> None:
    registry = ToolRegistry()
    registry.tool(isolation="process")(tools.typed_sum)
    async with Dispatcher(registry, DispatcherOptions(telemetry=False)) as dispatcher:
        result = await dispatcher.dispatch("typed_sum", {"a": 2, "b": 3}, AuthContext(user_id="u"))
        assert result.to_model()["ok"] is True, result.to_model()
        assert result.data["sum"] == 5
        assert (result.data["user_id"], result.data["tool"]) == ("u", "typed_sum")
        assert result.data["pid"] != os.getpid()
        bad = await dispatcher.dispatch("typed_sum", {"a": "x", "b": 3})
        assert bad.error_type == "validation_error"  # checked in the host, before any worker


# -- the deadline --------------------------------------------------------------------------
@pytest.mark.parametrize("idempotent", [True, False])
async def test_a_hung_tool_is_answered_timeout_and_its_process_is_gone(
    tmp_path: Path, idempotent: bool
) -> None:
    registry = registry_with(
        hang=(tools.hang, {"timeout_s": 0.5, "breaker_key": "shared", "idempotent": idempotent}),
        # a cold worker process imports toolrelay first: seconds on a loaded machine
        describe=(tools.describe, {"breaker_key": "shared", "timeout_s": 60}),
    )
    events = Events()
    threads_before = _own_threads()
    async with Dispatcher(
        registry, DispatcherOptions(telemetry=False), observers=[events]
    ) as dispatcher:
        # a warm worker: the deadline is the tool's, and the call goes to that process
        warm = await dispatcher.dispatch("describe", {})
        assert warm.ok, warm.to_model()
        pid = warm.data["pid"]
        pidfile = tmp_path / "pid"
        started = time.perf_counter()
        result = await dispatcher.dispatch("hang", {"pidfile": str(pidfile)})
        took = time.perf_counter() - started
        answer = result.to_model()
        assert answer["error_type"] == "timeout", answer
        # at the deadline, not whenever the tool would end (in an hour); the slack only
        # absorbs a loaded machine
        assert took < 0.5 + 3.0
        # the tool ran there (unless a loaded machine's worker got to it only after the
        # deadline): that process was killed and reaped before the answer, no zombie either
        assert not pidfile.exists() or pid_from(pidfile) == pid
        assert not exists(pid)
        if idempotent:
            assert answer["retryable"] is True and not result.effect_unknown
        else:  # exactly like thread mode: the effect may have happened
            assert answer["retryable"] is False and result.effect_unknown
            assert "may still have taken effect" in answer["message"]
        assert [e for e in events.seen if isinstance(e, WorkerKilled)] == [WorkerKilled("shared")]
        assert not [e for e in events.seen if isinstance(e, WorkerAbandoned)]
        assert dispatcher.workers.abandoned() == {}
        assert dispatcher.processes.killed() == {"shared": 1}
        # the key's pool is usable again, with a fresh process
        after = await dispatcher.dispatch("describe", {})
        assert after.ok and after.data["pid"] != pid
        assert dispatcher.processes.processes() == {"shared": 1}
    # no thread is left behind (+ the shared spawner thread); the pool's own end as they
    # notice it is closed, which a loaded machine may take a moment to let them do
    await wait_until(lambda: _own_threads() <= threads_before + 1)


def _own_threads() -> int:
    """Live threads, less the async library's idle worker threads (kept for 10 s after
    a ``to_thread`` call: counted, they failed this test whenever it ran first in its
    pytest-xdist worker)."""
    cached = ("AnyIO worker thread", "Trio thread")
    return sum(not t.name.startswith(cached) for t in threading.enumerate())


async def test_a_flood_of_hung_calls_leaves_no_process_behind(tmp_path: Path) -> None:
    registry = registry_with(hang=(tools.hang, {"timeout_s": 1.0}))
    flood = 8
    async with Dispatcher(registry, DispatcherOptions(telemetry=False)) as dispatcher:
        results: list[ToolResult] = []

        async def one(i: int) -> None:
            results.append(await dispatcher.dispatch("hang", {"pidfile": str(tmp_path / str(i))}))

        async with anyio.create_task_group() as tg:
            for i in range(flood):
                tg.start_soon(one, i)
        assert [r.error_type for r in results] == ["timeout"] * flood
        # those that got to run (a worker may be killed before it had its id written)
        files = anyio.Path(tmp_path).iterdir()
        started = [pid_from(Path(p)) async for p in files if not p.name.endswith(".tmp")]
        assert started and not any(exists(pid) for pid in started)
        assert dispatcher.processes.processes() == {"hang": 0}


# -- failures in the worker ----------------------------------------------------------------
@pytest.mark.parametrize(
    ("how", "said"),
    [({"status": 3}, "exited with status 3"), ({"signal": "SIGSEGV"}, "killed by SIGSEGV")],
)
async def test_a_crashed_worker_is_a_tool_error_and_is_replaced(
    tmp_path: Path, how: dict[str, Any], said: str
) -> None:
    registry = registry_with(
        crash=(tools.exit_abruptly, {"breaker_key": "c"}),
        describe=(tools.describe, {"breaker_key": "c"}),
    )
    async with Dispatcher(registry, DispatcherOptions(telemetry=False)) as dispatcher:
        pidfile = tmp_path / "pid"
        result = await dispatcher.dispatch("crash", {"pidfile": str(pidfile), **how})
        answer = result.to_model()
        assert answer["error_type"] == "tool_error" and answer["retryable"] is False, answer
        assert said in answer["message"]
        assert not exists(pid_from(pidfile))
        assert dispatcher.processes.killed() == {"c": 0}  # it died by itself
        again = await dispatcher.dispatch("describe", {})
        assert again.ok and again.data["pid"] != pid_from(pidfile)


async def test_errors_raised_in_the_worker_are_answered_like_thread_mode(
    caplog: pytest.LogCaptureFixture,
) -> None:
    # One attempt: the precise error asks to be retried after 2.5 s, and two such waits
    # would only add 5 s to what is asserted here, the answers (retries: test_resilience).
    registry = registry_with(fail=(tools.raise_error, {"breaker_key": "fail"}))
    once = {"fail": KeyPolicy(retry=RetryOptions(max_attempts=1))}
    async with Dispatcher(
        registry, DispatcherOptions(telemetry=False, secret_patterns=["sesame-\\w+"], keys=once)
    ) as d:
        precise = (await d.dispatch("fail", {"precise": True})).to_model()
        assert precise == {
            "ok": False, "error_type": "tool_error", "message": "no such city",
            "retryable": True, "retry_after_s": 2.5,
        }  # fmt: skip
        with caplog.at_level(logging.WARNING, logger="toolrelay"):
            plain = (await d.dispatch("fail", {"secret": "sesame-open"})).to_model()
        assert plain["error_type"] == "tool_error"
        assert plain["message"] == "fail failed unexpectedly (ValueError)"
        logged = "\n".join(r.getMessage() for r in caplog.records)
        assert "ValueError: the password is ***" in logged  # the worker's traceback, redacted
        assert "sesame-open" not in logged


async def test_a_function_the_worker_cannot_import_is_a_tool_error(
    caplog: pytest.LogCaptureFixture,
) -> None:
    moved = types.FunctionType(tools.describe.__code__, tools.describe.__globals__, "describe")
    moved.__module__ = "no_such_module_here"  # importable in the host's eyes only
    registry = registry_with(moved=(moved, {}))
    async with Dispatcher(registry, DispatcherOptions(telemetry=False)) as dispatcher:
        with caplog.at_level(logging.WARNING, logger="toolrelay"):
            answer = (await dispatcher.dispatch("moved", {})).to_model()
        assert answer["error_type"] == "tool_error", answer
        assert answer["message"] == "moved failed unexpectedly (ModuleNotFoundError)"
        logged = "\n".join(r.getMessage() for r in caplog.records)
        assert "could not load the call" in logged and "no_such_module_here" in logged
        assert dispatcher.processes.processes() == {"moved": 1}  # the worker is fine


async def test_output_that_cannot_leave_the_worker_is_invalid_output() -> None:
    registry = registry_with(lock=(tools.unpicklable, {}), a_set=(tools.a_set, {}))
    async with Dispatcher(registry, DispatcherOptions(telemetry=False)) as dispatcher:
        answer = (await dispatcher.dispatch("lock", {})).to_model()
        assert answer["error_type"] == "invalid_output", answer
        answer = (await dispatcher.dispatch("a_set", {})).to_model()  # converted in the host
        assert answer["ok"] and sorted(answer["data"]) == [1, 2, 3], answer
        assert dispatcher.processes.processes() == {"lock": 1, "a_set": 1}  # kept: no crash


# -- cancellation and closing ----------------------------------------------------------------
async def test_cancellation_kills_the_work_and_gives_no_answer(tmp_path: Path) -> None:
    registry = registry_with(slow=(tools.sleep_then_write, {"timeout_s": 30}))
    events = Events()
    pidfile, mark = tmp_path / "pid", tmp_path / "mark"
    async with Dispatcher(
        registry, DispatcherOptions(telemetry=False), observers=[events]
    ) as dispatcher:
        answers: list[ToolResult] = []
        with anyio.CancelScope() as scope:

            async def call() -> None:
                answers.append(
                    await dispatcher.dispatch(
                        "slow", {"pidfile": str(pidfile), "mark": str(mark), "sleep_s": 1.0}
                    )
                )

            async with anyio.create_task_group() as tg:
                tg.start_soon(call)
                await wait_until(pidfile.exists)
                scope.cancel()
        assert answers == []
        pid = pid_from(pidfile)
        assert not exists(pid)
        assert WorkerKilled("slow") in events.seen
        await anyio.sleep(1.2)
        assert not mark.exists()  # the work after the cancellation never happened
        done = await dispatcher.dispatch(
            "slow", {"mark": str(mark), "sleep_s": 0.0}
        )  # usable again
        assert done.ok and mark.exists()


async def test_aclose_leaves_no_worker_process(tmp_path: Path) -> None:
    registry = registry_with(
        slow=(tools.sleep_then_write, {"timeout_s": 30}),
        hang=(tools.hang, {"timeout_s": 30}),
    )
    dispatcher = Dispatcher(registry, DispatcherOptions(telemetry=False))
    marks = [tmp_path / f"mark{i}" for i in range(3)]
    async with anyio.create_task_group() as tg:
        for i, mark in enumerate(marks):
            pidfile = str(tmp_path / f"pid{i}")
            tg.start_soon(
                dispatcher.dispatch, "slow", {"pidfile": pidfile, "mark": str(mark), "sleep_s": 0.2}
            )
    idle = [pid_from(tmp_path / f"pid{i}") for i in range(3)]
    assert len(set(idle)) == 3 and all(alive(pid) for pid in idle)
    hung: list[ToolResult] = []

    async def call_hang() -> None:
        hung.append(await dispatcher.dispatch("hang", {"pidfile": str(tmp_path / "busy")}))

    async with anyio.create_task_group() as tg:
        tg.start_soon(call_hang)
        await wait_until((tmp_path / "busy").exists)
        await dispatcher.aclose()
    busy = pid_from(tmp_path / "busy")
    assert not any(exists(pid) for pid in [*idle, busy])
    assert dispatcher.processes.processes() == {"slow": 0, "hang": 0}
    assert hung[0].error_type == "tool_error"  # its process was killed by aclose
    assert "SIGKILL" in hung[0].message
    assert worker_processes() == set()


async def test_the_pool_is_bounded_by_max_concurrent(tmp_path: Path) -> None:
    registry = registry_with(slow=(tools.sleep_then_write, {"timeout_s": 10, "breaker_key": "b"}))
    breakers = {"b": KeyPolicy(bulkhead=BulkheadOptions(max_concurrent=2, wait_s=10))}
    async with Dispatcher(
        registry, DispatcherOptions(telemetry=False, keys=breakers)
    ) as dispatcher:
        results: list[ToolResult] = []
        peak = 0

        async def one(i: int) -> None:
            mark = str(tmp_path / f"m{i}")
            results.append(await dispatcher.dispatch("slow", {"mark": mark, "sleep_s": 0.1}))

        async with anyio.create_task_group() as tg:
            for i in range(6):
                tg.start_soon(one, i)
            while len(results) < 6:
                peak = max(peak, dispatcher.processes.processes().get("b", 0))
                await anyio.sleep(0.01)
        assert all(r.ok for r in results)
        assert peak == 2 and dispatcher.processes.processes() == {"b": 2}


async def test_an_idle_worker_leaves_by_itself_and_is_replaced(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(isolation_pool, "IDLE_S", 0.3)
    registry = registry_with(describe=(tools.describe, {}))
    async with Dispatcher(registry, DispatcherOptions(telemetry=False)) as dispatcher:
        first = (await dispatcher.dispatch("describe", {})).data["pid"]
        await wait_until(lambda: not alive(first))
        second = await dispatcher.dispatch("describe", {})
        assert second.ok and second.data["pid"] != first
        assert dispatcher.processes.processes() == {"describe": 1}


def test_a_worker_ends_when_its_host_dies(tmp_path: Path) -> None:
    """A hung worker does not outlive a host killed without closing anything."""
    host = tmp_path / "host.py"
    pidfile = tmp_path / "pid"
    host.write_text(
        textwrap.dedent(f"""
        import sys
        sys.path.insert(0, {str(TESTS)!r})
        import anyio
        import isolated_tools
        from toolrelay import Dispatcher, DispatcherOptions, ToolRegistry

        registry = ToolRegistry()
        registry.tool(name="hang", parameters={{"type": "object"}}, isolation="process",
                      timeout_s=60)(isolated_tools.hang)

        async def main():
            dispatcher = Dispatcher(registry, DispatcherOptions(telemetry=False))
            await dispatcher.dispatch("hang", {{"pidfile": {str(pidfile)!r}}})

        if __name__ == "__main__":
            anyio.run(main)
        """)
    )
    process = subprocess.Popen([sys.executable, str(host)], cwd=ROOT)
    try:
        deadline = time.monotonic() + 30
        while not pidfile.exists() or not pidfile.read_text():
            assert time.monotonic() < deadline and process.poll() is None
            time.sleep(0.02)
        worker = pid_from(pidfile)
        assert alive(worker)
    finally:
        process.kill()
        process.wait()
    deadline = time.monotonic() + 10
    while alive(worker) and time.monotonic() < deadline:
        time.sleep(0.02)
    assert not alive(worker)


# -- registration ------------------------------------------------------------------------------
def _local_function() -> Any:
    def local(args: dict[str, Any], ctx: AuthContext) -> str:
        return "local"

    return local


@pytest.mark.parametrize(
    ("fn", "said"),
    [
        (lambda args, ctx: None, "is not defined at the top level"),
        (_local_function(), "is not defined at the top level"),
        (functools.partial(tools.describe), "needs a module-level function"),
        (tools.Service().run, "needs a module-level function"),
        (tools.async_tool, "is for sync handlers"),
    ],
    ids=["lambda", "local", "partial", "method", "async"],
)
def test_registration_refuses_what_a_worker_cannot_import(fn: Any, said: str) -> None:
    registry = ToolRegistry()
    with pytest.raises(RegistrationError, match=said) as caught:
        registry.tool(name="t", parameters=ANY, isolation="process")(fn)
    assert "'t'" in str(caught.value) and "isolation='process'" in str(caught.value)
    assert "t" not in registry
    registry.tool(name="t", parameters=ANY)(fn)  # the default (thread) isolation takes it


def test_registration_refuses_an_unknown_isolation() -> None:
    with pytest.raises(RegistrationError, match="isolation must be one of"):
        ToolRegistry().tool(name="t", parameters=ANY, isolation="fork")(tools.describe)  # type: ignore[arg-type]


def test_a_plugin_needs_a_module_level_handler_for_process_isolation() -> None:
    with pytest.raises(RegistrationError, match=r"plugin_tool.*needs a module-level function"):
        ToolRegistry().register(tools.Plugin())
    registry = ToolRegistry()
    registry.register(tools.HandlerPlugin())
    tool = registry.resolve("plugin_tool")
    assert tool is not None and tool.process_target is not None
    assert (tool.process_target.module, tool.process_target.qualname) == (
        "isolated_tools", "describe",
    )  # fmt: skip


async def test_isolation_can_be_overridden_by_the_operator() -> None:
    registry = ToolRegistry()
    registry.tool(name="describe", parameters=ANY)(tools.describe)
    registry.tool(name="local", parameters=ANY)(_local_function())
    with pytest.raises(RegistrationError, match=r"'local'.*not defined at the top level"):
        registry.override("local", isolation="process")
    registry.override("describe", isolation="process")
    async with Dispatcher(registry, DispatcherOptions(telemetry=False)) as dispatcher:
        assert (await dispatcher.dispatch("local", {})).data == "local"  # still in thread mode
        assert (await dispatcher.dispatch("describe", {})).data["pid"] != os.getpid()
        registry.override("describe", isolation="thread")
        assert (await dispatcher.dispatch("describe", {})).data["pid"] == os.getpid()


# -- the experiment, in a short form --------------------------------------------------------------
def test_the_experiment_runs_in_a_short_form() -> None:
    script = ROOT / "examples" / "experiments" / "process_isolation.py"
    result = subprocess.run(
        [sys.executable, str(script),
         "--calls", "20", "--timeout", "0.5", "--overhead-calls", "50"],
        capture_output=True, text=True, timeout=180, cwd=ROOT,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr
    out = result.stdout
    assert "thread mode" in out and "process mode" in out
    report = json.loads(out.rsplit("\n", 2)[-2])
    assert report["thread"]["answered_timeout"] == report["process"]["answered_timeout"] == 20
    assert report["thread"]["threads_left"] >= 20  # abandoned threads, still hanging
    assert report["process"]["threads_left"] == 0
    assert report["process"]["processes_left"] == 0
