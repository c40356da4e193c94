"""Process isolation for sync handlers: a bounded pool of worker processes per breaker key.

A tool declared ``isolation="process"`` runs in a worker process of its breaker key. At the
deadline (or when the host cancels the call) the process is killed (``SIGKILL``) and waited
for; the key's next call gets a fresh one. A thread cannot be stopped, a process can: nothing
of a hung handler is left behind.

- **Start.** Processes come from the standard library's ``forkserver`` (``spawn`` where it
  is missing): a single-threaded server process, started once per host process, that has
  imported toolrelay and forks a worker per request — fork safety without paying an
  interpreter start per worker. Starting is blocking, so a spawner thread of its own does
  it (a :class:`toolrelay.workers.Spawner`, fair between keys); the event loop only waits
  for the socket that says "started".
- **The function.** It travels by name (``module`` + ``qualname``, :class:`ProcessTarget`):
  a module-level function, imported by the worker on its first call and kept. A typed tool's
  caller is rebuilt in the worker from the same function.
- **Transport.** One ``socketpair`` per worker; length-prefixed pickles both ways. The
  parent's end is non-blocking and awaited with ``anyio.wait_readable``/``wait_writable``:
  the loop never blocks on a worker.
- **Size.** At most ``max_processes`` (the key's ``max_concurrent``) per key, started
  lazily, idle ones reused most-recent first. A worker idle for :data:`IDLE_S` says so and
  exits by itself (``forkserver`` reaps it); a worker whose host dies exits too (its watchdog
  thread sees the socket close).
- **Stop.** Killed at the deadline or cancellation, then waited for (at most
  :data:`KILL_WAIT_S`, shielded), so when the call is answered its process is gone.
"""

from __future__ import annotations

import contextlib
import importlib
import inspect
import logging
import multiprocessing
import os
import pickle
import queue
import select
import signal
import socket
import struct
import threading
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import anyio

from . import typed
from .contract import CURRENT_ATTEMPT, AuthContext, ToolError
from .workers import Spawner

__all__ = [
    "PoolFull",
    "ProcessPool",
    "ProcessPools",
    "ProcessTarget",
    "StartFailed",
    "WorkerCrashed",
    "WorkerRaised",
    "encode_call",
    "target_of",
]

log = logging.getLogger("toolrelay")

IDLE_S = 30.0
"""A worker process with no call for this long exits."""
KILL_WAIT_S = 1.0
"""How long a call waits (shielded) for a killed worker to be gone before it answers; one
still there after it (stuck in the kernel) is reaped later and keeps its place until then."""

_HEADER = struct.Struct("!Q")
_PROTOCOL = pickle.HIGHEST_PROTOCOL


# -- what runs ----------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class ProcessTarget:
    """A handler as a worker process finds it: by module and qualified name."""

    module: str
    qualname: str
    typed: bool
    """A typed tool: the worker builds its ``(args, ctx)`` caller from the function."""
    tool: str


def target_of(fn: Callable[..., Any], tool: str, *, typed: bool) -> ProcessTarget:
    """The :class:`ProcessTarget` of a module-level function; :class:`ValueError` (a reason
    to complete "isolation='process' …") for anything a worker could not import by name."""
    if not inspect.isfunction(fn):
        raise ValueError(
            f"needs a module-level function, and {type(fn).__name__} {fn!r:.60} is not one"
        )
    module = getattr(fn, "__module__", None)
    qualname = fn.__qualname__
    if not module or "<" in qualname:  # <lambda>, <locals>
        raise ValueError(
            f"needs a module-level function a worker process can import by name, "
            f"and {qualname} is not defined at the top level of its module"
        )
    return ProcessTarget(module, qualname, typed, tool)


@dataclass(frozen=True, slots=True)
class _Attempt:
    """What ``CallContext.current()`` reads in the worker (an ``Invocation`` stand-in)."""

    name: str
    call_id: str | None
    attempts: int
    key: str
    deadline: float


# -- what can go wrong ----------------------------------------------------------------------
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


# -- framing --------------------------------------------------------------------------------
def _frame(message: Any) -> bytes:
    payload = pickle.dumps(message, _PROTOCOL)
    return _HEADER.pack(len(payload)) + payload


def _recv_exact_blocking(sock: socket.socket, size: int) -> bytes | None:
    buf = bytearray(size)
    view = memoryview(buf)
    got = 0
    while got < size:
        n = sock.recv_into(view[got:])
        if n == 0:
            return None
        got += n
    return bytes(buf)


async def _recv_exact(sock: socket.socket, size: int) -> bytes | None:
    buf = bytearray(size)
    view = memoryview(buf)
    got = 0
    while got < size:
        try:
            n = sock.recv_into(view[got:])
        except BlockingIOError:
            try:
                await anyio.wait_readable(sock)
            except anyio.ClosedResourceError:  # dropped by aclose()
                return None
            continue
        except OSError:  # ECONNRESET: the worker is gone; EBADF: dropped
            return None
        if n == 0:
            return None
        got += n
    return bytes(buf)


async def _receive(sock: socket.socket) -> Any:
    """The next message from a worker; ``None`` when it has gone away."""
    header = await _recv_exact(sock, _HEADER.size)
    if header is None:
        return None
    payload = await _recv_exact(sock, _HEADER.unpack(header)[0])
    if payload is None:
        return None
    try:
        return pickle.loads(payload)
    except Exception:  # a result of a class this process cannot rebuild
        return ("unpicklable", "an object")


async def _send(sock: socket.socket, data: bytes) -> bool:
    """Send a whole frame; False if the worker is gone."""
    view = memoryview(data)
    while view:
        try:
            n = sock.send(view)
        except BlockingIOError:
            try:
                await anyio.wait_writable(sock)
            except anyio.ClosedResourceError:  # dropped by aclose()
                return False
            continue
        except OSError:  # EPIPE: the worker is gone (its last words are still readable)
            return False
        view = view[n:]
    return True


# -- the worker process -----------------------------------------------------------------------
def _watch(sock: socket.socket) -> None:
    """In the worker: end the process when the host's end of the socket closes (the host
    died, or dropped the worker), even while a handler hangs."""
    poller = select.poll()
    poller.register(sock.fileno(), select.POLLHUP)
    while True:
        for _, mask in poller.poll():
            if mask & (select.POLLHUP | select.POLLERR | select.POLLNVAL):
                os._exit(0)


def _load(target: ProcessTarget) -> Callable[[dict[str, Any], AuthContext], Any]:
    obj: Any = importlib.import_module(target.module)
    for part in target.qualname.split("."):
        obj = getattr(obj, part)
    if target.typed:
        obj = typed.typed_tool(obj, target.tool, None).call
    fn: Callable[[dict[str, Any], AuthContext], Any] = obj
    return fn


def _run(handlers: dict[ProcessTarget, Callable[..., Any]], payload: bytes) -> Any:
    try:
        target, args, ctx, attempt = pickle.loads(payload)
        fn = handlers.get(target)
        if fn is None:
            fn = handlers[target] = _load(target)
    except Exception as exc:  # a module that cannot be imported here, say
        details = "".join(traceback.format_exception(exc))
        return ("raised", type(exc).__name__, f"the worker could not load the call\n{details}")
    token = CURRENT_ATTEMPT.set([attempt, attempt.deadline])
    try:
        return ("ok", fn(args, ctx))
    except ToolError as exc:
        return ("tool_error", exc.message, exc.error_type.value, exc.retryable,
                exc.counts_as_failure, exc.retry_after_s)  # fmt: skip
    except Exception as exc:
        return ("raised", type(exc).__name__, "".join(traceback.format_exception(exc)))
    finally:
        CURRENT_ATTEMPT.reset(token)


def _worker_main(sock: socket.socket, idle_s: float) -> None:
    """A worker process: run calls until idle for ``idle_s`` or the host goes away."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a terminal's Ctrl-C is the host's to handle
    sock.setblocking(True)
    threading.Thread(target=_watch, args=(sock,), name="toolrelay-watch", daemon=True).start()
    handlers: dict[ProcessTarget, Callable[..., Any]] = {}
    poller = select.poll()
    poller.register(sock.fileno(), select.POLLIN)
    try:
        while True:
            if not poller.poll(idle_s * 1000):
                # A call sent from now on is left unread: the host reads "idle" and knows
                # that call never ran.
                sock.sendall(_frame(("idle",)))
                break
            header = _recv_exact_blocking(sock, _HEADER.size)
            if header is None:
                break
            payload = _recv_exact_blocking(sock, _HEADER.unpack(header)[0])
            if payload is None:
                break
            reply = _run(handlers, payload)
            try:
                data = _frame(reply)
            except Exception:  # the result cannot leave the process: it is no JSON either
                data = _frame(("unpicklable", type(reply[1]).__name__))
            sock.sendall(data)
    except OSError:  # the host went away
        pass
    os._exit(0)


def _context() -> Any:
    methods = multiprocessing.get_all_start_methods()
    if "forkserver" not in methods:
        return multiprocessing.get_context("spawn")
    context = multiprocessing.get_context("forkserver")
    # Workers are forked from a server that has imported toolrelay (and the main script,
    # as multiprocessing does by default); this takes effect if the server is not running.
    context.set_forkserver_preload(["__main__", __name__])
    return context


_CONTEXT: Any = None
_SPAWNER = Spawner("toolrelay-process-spawner")
"""Starts worker processes, fair between keys. Not the worker threads' spawner: a process
start (and the forkserver's, the first time) would hold up thread starts of other keys."""


# -- the host's side ----------------------------------------------------------------------------
def encode_call(
    target: ProcessTarget,
    args: dict[str, Any],
    ctx: AuthContext,
    *,
    call_id: str | None,
    attempt: int,
    key: str,
    deadline: float,
) -> bytes:
    """One call as a worker receives it (``deadline`` on ``time.monotonic()``'s clock,
    which is the same in every process). Raises what ``pickle`` raises for a value that
    cannot be sent (an ``AuthContext`` attribute holding a lock, say)."""
    return _frame((target, args, ctx, _Attempt(target.tool, call_id, attempt, key, deadline)))


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
    worker it starts."""

    def __init__(self, key: str, max_processes: int) -> None:
        self.key = key
        self.max_processes = max_processes
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
                _CONTEXT = _context()
            process = _CONTEXT.Process(
                target=_worker_main,
                args=(worker.child, idle_s),
                name=f"toolrelay-process[{self.key}]",
                daemon=True,
            )
            process.start()
            worker.process = process
            with contextlib.suppress(OSError):  # dropped meanwhile (aclose): it ends by itself
                worker.child.sendall(_frame(("started", process.pid)))
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
        counts_as_failure, retry_after_s)``, ``("raised", type_name, traceback)`` or
        ``("unpicklable", type_name)``.

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
                await _send(worker.sock, message)
                reply = await _receive(worker.sock)
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
            started = await _receive(worker.sock)
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
        if self._idle and self._idle[0].idle_since < horizon:
            stale = [w for w in self._idle if w.idle_since < horizon]
            self._idle = [w for w in self._idle if w.idle_since >= horizon]
            for worker in stale:
                self._close(worker)

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
            with contextlib.suppress(OSError, ValueError):
                process.kill()
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
                with contextlib.suppress(OSError, ValueError):
                    worker.process.kill()
        for worker in workers:
            await self._bury(worker, kill=False)


class ProcessPools:
    """One :class:`ProcessPool` per breaker key, created on first use."""

    def __init__(self, max_processes_for: Callable[[str], int]) -> None:
        self._max_processes_for = max_processes_for
        self._pools: dict[str, ProcessPool] = {}

    def get(self, key: str) -> ProcessPool:
        pool = self._pools.get(key)
        if pool is None:
            pool = self._pools[key] = ProcessPool(key, self._max_processes_for(key))
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
