"""The flood instrument: a flood of hung calls probed by healthy calls (:func:`flood`),
the same flood with no toolrelay (:class:`BareAnyio`), and what shapes its figures from
outside (the event loop's priority and CPU wait, a CPU-bound neighbour, the collector)."""

from __future__ import annotations

import contextlib
import gc
import json
import os
import subprocess
import sys
import time
from collections import Counter as Tally
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import anyio
import anyio.lowlevel

from toolrelay import AuthContext

from .harness import (
    ARGS,
    CTX,
    FLOOR_S,
    ms,
    percentile,
)

PRIORITY_ENV = "TOOLRELAY_BENCH_PRIORITY"
"""Set to "normal" (``--normal-priority``): the deadline worker keeps the usual priority."""
CPU_WAIT_LIMIT_S = 0.002
"""A flood's latency rows are checked only if its event loop waited at most this long for a
CPU in all (its unloaded window and the flood together): beyond it, other processes shaped
the figures, not toolrelay."""
BURNER = """\
import os, sys, time
os.sched_setscheduler(0, os.SCHED_OTHER, os.sched_param(0))
os.sched_setaffinity(0, {int(sys.argv[1])})
parent, stop = int(sys.argv[2]), time.monotonic() + 120
while os.getppid() == parent and time.monotonic() < stop:
    for _ in range(20_000):
        pass
"""
"""A CPU-bound neighbour on one CPU, in its own session; it stops when its parent goes."""


def set_priority(realtime: bool) -> str:
    """The calling thread's scheduling (the threads it starts later inherit it): SCHED_FIFO
    at the lowest real-time priority if ``realtime`` and permitted, else the normal one."""
    if realtime:
        try:
            os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param(1))
            return "real-time"
        except (AttributeError, OSError):
            pass
    with contextlib.suppress(AttributeError, OSError):
        os.sched_setscheduler(0, os.SCHED_OTHER, os.sched_param(0))
    return "normal" if not realtime else "normal (real-time not permitted)"


def cpu_wait() -> float | None:
    """Seconds this thread has spent runnable but waiting for a CPU (the kernel's run-queue
    delay, /proc/thread-self/schedstat); None where the kernel does not tell."""
    try:
        with open("/proc/thread-self/schedstat") as stat:
            return int(stat.read().split()[1]) / 1e9
    except (OSError, ValueError, IndexError):
        return None


class Neighbour:
    """A CPU-bound process pinned to ``cpu`` for the ``with`` block (its own session, so it
    shares no scheduling group with this process)."""

    def __init__(self, cpu: int) -> None:
        self.cpu = cpu
        self.proc: subprocess.Popen[bytes] | None = None

    def __enter__(self) -> Neighbour:
        command = [sys.executable, "-c", BURNER, str(self.cpu), str(os.getpid())]
        self.proc = subprocess.Popen(command, start_new_session=True)
        return self

    def __exit__(self, *exc: object) -> None:
        assert self.proc is not None
        self.proc.kill()
        self.proc.wait()


class Probe:
    """Open-loop probe: one healthy call due every ``interval`` s, each in its own task,
    its latency counted from when it was due. A blocked loop is not hidden: calls that
    fell due while the loop was busy are launched late (and counted late) before the
    probe stops at ``until``."""

    def __init__(self, d: Any, interval: float = 0.001) -> None:
        self.d = d
        self.interval = interval
        self.until: float | None = None
        self.samples: list[tuple[float, float]] = []  # (due, latency)
        self.failures: list[str] = []

    async def one(self, due: float) -> None:
        result = await self.d.dispatch("healthy", ARGS, CTX)
        self.samples.append((due, time.perf_counter() - due))
        if not result.ok:
            self.failures.append(str(result.error_type))

    async def run(self) -> None:
        async with anyio.create_task_group() as tg:
            due = time.perf_counter()
            while self.until is None or due <= self.until:
                tg.start_soon(self.one, due)
                due += self.interval
                await anyio.sleep(max(0.0, due - time.perf_counter()))

    def p99(self, start: float, end: float) -> tuple[float, int]:
        if self.failures:
            raise RuntimeError(f"healthy probe calls failed: {Tally(self.failures)}")
        window = [lat for due, lat in self.samples if start <= due <= end]
        return percentile(window, 99), len(window)


class CollectorPauses:
    """The garbage collector's stop-the-world pauses while active (gc.callbacks)."""

    def __init__(self) -> None:
        self.pauses: list[tuple[int, float]] = []  # (generation, seconds)
        self._started = 0.0

    def _callback(self, phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            self._started = time.perf_counter()
        else:
            self.pauses.append((info["generation"], time.perf_counter() - self._started))

    def __enter__(self) -> CollectorPauses:
        gc.callbacks.append(self._callback)
        return self

    def __exit__(self, *exc: object) -> None:
        gc.callbacks.remove(self._callback)

    def full(self) -> int:
        return sum(1 for generation, _ in self.pauses if generation == 2)

    def longest(self) -> float:
        return max((t for _, t in self.pauses), default=0.0)


def collector_summary(runs: Sequence[Flood]) -> str:
    return (
        f"the collector ran {sum(r.full_collections for r in runs)} full collection(s), "
        f"longest pause {ms(max(r.longest_pause for r in runs))}"
    )


@dataclass
class Flood:
    lateness: list[float]
    launch_s: float
    probe_p99: float
    probes: int
    probe_p99_after_launch: float
    full_collections: int
    longest_pause: float
    unloaded_p99: float
    """the healthy calls' p99 in the unloaded window just before the flood"""
    cpu_wait_s: float | None
    """how long the event loop waited for a CPU, unloaded window and flood together"""
    cpu_s: float
    """this process's CPU time during the flood"""

    @property
    def p99(self) -> float:
        return percentile(self.lateness, 99)

    @property
    def ratio(self) -> float:
        return max(self.probe_p99, FLOOR_S) / max(self.unloaded_p99, FLOOR_S)


async def flood(
    d: Any,
    tool: str,
    n: int,
    timeout_s: float,
    args: str = "{}",
    *,
    spread_s: float = 0.0,
    collector: bool = True,
    unloaded_s: float = 0.3,
) -> Flood:
    """``n`` concurrent calls to a hung tool, probed by healthy calls on another key; the
    same probe times an unloaded window of ``unloaded_s`` just before (the baseline).

    ``spread_s=0``: all ``n`` are started in one event-loop iteration (a burst); otherwise
    they arrive evenly over ``spread_s`` (in 1 ms steps). ``collector=False`` pauses the
    garbage collector for the flood (a diagnostic: what the flood costs toolrelay itself).
    """
    lateness: list[float] = []
    kinds: Tally[str] = Tally()

    async def one() -> None:
        start = time.perf_counter()
        result = await d.dispatch(tool, args, CTX)
        answered = time.perf_counter()
        lateness.append(answered - (start + timeout_s))
        kinds[str(result.error_type)] += 1

    probe = Probe(d)
    if not collector:
        gc.disable()
    try:
        with CollectorPauses() as pauses:
            async with anyio.create_task_group() as outer:
                outer.start_soon(probe.run)
                await anyio.sleep(0.05)
                quiet = time.perf_counter()
                waited = cpu_wait()
                await anyio.sleep(unloaded_s)
                began = time.perf_counter()
                pauses.pauses.clear()
                cpu = time.process_time()
                async with anyio.create_task_group() as tg:
                    steps = max(1, round(spread_s / 0.001))
                    for step in range(steps):
                        for _ in range(n * (step + 1) // steps - n * step // steps):
                            tg.start_soon(one)
                        if step + 1 < steps:
                            await anyio.sleep(
                                max(0.0, began + (step + 1) * 0.001 - time.perf_counter())
                            )
                    await anyio.lowlevel.checkpoint()
                    launched = time.perf_counter() - began
                ended = probe.until = time.perf_counter()
                cpu = time.process_time() - cpu
                now = cpu_wait()
                waited = None if now is None or waited is None else now - waited
    finally:
        gc.enable()
    if set(kinds) != {"timeout"}:
        raise RuntimeError(f"the {tool} flood answered {dict(kinds)}, not only timeouts")
    p99, count = probe.p99(began, ended)
    after, _ = probe.p99(began + launched, ended)
    base, _ = probe.p99(quiet, began)
    return Flood(
        lateness, launched, p99, count, after, pauses.full(), pauses.longest(), base, waited, cpu
    )


@dataclass
class Answer:
    ok: bool
    error_type: str | None = None


class BareAnyio:
    """The async flood with no toolrelay: ``json.loads`` and ``anyio.fail_after`` around the
    handler, the healthy call one checkpoint (what any anyio program pays for the flood)."""

    def __init__(self, timeout_s: float) -> None:
        self.timeout_s = timeout_s

    async def dispatch(self, name: str, raw: str, ctx: AuthContext) -> Answer:
        json.loads(raw)
        if name == "healthy":
            await anyio.lowlevel.checkpoint()
            return Answer(True)
        try:
            with anyio.fail_after(self.timeout_s):
                await anyio.sleep_forever()
        except TimeoutError:
            return Answer(False, "timeout")
        return Answer(True)


def waits(runs: Sequence[Flood]) -> str:
    known = [r.cpu_wait_s for r in runs if r.cpu_wait_s is not None]
    if not known:
        return "the kernel does not tell how long the event loop waited for a CPU"
    return f"the event loop waited up to {ms(max(known))} for a CPU (other processes)"
