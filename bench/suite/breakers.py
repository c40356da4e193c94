"""Breakers: what a count or time failure window costs over the consecutive counter, and
the breakers shared through Redis (overhead, a slowed Redis, replica convergence)."""

from __future__ import annotations

import gc
import itertools
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any

import anyio
import anyio.lowlevel

from toolrelay import BreakerOptions, Dispatcher, KeyPolicy, StorageOptions

from .harness import (
    ARGS,
    CTX,
    HERE,
    Row,
    Settings,
    dispatch_case,
    dispatcher,
    interleave,
    interleave_sync,
    medians,
    ms,
    noop_registry,
    paired_difference,
    paired_ratio,
    percentile,
    sanity,
    us,
)


def breaker_loop(breaker: Any) -> Callable[[int], None]:
    """``admit()`` + ``record()`` ``n`` times: 1 call in 20 fails, the others succeed."""
    from toolrelay.outcome import Verdict

    admit, record = breaker.admit, breaker.record
    success, failure = Verdict.SUCCESS, Verdict.FAILURE

    def run(n: int) -> None:
        for i in range(n):
            record(failure if i % 20 == 19 else success, admit(), 0.001)

    return run


def bench_breaker_windows(s: Settings) -> list[Row]:
    from toolrelay.breakers import Breakers

    never = 10**9  # no window may open: every case must stay on the closed path
    configs = {
        "consecutive": KeyPolicy(breaker=BreakerOptions(fail_max=never)),
        # failure_rate 1.0 is never reached at 1 failure in 20, yet every failure goes
        # the whole way (minimum_calls met, the rate computed)
        "count": KeyPolicy(
            breaker=BreakerOptions(window="count", window_size=100, failure_rate=1.0)
        ),
        "time": KeyPolicy(breaker=BreakerOptions(window="time", window_size=10, failure_rate=1.0)),
    }
    breakers = Breakers(lambda key: configs[key].breaker)
    cases = {name: breaker_loop(breakers.get(name)) for name in configs}
    calls = s.breaker_calls
    samples = interleave_sync(cases, s.rounds, calls, calls // 4)
    for name in configs:
        snap = breakers.get(name).snapshot()
        if snap["state"] != "closed":
            raise RuntimeError(f"the {name} breaker left the closed state: {snap}")
    m = medians(samples)
    sizes = {"count": "100 calls", "time": "10 s"}
    rows = []
    for name in ("count", "time"):
        extra = paired_difference(samples[name], samples["consecutive"])
        rows.append(
            Row(
                "breakers",
                f"breaker admit + record, {name} window / consecutive",
                extra * 1e6,
                unit="+µs",
                target="≤ 1 µs",
                passed=extra <= 1e-6,
                context=f"{paired_ratio(samples[name], samples['consecutive']):.2f}×: "
                f"{us(m[name])} vs {us(m['consecutive'])} per call; 1 call in 20 fails; "
                f"a window of {sizes[name]}",
            )
        )
    return rows


REDIS_SKIPS = {
    "binary": "skipped (redis-server not installed)",
    "client": "skipped (pip install '.[redis]')",
}
REDIS_ROWS = (
    ("dispatch with Redis-shared breakers / in-memory breakers", "≤ 1.2×"),
    ("healthy dispatch p99, Redis slowed by 40 ms per command / Redis at full speed", "≤ 1.5×"),
    ("replica convergence after a transition (p99 of {n})", ""),
)


def link_of(d: Dispatcher) -> Any:
    link = d.storage_link
    assert link is not None
    return link


async def until(done: Callable[[], bool], what: str, poll_s: float, limit_s: float = 5) -> None:
    """Poll ``done()`` every ``poll_s`` until it is true (an error after ``limit_s``)."""
    deadline = time.perf_counter() + limit_s
    for delay in itertools.repeat(poll_s):
        if done():
            return
        if time.perf_counter() > deadline:
            raise RuntimeError(f"{what} did not happen within {limit_s:g} s")
        await anyio.sleep(delay)


async def linked(d: Dispatcher, key: str = "svc") -> None:
    """Create the key's breaker and wait for the link's first sync (its state read)."""
    d.breakers.get(key)
    link = link_of(d)
    await until(lambda: link.commands > 0, "the link's first sync", 0.002, 10)


async def close_all(*things: Any) -> None:
    """``close()`` each (dispatchers, proxies) on threads at once: a link's close waits
    up to 0.5 s for its listener thread."""
    async with anyio.create_task_group() as tg:
        for thing in things:
            if thing is not None:
                tg.start_soon(anyio.to_thread.run_sync, thing.close)


def still_up(*named: tuple[str, Dispatcher]) -> None:
    for label, d in named:
        link = link_of(d)
        if not link.up or link.failures:
            raise RuntimeError(f"the {label} link lost Redis ({link.failures} failure(s))")


async def redis_vs_memory(s: Settings, url: str, sync_s: float) -> Row:
    registry = noop_registry()
    shared = dispatcher(registry, storage=StorageOptions(url=url, sync_interval_s=sync_s))
    local = dispatcher(registry)
    try:
        await linked(shared)
        cases = {"redis": dispatch_case(shared), "memory": dispatch_case(local)}
        await sanity(cases)
        before = link_of(shared).commands
        samples = await interleave(cases, s.rounds, s.calls, s.warmup)
        synced = link_of(shared).commands - before
        still_up(("shared", shared))
    finally:
        await close_all(shared, local)
    m = medians(samples)
    ratio = paired_ratio(samples["redis"], samples["memory"])
    name, target = REDIS_ROWS[0]
    return Row(
        "breakers",
        name,
        ratio,
        target=target,
        passed=ratio <= 1.2,
        context=f"{us(m['redis'])} vs {us(m['memory'])} per call; the link made {synced} "
        f"Redis round trip(s) meanwhile, on its own thread (sync every {sync_s:g} s)",
    )


async def latencies(d: Dispatcher, seconds: float, into: list[float]) -> list[float]:
    """Sequential dispatches for ``seconds``; each one's latency, also appended to ``into``."""
    out: list[float] = []
    gc.collect()
    await anyio.lowlevel.checkpoint()
    clock = time.perf_counter
    until = clock() + seconds
    while True:
        started = clock()
        result = await d.dispatch("noop", ARGS, CTX, call_id="call_1")
        ended = clock()
        if not result.ok:
            raise RuntimeError(f"a healthy call answered {result.to_model()}")
        out.append(ended - started)
        if ended >= until:
            break
    into.extend(out)
    return out


async def slowed_redis_p99(s: Settings, server_port: int, url: str, sync_s: float) -> Row:
    from breaker_servers import slow_proxy

    delay_s = 0.040
    proxy = slow_proxy("127.0.0.1", server_port, delay_s)
    registry = noop_registry()
    slow = fast = None
    try:
        # a 1 s socket timeout: 40 ms per command must not mark Redis down
        slow = dispatcher(
            registry,
            storage=StorageOptions(url=proxy.url, sync_interval_s=sync_s, timeout_s=1.0),
        )
        fast = dispatcher(registry, storage=StorageOptions(url=url, sync_interval_s=sync_s))
        took = time.perf_counter()
        await linked(slow)
        first_sync = time.perf_counter() - took
        await linked(fast)
        cases = {"slow": slow, "fast": fast}
        for d in cases.values():  # warm-up (and the keys become active: they sync)
            await latencies(d, 0.05, [])
        before = {name: link_of(d).commands for name, d in cases.items()}
        pooled: dict[str, list[float]] = {name: [] for name in cases}
        ratios = []
        for index in range(s.p99_rounds):
            p99s = {}
            for name in list(cases) if index % 2 == 0 else reversed(list(cases)):
                sample = await latencies(cases[name], s.p99_round_s, pooled[name])
                p99s[name] = percentile(sample, 99)
            ratios.append(p99s["slow"] / p99s["fast"])
        grew = {name: link_of(d).commands - before[name] for name, d in cases.items()}
        still_up(("slowed", slow), ("direct", fast))
        if grew["slow"] < 1:
            raise RuntimeError("the slowed link never synced during the measurement")
    finally:
        await close_all(slow, fast, proxy)
    ratio = statistics.median(ratios)
    name, target = REDIS_ROWS[1]
    p99 = {name: percentile(values, 99) for name, values in pooled.items()}
    p50 = {name: percentile(values, 50) for name, values in pooled.items()}
    return Row(
        "breakers",
        name,
        ratio,
        target=target,
        passed=ratio <= 1.5,
        in_force=not s.quick,  # three rounds of wall-clock p99s: a busy machine decides
        context=f"p99 {us(p99['slow'])} vs {us(p99['fast'])}, p50 {us(p50['slow'])} vs "
        f"{us(p50['fast'])} ({len(pooled['slow']):,} / {len(pooled['fast']):,} calls in "
        f"{s.p99_rounds} rounds of {s.p99_round_s:g} s); Redis round trips meanwhile: "
        f"slowed link {grew['slow']}, direct {grew['fast']} (sync every {sync_s:g} s; "
        f"the slowed link's first took {ms(first_sync)}); both links stayed up",
    )


async def convergence(s: Settings, url: str, sync_s: float) -> Row:
    from collections import deque

    class StampedInbox(deque):  # type: ignore[type-arg]
        """The observing breaker's inbox, noting when each update arrives (any thread)."""

        def __init__(self) -> None:
            super().__init__()
            self.stamps: list[tuple[float, Any]] = []

        def append(self, item: Any) -> None:
            self.stamps.append((time.perf_counter(), item))
            super().append(item)

    registry = noop_registry()
    here = dispatcher(registry, storage=StorageOptions(url=url, sync_interval_s=sync_s))
    there = dispatcher(registry, storage=StorageOptions(url=url, sync_interval_s=sync_s))
    poll_s = 0.0005
    delays: list[float] = []
    arrivals: list[float] = []
    inbox = StampedInbox()

    async def seen(state: str) -> None:
        stamps = inbox.stamps
        stamps.clear()
        started = time.perf_counter()
        if state == "open":
            here.breakers.force_open("svc")
        else:
            here.breakers.force_close("svc")
        await until(lambda: there.breakers.state("svc") == state, f"seeing {state!r}", poll_s)
        delays.append(time.perf_counter() - started)
        arrivals.append(min(at for at, r in list(stamps) if r.state == state) - started)

    try:
        await linked(here)
        await linked(there)
        there.breakers.get("svc").inbox = inbox
        for index in range(6):  # warm-up: both links subscribed, scripts loaded
            await seen("open" if index % 2 == 0 else "closed")
        delays.clear()
        arrivals.clear()
        for index in range(s.transitions):
            await seen("open" if index % 2 == 0 else "closed")
        still_up(("deciding", here), ("observing", there))
    finally:
        await close_all(here, there)
    p99 = percentile(delays, 99)
    late = sum(1 for d in delays if d >= sync_s / 2)
    return Row(
        "breakers",
        REDIS_ROWS[2][0].format(n=s.transitions),
        p99 * 1e3,
        unit="ms",
        context=f"p50 {ms(percentile(delays, 50))}, max {ms(max(delays))}; force_open / "
        f"force_close alternating on replica A, replica B's state polled every "
        f"{poll_s * 1e3:g} ms (asyncio waits in 1 ms steps); the update reached B's inbox "
        f"after p50 {ms(percentile(arrivals, 50))}, p99 {ms(percentile(arrivals, 99))}; "
        f"periodic sync every {sync_s:g} s: {late} of {len(delays)} took ≥ "
        f"{sync_s / 2:g} s (pub/sub missed)",
    )


async def bench_breakers(s: Settings) -> list[Row]:
    rows = bench_breaker_windows(s)
    sys.path.insert(0, str(HERE))
    from breaker_servers import redis_binary, redis_server

    binary = redis_binary()
    try:
        import redis  # noqa: F401
    except ImportError:
        binary, skip = None, REDIS_SKIPS["client"]
    else:
        skip = REDIS_SKIPS["binary"]
    if binary is None:
        for name, target in REDIS_ROWS:
            rows.append(Row("breakers", name.format(n=s.transitions), target=target, status=skip))
        return rows
    sync_s = 0.2
    with redis_server(binary) as server:
        rows.append(await redis_vs_memory(s, server.url, sync_s))
        rows.append(await slowed_redis_p99(s, server.port, server.url, sync_s))
        rows.append(await convergence(s, server.url, sync_s))
    return rows
