"""The event loop thread behind a ``SyncDispatcher``: its portal and the calls in flight,
and how a call from another thread is started, awaited, interrupted and closed."""

from __future__ import annotations

import concurrent.futures
import contextlib
import logging
import threading
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, TypeVar

import anyio
from anyio.from_thread import BlockingPortal

from .dispatcher import Dispatcher

log = logging.getLogger("toolrelay")

T = TypeVar("T")

CLOSE_TIMEOUT_S = 5.0
"""How long :meth:`SyncDispatcher.close` (and closing at garbage collection or interpreter
exit) waits for the loop to cancel its calls, close the dispatcher and end."""


class DispatcherClosed(RuntimeError):
    """The :class:`SyncDispatcher` is closed: the call was not run."""


class CallCancelled(DispatcherClosed):
    """``close()`` cancelled this call while it was in flight: there is no answer, and a tool
    with effects may or may not have run."""


class _Ticket:
    """A call's task, reachable before the portal hands out its future."""

    __slots__ = ("abandoned", "scope")

    def __init__(self) -> None:
        self.abandoned = False
        self.scope: anyio.CancelScope | None = None

    async def run(self, fn: Callable[[], Awaitable[T]]) -> T:
        try:
            with anyio.CancelScope() as self.scope:
                if self.abandoned:
                    self.scope.cancel()
                return await fn()
            raise CallCancelled("its caller was interrupted while the call started")
        finally:
            self.scope = None

    def abandon(self, portal: BlockingPortal) -> None:
        self.abandoned = True  # a task not started yet cancels itself
        scope = self.scope
        if scope is not None:  # a task started: cancelled on the loop
            with contextlib.suppress(RuntimeError):
                portal.call(scope.cancel)


class Loop:
    """The event loop thread, its portal and the calls in flight.

    Holds no reference to the :class:`SyncDispatcher`, so garbage collection and interpreter
    exit can close it.
    """

    def __init__(
        self, dispatcher: Dispatcher, backend: str, backend_options: Mapping[str, Any] | None
    ) -> None:
        self.dispatcher = dispatcher
        self.lock = threading.Lock()
        self.closed = False
        self.calls: set[concurrent.futures.Future[Any]] = set()
        self.budget_s = CLOSE_TIMEOUT_S
        ready: concurrent.futures.Future[BlockingPortal] = concurrent.futures.Future()
        # anyio's start_blocking_portal() joins its thread without a timeout; owning the
        # thread lets close() bound its wait.
        self.thread = threading.Thread(
            target=self._run,
            args=(ready, backend, dict(backend_options or {})),
            name="toolrelay-sync-loop",
            daemon=True,
        )
        self.thread.start()
        self.portal = ready.result()

    def _run(
        self,
        ready: concurrent.futures.Future[BlockingPortal],
        backend: str,
        backend_options: dict[str, Any],
    ) -> None:
        try:
            anyio.run(self._serve, ready, backend=backend, backend_options=backend_options)
        except BaseException as exc:
            if not ready.done():
                ready.set_exception(exc)
            else:
                log.exception("toolrelay: the SyncDispatcher's event loop failed")

    async def _serve(self, ready: concurrent.futures.Future[BlockingPortal]) -> None:
        async with BlockingPortal() as portal:
            ready.set_result(portal)
            await portal.sleep_until_stopped()
        # Every call has ended (answered or cancelled): close plugins and storage here, on
        # the loop they were used on.
        with anyio.move_on_after(self.budget_s):
            await self.dispatcher.aclose()

    def submit(self, fn: Callable[[], Awaitable[T]]) -> concurrent.futures.Future[T]:
        self.refuse_own_thread()
        if self.closed:
            raise DispatcherClosed("the SyncDispatcher is closed")
        ticket = _Ticket()
        try:  # the portal waits while the loop takes the task, which may start meanwhile
            future = self.portal.start_task_soon(ticket.run, fn)
        except RuntimeError:  # the portal stopped since the check
            raise DispatcherClosed("the SyncDispatcher is closed") from None
        except BaseException:  # an interrupt (Ctrl-C) during that wait: the task must end
            ticket.abandon(self.portal)
            raise
        with self.lock:
            late = self.closed
            if not late:
                self.calls.add(future)
        if late:
            future.cancel()
        return future

    def result(self, future: concurrent.futures.Future[T]) -> T:
        """Wait for a submitted call; if this thread stops waiting (an interrupt), so does
        the call."""
        try:
            return future.result()
        except concurrent.futures.CancelledError:
            raise CallCancelled(
                "the SyncDispatcher was closed while this call was in flight"
            ) from None
        finally:
            if not future.done():
                future.cancel()
            self.forget(future)

    def forget(self, future: concurrent.futures.Future[Any]) -> None:
        with self.lock:
            self.calls.discard(future)

    def call(self, fn: Callable[[], Awaitable[T]]) -> T:
        return self.result(self.submit(fn))

    def refuse_own_thread(self) -> None:
        if threading.current_thread() is self.thread:  # it would wait for itself
            raise RuntimeError(
                "a SyncDispatcher cannot be called from its own event loop (an async handler)"
            )

    def close(self, timeout_s: float) -> None:
        self.refuse_own_thread()
        first = self._begin_close(timeout_s)
        self.thread.join(timeout_s)
        if first and self.thread.is_alive():
            log.warning(
                "toolrelay: the SyncDispatcher's loop did not end within %.1f s of close() "
                "(a tool ignoring cancellation?); it is a daemon thread and is left behind",
                timeout_s,
            )

    def collected(self) -> None:
        """The SyncDispatcher was garbage collected or the interpreter is exiting (possibly
        on the loop's own thread, which then cannot wait for itself)."""
        if threading.current_thread() is self.thread:
            self._begin_close(CLOSE_TIMEOUT_S)
        else:
            self.close(CLOSE_TIMEOUT_S)

    def _begin_close(self, timeout_s: float) -> bool:
        """Refuse new calls, cancel those in flight, ask the loop to stop; False if that
        was done before."""
        with self.lock:
            if self.closed:
                return False
            self.closed = True
            calls, self.calls = self.calls, set()
        self.budget_s = timeout_s
        for future in calls:  # their callers get CallCancelled now, whatever the loop does
            future.cancel()
        # Stopping goes through the loop; a loop blocked by a misbehaving tool must not block
        # close(), so a helper thread asks and close() waits at most timeout_s.
        try:
            threading.Thread(target=self._stop, name="toolrelay-sync-stop", daemon=True).start()
        except RuntimeError:  # no new threads at interpreter shutdown (3.12+): ask from here
            self._stop()
        return True

    def _stop(self) -> None:
        with contextlib.suppress(RuntimeError):  # already stopped
            self.portal.call(self.portal.stop, True)
