"""Breaker state shared through a real redis-server, and what happens when it dies."""

from __future__ import annotations

import logging
import socket
import sys
import textwrap
import threading
from collections.abc import Iterator
from typing import Any

import anyio
import pytest

from redis_server import RedisServer, free_port
from toolrelay import AuthContext, BreakerConfig, Dispatcher, ErrorType, ToolError, ToolRegistry

pytestmark = pytest.mark.anyio

CONFIG = BreakerConfig(fail_max=3, reset_timeout_s=60, max_attempts=1)


class Flaky:
    def __init__(self) -> None:
        self.calls = 0
        self.failing = True

    async def __call__(self, args: dict[str, Any], ctx: AuthContext) -> Any:
        self.calls += 1
        if self.failing:
            raise ToolError("upstream 503", retryable=True)
        return {"n": self.calls}


def make(url: str, **kw: Any) -> tuple[Dispatcher, Flaky]:
    registry = ToolRegistry()
    flaky = Flaky()
    registry.tool(name="lookup", parameters={"type": "object"}, breaker_key="crm")(flaky)  # type: ignore[arg-type]
    dispatcher = Dispatcher(registry, breakers={"crm": CONFIG}, breaker_storage=url, **kw)
    return dispatcher, flaky


@pytest.fixture
def redis() -> Iterator[RedisServer]:
    with RedisServer() as server:
        yield server


OPENER = textwrap.dedent(
    """
    import sys, anyio
    from toolrelay import BreakerConfig, Dispatcher, ToolError, ToolRegistry
    registry = ToolRegistry()

    @registry.tool(name="other_tool", parameters={"type": "object"}, breaker_key="crm")
    async def other_tool(args, ctx):
        raise ToolError("upstream 503", retryable=True)

    async def main():
        d = Dispatcher(registry, breakers={"crm": BreakerConfig(fail_max=3, reset_timeout_s=60,
                       max_attempts=1)}, breaker_storage=sys.argv[1])
        for _ in range(3):
            await d.dispatch("other_tool", "{}")
        print(d.breakers.state("crm"))
    anyio.run(main)
    """
)


async def test_two_processes_share_an_open_breaker(redis: RedisServer) -> None:
    dispatcher, flaky = make(redis.url)
    flaky.failing = False
    assert (await dispatcher.dispatch("lookup", "{}")).ok
    seen: list[tuple[str, str, str]] = []
    dispatcher.breakers.add_listener(lambda *t: seen.append(t))

    other = await anyio.run_process([sys.executable, "-c", OPENER, redis.url])
    assert other.stdout.decode().strip() == "open"

    result = await dispatcher.dispatch("lookup", "{}")
    assert result.error_type is ErrorType.CIRCUIT_OPEN
    assert result.retry_after_s is not None and 55 < result.retry_after_s <= 60
    assert flaky.calls == 1  # the other process's failures cut this one off
    assert seen == [("crm", "closed", "open")]
    assert dispatcher.storage_up
    # An operator closing it here closes it for everyone sharing the Redis.
    dispatcher.breakers.force_close("crm")
    peer, _ = make(redis.url)
    assert peer.breakers.state("crm") == "closed"
    dispatcher.close()
    peer.close()


async def test_killing_redis_mid_run_loses_no_answers(
    redis: RedisServer, caplog: pytest.LogCaptureFixture
) -> None:
    dispatcher, flaky = make(redis.url, breaker_storage_probe_s=0.1)
    flaky.failing = False
    results = []
    for index in range(60):
        if index == 20:
            redis.kill()
        if index == 30:
            flaky.failing = True  # the service fails while Redis is gone
        results.append(await dispatcher.dispatch("lookup", "{}"))
    assert len(results) == 60
    assert all(r.ok for r in results[:30])
    kinds = [r.error_type for r in results[30:]]
    # local counts still open the breaker: three real failures, then fast-fails
    assert kinds[:3] == [ErrorType.TOOL_ERROR] * 3
    assert set(kinds[3:]) == {ErrorType.CIRCUIT_OPEN}
    assert flaky.calls == 33
    assert not dispatcher.storage_up
    warnings = [r for r in caplog.records if "unreachable" in r.getMessage()]
    assert len(warnings) == 1 and "using local breaker state" in warnings[0].getMessage()

    # Redis comes back on the same port: the link notices at the next probe.
    with RedisServer(port=redis.port):
        await anyio.sleep(0.15)
        await dispatcher.dispatch("lookup", "{}")
        assert dispatcher.storage_up
    dispatcher.close()


async def test_unreachable_redis_at_start_still_breaks(caplog: pytest.LogCaptureFixture) -> None:
    url = f"redis://127.0.0.1:{free_port()}/0"  # nothing listens there
    caplog.set_level(logging.WARNING, logger="toolrelay")
    dispatcher, flaky = make(url)
    kinds = [(await dispatcher.dispatch("lookup", "{}")).error_type for _ in range(5)]
    assert kinds == [ErrorType.TOOL_ERROR] * 3 + [ErrorType.CIRCUIT_OPEN] * 2
    assert flaky.calls == 3 and not dispatcher.storage_up
    assert sum("unreachable" in r.getMessage() for r in caplog.records) == 1
    dispatcher.close()


async def test_a_hung_redis_is_probed_rarely() -> None:
    """A Redis that accepts connections and never answers costs one bounded wait per probe."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(64)
    accepted: list[socket.socket] = []
    stop = threading.Event()

    def accept() -> None:
        listener.settimeout(0.05)
        while not stop.is_set():
            try:
                accepted.append(listener.accept()[0])
            except OSError:
                continue

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    try:
        url = f"redis://127.0.0.1:{listener.getsockname()[1]}/0"
        dispatcher, flaky = make(url, breaker_storage_probe_s=30)
        flaky.failing = False
        results = [await dispatcher.dispatch("lookup", "{}") for _ in range(100)]
        assert all(r.ok for r in results)
        link = dispatcher.storage_link
        assert link is not None and not link.up
        assert link.failures == 1  # one timed-out attempt, then local state until the next probe
        dispatcher.close()
    finally:
        stop.set()
        thread.join(5)
        listener.close()
        for conn in accepted:
            conn.close()


async def test_redis_round_trips_per_call_are_bounded(redis: RedisServer) -> None:
    import redis as redis_py

    dispatcher, flaky = make(redis.url)
    flaky.failing = False
    client = redis_py.Redis.from_url(redis.url)
    await dispatcher.dispatch("lookup", "{}")  # creates the breaker and its keys

    def commands() -> int:
        stats = client.info("commandstats")
        return sum(int(v["calls"]) for k, v in stats.items() if k != "cmdstat_info")

    before = commands()
    for _ in range(20):
        assert (await dispatcher.dispatch("lookup", "{}")).ok
    per_call = (commands() - before) / 20
    # admission reads the state, recording reads state and failure count: nothing else
    # (the fast-fail check trusts the state this process last saw)
    assert per_call <= 3, per_call
    client.close()
    dispatcher.close()
