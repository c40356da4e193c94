"""The host's side: one bounded pool of worker processes per breaker key (see
:mod:`toolrelay.isolation`)."""

from __future__ import annotations

import contextlib
import logging
import os
import queue
import signal
import socket
import time
from collections.abc import Callable, Collection
from dataclasses import dataclass, field
from typing import Any

import anyio

from ..workers import Spawner
from .wire import frame, receive, send
from .worker import start_context, worker_main

log = logging.getLogger("toolrelay")

IDLE_S = 30.0
"""A worker process with no call for this long exits."""
KILL_WAIT_S = 1.0
"""How long a call waits (shielded) for a killed worker to be gone before it answers; one
still there after it (stuck in the kernel) is reaped later and keeps its place until then."""


BASE_ENV = frozenset(
    {"PATH", "HOME", "USER", "LOGNAME", "LANG", "LC_ALL", "LC_CTYPE", "TZ", "TMPDIR"}
)
"""The host's environment variables a worker process gets, with the ``env`` names of its
pool (``isolation_env``); no other (the admin token, credentials) reaches it."""


def _kill(process: Any) -> None:
    """SIGKILL a worker's process group (the worker and whatever its handlers started), or
    the worker alone if its group is not made yet (then it has started nothing)."""
    with contextlib.suppress(OSError, ValueError):
        os.killpg(process.pid, signal.SIGKILL)
    with contextlib.suppress(OSError, ValueError):
        process.kill()


class PoolFull(Exception):
    """Every worker process of the key is busy."""


class StartFailed(Exception):
    """No worker process could be started."""


class WorkerCrashed(Exception):
    """The worker process ended without answering (a crash, ``os._exit``, a kill)."""

    def __init__(self, exitcode: int | None) -> None:
        super().__init__(exitcode)
        self.exitcode = exitcode

    @property
    def how(self) -> str:
        code = self.exitcode
        if code is None:
            return "ended"
        if code < 0:
            try:
                return f"was killed by {signal.Signals(-code).name}"
            except ValueError:
                return f"was killed by signal {-code}"
        return f"exited with status {code}"


class WorkerRaised(Exception):
    """The handler raised an exception (not a ``ToolError``) in its worker process."""

    def __init__(self, type_name: str, details: str) -> None:
        super().__init__(type_name)
        self.type_name = type_name
        self.details = details
        """The formatted traceback, unredacted: redact it before it goes anywhere."""


_CONTEXT: Any = None
_SPAWNER = Spawner("toolrelay-process-spawner")
"""Starts worker processes, fair between keys. Not the worker threads' spawner: a process
start (and the forkserver's, the first time) would hold up thread starts of other keys."""


class _Worker:
    """One worker process, as the host holds it."""

    __slots__ = ("burial", "child", "closed", "exitcode", "idle_since", "process", "sock",
                 "started")  # fmt: skip

    def __init__(self) -> None:
        self.sock, self.child = socket.socketpair()
        self.sock.setblocking(False)
        self.process: Any = None
        """Set by the spawner before it says "started"."""
        self.started = False
        self.closed = False
        self.exitcode: int | None = None
        self.idle_since = 0.0
        self.burial: anyio.Event | None = None
        """Set while a task waits for the process to end (others wait for that task)."""

    def gone(self) -> bool:
        """Has this idle worker left (it said "idle", or its socket closed)?"""
        if not self.started:
            return False
        try:
            self.sock.recv(1, socket.MSG_PEEK)  # data or the end of the stream
        except BlockingIOError:
            return False
        except OSError:
            pass
        return True


class ProcessPool:
    """The worker processes of one breaker key. Used from the event loop only, except
    :meth:`_spawn` (on the spawner thread), which touches only the start queue and the
    worker it starts. A worker gets the host's variables named in :data:`BASE_ENV` and
    ``env``; a reply frame over ``max_frame_bytes`` is refused by its header."""

    def __init__(
        self,
        key: str,
        max_processes: int,
        env: Collection[str] = (),
        max_frame_bytes: int | None = None,
    ) -> None:
        self.key = key
        self.max_processes = max_processes
        self.env = BASE_ENV | set(env)
        self.max_frame_bytes = max_frame_bytes
        self.processes = 0
        """Workers started or starting and not yet gone (idle ones included): the places."""
        self.killed = 0
        """Workers killed at a deadline or a cancellation, so far."""
        self._workers: set[_Worker] = set()
        self._idle: list[_Worker] = []
        """Oldest at the bottom, most recently used at the top (taken first)."""
        self._dying: list[_Worker] = []
        self._starts: queue.SimpleQueue[tuple[_Worker, float]] = queue.SimpleQueue()

    # -- on the spawner thread ------------------------------------------------------------
    def _spawn(self) -> None:
        global _CONTEXT
        worker, idle_s = self._starts.get_nowait()
        try:
            if _CONTEXT is None:
                _CONTEXT = start_context()
            env = {name: value for name, value in os.environ.items() if name in self.env}
            process = _CONTEXT.Process(
                target=worker_main,
                args=(worker.child, idle_s, env),
                name=f"toolrelay-process[{self.key}]",
                daemon=True,
            )
            process.start()
            worker.process = process
            with contextlib.suppress(OSError):  # dropped meanwhile (aclose): it ends by itself
                worker.child.sendall(frame(("started", process.pid)))
        except Exception:
            log.warning("toolrelay: could not start a worker process for %r", self.key,
                        exc_info=True)  # fmt: skip
        finally:
            worker.child.close()  # the waiting call reads "started", or the end of the socket

    # -- on the event loop ----------------------------------------------------------------
    async def call(
        self, message: bytes, on_kill: Callable[[], None] | None = None
    ) -> tuple[Any, ...]:
        """Run one call (:func:`encode_call`) in a worker process and return its reply:
        ``("ok", result)``, ``("tool_error", message, error_type, retryable,
        counts_as_failure, retry_after_s)``, ``("raised", type_name, traceback)``,
        ``("unpicklable", type_name)`` or ``("too_large", size, max_frame_bytes)`` (the
        worker, killed, is gone).

        Cancellable: a worker already given the call is then killed, and gone, before the
        cancellation goes on (``on_kill`` is called). Raises :class:`PoolFull`,
        :class:`StartFailed` or :class:`WorkerCrashed`."""
        while True:
            worker = self._take()
            if not worker.started:
                await self._started(worker)
            reply: Any = None
            answered = False
            try:
                # A worker gone before it read the call may still have said "idle": the
                # reply is read even when sending failed.
                await send(worker.sock, message)
                reply = await receive(worker.sock, self.max_frame_bytes)
                answered = True
            finally:
                if not answered:  # cancelled, at the deadline or by the host
                    await self._bury(worker, kill=True)
                    self.killed += 1
                    if on_kill is not None:
                        on_kill()
            if reply is None:
                raise WorkerCrashed(await self._bury(worker, kill=False))
            if reply[0] == "idle":  # it left before reading the call, which never ran
                await self._bury(worker, kill=False)
                continue
            if reply[0] == "too_large":  # the rest of the frame is never read
                await self._bury(worker, kill=True)
                return tuple(reply)
            worker.idle_since = time.monotonic()
            self._idle.append(worker)
            return tuple(reply)

    def _take(self) -> _Worker:
        self._reap()
        while self._idle:
            worker = self._idle.pop()
            if not worker.gone():
                return worker
            self._close(worker)  # it exited by itself: forkserver has reaped it
        if self.processes >= self.max_processes:
            raise PoolFull
        worker = _Worker()
        self.processes += 1
        self._workers.add(worker)
        self._starts.put((worker, IDLE_S))
        _SPAWNER.request(self)
        return worker

    async def _started(self, worker: _Worker) -> None:
        """Wait for the spawner's word that the worker's process runs."""
        heard = False
        try:
            started = await receive(worker.sock)
            heard = True
        finally:
            if not heard and not worker.closed:
                # cancelled while it starts: nothing was sent, a later call will use it
                worker.idle_since = time.monotonic()
                self._idle.append(worker)
        if started is None:
            self._close(worker)
            raise StartFailed
        worker.started = True

    def _reap(self) -> None:
        """Drop workers whose slow death has ended, and idle ones past :data:`IDLE_S`
        (their process has exited by itself)."""
        for worker in list(self._dying):
            if worker.closed or worker.process.exitcode is not None:
                self._dying.remove(worker)
                self._close(worker)
        horizon = time.monotonic() - IDLE_S - 1.0
        while self._idle and self._idle[0].idle_since < horizon:  # the oldest at the bottom
            self._close(self._idle.pop(0))

    def _close(self, worker: _Worker) -> None:
        """Forget a worker whose process has ended (or will, now that its socket is closed)."""
        if worker.closed:
            return
        worker.closed = True
        anyio.notify_closing(worker.sock)  # a task waiting on it wakes up (aclose)
        worker.sock.close()  # (``child`` is the spawner's to close, always)
        self._workers.discard(worker)
        self.processes -= 1
        process = worker.process
        if process is not None:
            process.join(0)  # no waiting: multiprocessing forgets it once it has ended
            worker.exitcode = process.exitcode
            if worker.exitcode is not None:
                process.close()

    async def _bury(self, worker: _Worker, *, kill: bool) -> int | None:
        """Kill the worker if asked, wait (shielded) until it is gone, and drop it; its
        exit code. Two tasks may bury one worker (``aclose`` and the call it was running):
        the second waits for the first."""
        process = worker.process
        if kill and process is not None and not worker.closed:
            _kill(process)
        if worker.closed or process is None:
            self._close(worker)
            return worker.exitcode
        with anyio.CancelScope(shield=True):
            if worker.burial is not None:
                await worker.burial.wait()
                return worker.exitcode
            worker.burial = anyio.Event()
            try:
                with anyio.move_on_after(KILL_WAIT_S):
                    await anyio.wait_readable(process.sentinel)
            finally:
                worker.burial.set()
        if process.exitcode is None:  # stuck in the kernel: a later call reaps it
            log.warning("toolrelay: worker process %s of %r is slow to end", process.pid, self.key)
            worker.burial = None
            if worker not in self._dying:
                self._dying.append(worker)
            return None
        self._close(worker)
        return worker.exitcode

    async def aclose(self) -> None:
        """Kill every worker (idle, busy or starting) and wait until they are gone."""
        self._idle, self._dying = [], []
        workers = list(self._workers)
        for worker in workers:  # all at once, then wait for each: they end in parallel
            if worker.process is not None and not worker.closed:
                _kill(worker.process)
        for worker in workers:
            await self._bury(worker, kill=False)


@dataclass(eq=False)
class ProcessPools:
    """One :class:`ProcessPool` per breaker key, created on first use."""

    max_processes_for: Callable[[str], int]
    env: Collection[str] = ()
    max_frame_bytes: int | None = None
    _pools: dict[str, ProcessPool] = field(default_factory=dict)

    def get(self, key: str) -> ProcessPool:
        pool = self._pools.get(key)
        if pool is None:
            pool = self._pools[key] = ProcessPool(
                key, self.max_processes_for(key), self.env, self.max_frame_bytes
            )
        return pool

    def processes(self) -> dict[str, int]:
        """Worker processes per key (starting, busy, idle or slow to die)."""
        return {key: pool.processes for key, pool in self._pools.items()}

    def killed(self) -> dict[str, int]:
        """Worker processes killed at a deadline or a cancellation, per key, so far."""
        return {key: pool.killed for key, pool in self._pools.items()}

    async def aclose(self) -> None:
        """Kill every worker process and wait until they are gone."""
        for pool in self._pools.values():
            await pool.aclose()
