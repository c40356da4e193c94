"""Worker threads for sync handlers: a bounded set per breaker key.

A thread abandoned at its deadline keeps its place until it really ends, so a key whose
handlers hang sheds load (``overloaded``) instead of spawning threads without bound, and
never takes threads from another key. anyio's ``CapacityLimiter`` alone cannot promise
that: on asyncio it hands the token back when a thread is abandoned (trio does not).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import anyio
import anyio.to_thread

__all__ = ["KeyWorkers", "WorkerPools"]


class _Job:
    __slots__ = ("abandoned", "done")

    def __init__(self) -> None:
        self.abandoned = False
        self.done = False


class KeyWorkers:
    """The worker threads of one breaker key."""

    def __init__(
        self, key: str, max_threads: int, notify: Callable[[str, int], None] | None = None
    ) -> None:
        self.key = key
        self.notify = notify
        self.max_threads = max_threads
        self.live = 0
        self.abandoned = 0
        self._lock = threading.Lock()
        self._limiter: anyio.CapacityLimiter | None = None

    def try_start(self) -> _Job | None:
        with self._lock:
            if self.live >= self.max_threads:
                return None
            self.live += 1
        return _Job()

    def _finished(self, job: _Job) -> None:
        with self._lock:
            job.done = True
            self.live -= 1
            if job.abandoned:
                self.abandoned -= 1
                abandoned = self.abandoned
            else:
                return
        if self.notify is not None:
            self.notify(self.key, abandoned)

    def abandon(self, job: _Job) -> bool:
        """Mark the job abandoned; False if its thread had already ended."""
        with self._lock:
            if job.done:
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
        if self._limiter is None:
            self._limiter = anyio.CapacityLimiter(self.max_threads)

        def work() -> Any:
            try:
                return fn(args, ctx)
            finally:
                self._finished(job)

        return await anyio.to_thread.run_sync(work, abandon_on_cancel=True, limiter=self._limiter)


class WorkerPools:
    """One :class:`KeyWorkers` per breaker key, created on first use."""

    def __init__(
        self,
        max_threads_for: Callable[[str], int],
        on_change: Callable[[str, int], None] | None = None,
    ) -> None:
        """``on_change(key, abandoned)`` runs when a key's count of abandoned threads
        changes (possibly on the ending worker thread)."""
        self._max_threads_for = max_threads_for
        self.on_change = on_change
        self._pools: dict[str, KeyWorkers] = {}

    def get(self, key: str) -> KeyWorkers:
        pool = self._pools.get(key)
        if pool is None:
            pool = KeyWorkers(key, self._max_threads_for(key), self.on_change)
            self._pools[key] = pool
        return pool

    def abandoned(self) -> dict[str, int]:
        return {key: pool.abandoned for key, pool in self._pools.items()}

    def live(self) -> dict[str, int]:
        return {key: pool.live for key, pool in self._pools.items()}
