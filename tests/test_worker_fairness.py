"""A hung service cannot starve another key of worker threads, at any flood size (issue 14).

Worker threads for sync handlers are started by one spawner thread. Served first come
first served, a call on key B waited for every thread key A had asked for before it — with
1,500 hung calls on A, a 0.1 s call on B could answer ``timeout`` and count against B's
breaker.
"""

from __future__ import annotations

import threading
import time
from typing import Any

import anyio
import pytest

from helpers import wait_until
from toolrelay import (
    AuthContext,
    BulkheadOptions,
    Dispatcher,
    DispatcherOptions,
    KeyPolicy,
    RetryOptions,
    ToolRegistry,
    ToolResult,
)
from toolrelay import workers as workers_module

pytestmark = pytest.mark.anyio

ANY = {"type": "object"}
FLOOD = 1_500
HUNG_KEY = "fairness-hung"
QUICK_KEY = "fairness-quick"


def _worker_threads(key: str) -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == f"toolrelay-worker[{key}]"]


@pytest.mark.serial  # a race with the spawner thread
async def test_a_flood_of_hung_sync_calls_does_not_delay_another_keys_thread(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Idle workers end quickly, so the test can check that every thread it caused is gone.
    monkeypatch.setattr(workers_module, "IDLE_S", 0.2)
    registry = ToolRegistry()
    release = threading.Event()
    lock = threading.Lock()
    hung = 0
    hung_when_b_ran: list[int] = []

    @registry.tool(name="hang", parameters=ANY, breaker_key=HUNG_KEY, timeout_s=60)
    def hang(args: dict[str, Any], ctx: AuthContext) -> str:
        nonlocal hung
        with lock:
            hung += 1
        release.wait(60)
        return "released"

    @registry.tool(name="quick", parameters=ANY, breaker_key=QUICK_KEY, timeout_s=1.0)
    def quick(args: dict[str, Any], ctx: AuthContext) -> str:
        hung_when_b_ran.append(hung)
        time.sleep(0.1)
        return "fine"

    dispatcher = Dispatcher(
        registry,
        DispatcherOptions(
            keys={
                HUNG_KEY: KeyPolicy(
                    retry=RetryOptions(max_attempts=1),
                    bulkhead=BulkheadOptions(max_concurrent=2_000),
                )
            },
            telemetry=False,
        ),
    )
    flood_results: list[ToolResult] = []

    async def flood_one() -> None:
        flood_results.append(await dispatcher.dispatch("hang", {}))

    try:
        async with anyio.create_task_group() as tg:
            for _ in range(FLOOD):
                tg.start_soon(flood_one)
            # Every flood call has asked for its thread; most are not started yet.
            await wait_until(lambda: dispatcher.workers.live().get(HUNG_KEY) == FLOOD)
            hung_when_b_asked = hung
            asked_at = time.perf_counter()
            quick_result = await dispatcher.dispatch("quick", {})
            quick_s = time.perf_counter() - asked_at
            release.set()
    finally:
        release.set()  # whatever happened, let every hung handler end

    assert quick_result.ok, quick_result
    assert quick_result.data == "fine"
    # B's thread was started ahead of A's backlog, not after all of it: of the flood calls
    # still waiting for a thread when B asked, few got theirs before B (at most one each
    # round of the spawner), where first come first served let all of them go first.
    backlog = FLOOD - hung_when_b_asked
    overtaken = hung_when_b_ran[0] - hung_when_b_asked
    assert overtaken < backlog // 2, (backlog, overtaken, quick_s)
    assert len(flood_results) == FLOOD and all(r.data == "released" for r in flood_results)

    # Accounting and idle exit are intact: no place or thread is left behind.
    await wait_until(lambda: dispatcher.workers.live() == {HUNG_KEY: 0, QUICK_KEY: 0})
    assert dispatcher.workers.abandoned() == {HUNG_KEY: 0, QUICK_KEY: 0}
    await wait_until(lambda: not _worker_threads(HUNG_KEY) and not _worker_threads(QUICK_KEY))
    assert dispatcher.workers.get(HUNG_KEY).threads == 0
    assert dispatcher.workers.get(QUICK_KEY).threads == 0


async def test_a_worker_thread_that_cannot_start_leaves_the_key_usable(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """Out of threads once: that call times out, the spawner survives, the next call runs."""
    registry = ToolRegistry()

    @registry.tool(name="work", parameters=ANY, breaker_key="fairness-nothread", timeout_s=0.3)
    def work(args: dict[str, Any], ctx: AuthContext) -> str:
        return "done"

    dispatcher = Dispatcher(
        registry,
        DispatcherOptions(
            keys={"fairness-nothread": KeyPolicy(retry=RetryOptions(max_attempts=1))}
        ),
        audit=None,
    )
    real_start = threading.Thread.start
    refused: list[str] = []

    def start(self: threading.Thread) -> None:
        if self.name == "toolrelay-worker[fairness-nothread]" and not refused:
            refused.append(self.name)
            raise RuntimeError("can't start new thread")
        real_start(self)

    monkeypatch.setattr(threading.Thread, "start", start)
    first = await dispatcher.dispatch("work", {})
    assert not first.ok and str(first.error_type) == "timeout" and refused
    assert any("could not start a worker thread" in r.getMessage() for r in caplog.records)
    second = await dispatcher.dispatch("work", {})
    assert second.ok and second.data == "done"
    pool = dispatcher.workers.get("fairness-nothread")
    await wait_until(lambda: pool.live == 0)
