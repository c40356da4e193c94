"""Worker threads for sync handlers: a bounded set per breaker key.

A thread abandoned at its deadline keeps its place until it really ends, so a key whose
handlers hang sheds load (``overloaded``) instead of spawning threads without bound, and
never takes threads from another key. (anyio's ``CapacityLimiter`` alone cannot promise
that: on asyncio it hands the token back when a thread is abandoned, trio does not.)

Threads are started by one spawner thread, never on the event loop: starting a thread
waits for it to run, which costs the loop up to a millisecond per thread — enough to make
every deadline of a flood of new sync calls late by the time it takes to start them all.
The spawner takes the keys in turn, so one key's backlog of thread starts never holds up
another key's.
Idle threads are kept for reuse and end after ``IDLE_S`` without work, or when the
dispatcher is closed (``WorkerPools.close``).
"""

from __future__ import annotations

import contextlib
import contextvars
import logging
import queue
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

import anyio
import anyio.from_thread
import anyio.lowlevel

log = logging.getLogger("toolrelay")

IDLE_S = 30.0


def _nothing(*args: Any) -> None:
    return None


@dataclass(slots=True, eq=False)
class _Job:
    abandoned: bool = False
    started: bool = False
    skip: bool = False
    done: bool = False
    result: Any = None
    error: BaseException | None = None
    fn: Callable[..., Any] = _nothing
    args: tuple[Any, ...] = ()
    context: contextvars.Context = field(default_factory=contextvars.Context)
    event: anyio.Event | None = None
    token: Any = None


_STOP = _Job()
"""Queued once per thread by :meth:`KeyWorkers.close`: the thread that takes it ends."""


class Spawnable(Protocol):
    """A key's pool of workers (threads here, processes in ``isolation``)."""

    key: str

    def _spawn(self) -> None: ...


class Spawner:
    """One daemon thread that starts workers on request, one start per key with requests
    pending per round: a key whose hung calls asked for thousands of threads delays another
    key's next thread by at most one start (first come first served made it wait for all)."""

    def __init__(self, name: str = "toolrelay-spawner") -> None:
        self.name = name
        self._pending: dict[Spawnable, int] = {}
        """Thread starts asked for and not yet made, per key; the order is the round's."""
        self._wake = threading.Condition()
        self._thread: threading.Thread | None = None

    def request(self, pool: Spawnable) -> None:
        with self._wake:
            self._pending[pool] = self._pending.get(pool, 0) + 1
            self._wake.notify()
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._run, name=self.name, daemon=True)
                self._thread.start()

    def _next(self) -> Spawnable:
        """Wait for a request; take one from the key whose turn it is (to the back of the
        round if it has more)."""
        with self._wake:
            while not self._pending:
                self._wake.wait()
            pool = next(iter(self._pending))
            left = self._pending.pop(pool) - 1
            if left:
                self._pending[pool] = left
            return pool

    def _run(self) -> None:
        while True:
            self._next()._spawn()


SPAWNER = Spawner()


class KeyWorkers:
    """The worker threads of one breaker key."""

    def __init__(
        self, key: str, max_threads: int, notify: Callable[[str, int], None] | None = None
    ) -> None:
        self.key = key
        self.notify = notify
        self.max_threads = max_threads
        self.live = 0
        """Jobs admitted and not yet ended (abandoned ones included): the places taken."""
        self.abandoned = 0
        self.threads = 0
        self._jobs: queue.SimpleQueue[_Job] = queue.SimpleQueue()
        self._lock = threading.Lock()

    def try_start(self) -> _Job | None:
        with self._lock:
            if self.live >= self.max_threads:
                return None
            self.live += 1
        return _Job()

    def _spawn(self) -> None:
        try:
            threading.Thread(
                target=self._work, name=f"toolrelay-worker[{self.key}]", daemon=True
            ).start()
        except RuntimeError:  # out of threads: the key's next call asks again
            log.warning("toolrelay: could not start a worker thread for %r", self.key)
            with self._lock:
                self.threads -= 1

    def _work(self) -> None:
        while True:
            try:
                job = self._jobs.get(timeout=IDLE_S)
            except queue.Empty:
                with self._lock:
                    if self._jobs.empty():
                        self.threads -= 1
                        return
                continue
            if job is _STOP:
                with self._lock:
                    self.threads -= 1
                return
            with self._lock:
                job.started = not job.skip
            if job.started:
                try:
                    job.result = job.context.run(job.fn, *job.args)
                except BaseException as exc:  # handed to the waiting task, which re-raises
                    job.error = exc
            self._finished(job)

    def _finished(self, job: _Job) -> None:
        with self._lock:
            job.done = True
            self.live -= 1
            abandoned = job.abandoned
            if abandoned:
                self.abandoned -= 1
                count = self.abandoned
        if not abandoned and not job.skip:
            event = job.event
            assert event is not None
            # If the event loop is gone, nobody is waiting any more.
            with contextlib.suppress(Exception):
                anyio.from_thread.run_sync(event.set, token=job.token)
        elif abandoned and self.notify is not None:
            self.notify(self.key, count)

    def close(self) -> None:
        """End this key's threads: idle ones at once, busy ones when their handler returns."""
        with self._lock:
            for _ in range(self.threads):
                self._jobs.put(_STOP)

    def abandon(self, job: _Job) -> bool:
        """Mark the job abandoned; False if its thread had already ended or the job never
        started (it is then skipped: a call already answered is never run late)."""
        with self._lock:
            if job.done:
                return False
            if not job.started:
                job.skip = True
                return False
            job.abandoned = True
            self.abandoned += 1
            abandoned = self.abandoned
        if self.notify is not None:
            self.notify(self.key, abandoned)
        return True

    async def run(
        self, job: _Job, fn: Callable[[dict[str, Any], Any], Any], args: dict[str, Any], ctx: Any
    ) -> Any:
        """Run ``fn(args, ctx)`` on a worker thread and wait for it (cancellable)."""
        job.fn = fn
        job.args = (args, ctx)
        job.context = contextvars.copy_context()
        job.event = event = anyio.Event()
        job.token = anyio.lowlevel.current_token()
        with self._lock:
            self._jobs.put(job)
            spawn = self.threads < self.live
            if spawn:
                self.threads += 1
        if spawn:
            SPAWNER.request(self)
        await event.wait()
        if job.error is not None:
            raise job.error
        return job.result


class WorkerPools:
    """One :class:`KeyWorkers` per breaker key, created on first use."""

    def __init__(
        self,
        max_threads_for: Callable[[str], int],
        on_change: Callable[[str, int], None] | None = None,
    ) -> None:
        # on_change(key, abandoned): a key's count of abandoned threads changed (possibly
        # on the ending worker thread)
        self._max_threads_for = max_threads_for
        self.on_change = on_change
        self._pools: dict[str, KeyWorkers] = {}

    def get(self, key: str) -> KeyWorkers:
        pool = self._pools.get(key)
        if pool is None:
            pool = KeyWorkers(key, self._max_threads_for(key), self.on_change)
            self._pools[key] = pool
        return pool

    def close(self) -> None:
        """End every key's threads (:meth:`KeyWorkers.close`)."""
        for pool in self._pools.values():
            pool.close()

    def abandoned(self) -> dict[str, int]:
        return {key: pool.abandoned for key, pool in self._pools.items()}

    def live(self) -> dict[str, int]:
        return {key: pool.live for key, pool in self._pools.items()}
