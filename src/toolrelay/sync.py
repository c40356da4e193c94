"""``SyncDispatcher``: the dispatcher for threads (Flask, Django, Celery, scripts).

One event loop runs in a daemon thread behind an anyio ``BlockingPortal``; every call from
any thread becomes a task on that loop, so the wrapped :class:`~toolrelay.Dispatcher`'s
loop-bound parts (bulkhead semaphores, model slot locks, plugins' connections) only ever see
one loop. See ``docs/sync.md``.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import logging
import os
import queue
import threading
import weakref
from collections.abc import Awaitable, Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from functools import partial
from types import TracebackType
from typing import Any, TypeVar

import anyio
from anyio.from_thread import BlockingPortal

from .config import Settings
from .contract import AuthContext
from .dispatcher import Dispatcher
from .formats import Unavailable
from .registry import ToolRegistry
from .result import ToolCall, ToolResult
from .slot import ModelSlot, SlotLease

__all__ = ["CallCancelled", "DispatcherClosed", "SyncDispatcher", "SyncModelSlot"]

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


class _Loop:
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
        try:
            future = self.portal.start_task_soon(fn)
        except RuntimeError:  # the portal stopped since the check
            raise DispatcherClosed("the SyncDispatcher is closed") from None
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


class SyncModelSlot:
    """A :class:`~toolrelay.ModelSlot` for threads, from :meth:`SyncDispatcher.model_slot`.

    ``with slot.hold() as lease:`` waits (blocking) for the slot, then hands out a lease to
    pass as ``dispatch(..., slot=lease)``: every tool deadline is capped by the budget left.
    """

    __slots__ = ("_loop", "slot")

    def __init__(self, loop: _Loop, slot: ModelSlot) -> None:
        self._loop = loop
        self.slot = slot
        """The async slot underneath (its lock lives on the SyncDispatcher's loop)."""

    @property
    def budget_s(self) -> float:
        return self.slot.budget_s

    @contextmanager
    def hold(self, budget_s: float | None = None) -> Iterator[SlotLease]:
        """Hold the slot for one turn; raises :class:`CallCancelled` if ``close()`` ends the
        wait, :class:`DispatcherClosed` if already closed."""
        leased: concurrent.futures.Future[SlotLease] = concurrent.futures.Future()
        task = self._loop.submit(partial(_hold, self.slot, budget_s, leased))
        try:
            either: list[concurrent.futures.Future[Any]] = [leased, task]
            concurrent.futures.wait(either, return_when=concurrent.futures.FIRST_COMPLETED)
            if not leased.done() or self._loop.closed:  # no hold, or granted as close() ran
                self._loop.result(task)  # raises why: CallCancelled or the hold's error
            yield leased.result()
        finally:
            task.cancel()  # releases the slot on the loop
            self._loop.forget(task)


async def _on_loop(fn: Callable[[], T]) -> T:
    return fn()


async def _hold(
    slot: ModelSlot, budget_s: float | None, leased: concurrent.futures.Future[SlotLease]
) -> None:
    async with slot.hold(budget_s) as lease:
        leased.set_result(lease)
        await anyio.sleep_forever()


class SyncDispatcher:
    """A :class:`~toolrelay.Dispatcher` callable from any thread.

    ``SyncDispatcher(dispatcher)`` starts one event loop in a daemon thread (``backend``
    ``"asyncio"`` or ``"trio"``, as :func:`anyio.run` takes them) and takes the dispatcher
    over: from now on it runs only on that loop, and :meth:`close` closes it. Every method
    may be called from any number of threads at once; each blocks its caller until the
    answer. Results are the same :class:`~toolrelay.ToolResult` s as the async API's.
    """

    def __init__(
        self,
        dispatcher: Dispatcher,
        *,
        backend: str = "asyncio",
        backend_options: Mapping[str, Any] | None = None,
    ) -> None:
        self.dispatcher = dispatcher
        """The wrapped dispatcher: read its ``breakers``, ``telemetry`` or ``registry`` from
        any thread; never await its coroutines on another loop."""
        self._loop = _Loop(dispatcher, backend, backend_options)
        # Dropped or still open at interpreter exit: closed like close() would.
        weakref.finalize(self, self._loop.collected)

    @classmethod
    def from_config(
        cls,
        source: str | os.PathLike[str] | Settings,
        *,
        registry: ToolRegistry | None = None,
        backend: str = "asyncio",
        backend_options: Mapping[str, Any] | None = None,
        overrides: Mapping[str, Any] | None = None,
        **live: Any,
    ) -> SyncDispatcher:
        """:meth:`Dispatcher.from_config <toolrelay.Dispatcher.from_config>`, wrapped."""
        dispatcher = Dispatcher.from_config(source, registry=registry, overrides=overrides, **live)
        return cls(dispatcher, backend=backend, backend_options=backend_options)

    @property
    def closed(self) -> bool:
        return self._loop.closed

    @property
    def portal(self) -> BlockingPortal:
        """The loop's ``BlockingPortal``, so a sync host's framework shares this dispatcher:
        ``langchain_tools(relay.dispatcher, portal=relay.portal)``. ``close()`` stops it."""
        return self._loop.portal

    def dispatch(
        self,
        name: str,
        raw_args: str | bytes | Mapping[str, Any] | None = "{}",
        ctx: AuthContext | None = None,
        *,
        profile: str | None = None,
        call_id: str | None = None,
        slot: SlotLease | None = None,
    ) -> ToolResult:
        """Run one tool call and wait for its answer (see ``Dispatcher.dispatch``).

        Raises only :class:`DispatcherClosed` (closed before the call) or
        :class:`CallCancelled` (closed during it).
        """
        run = partial(
            self.dispatcher.dispatch,
            name,
            raw_args,
            ctx,
            profile=profile,
            call_id=call_id,
            slot=slot,
        )
        return self._loop.call(run)

    def dispatch_many(
        self,
        calls: Sequence[ToolCall],
        ctx: AuthContext | None = None,
        *,
        profile: str | None = None,
        slot: SlotLease | None = None,
        on_result: Callable[[int, ToolResult], Any] | None = None,
    ) -> list[ToolResult]:
        """Run calls concurrently, each with its own deadline; results in input order.

        ``on_result(index, result)`` runs in the calling thread as each call is answered
        (never on the event loop); an exception it raises is logged and ignored.
        """
        if on_result is None:
            return self._loop.call(
                partial(self.dispatcher.dispatch_many, calls, ctx, profile=profile, slot=slot)
            )
        answers: queue.SimpleQueue[tuple[int, ToolResult] | None] = queue.SimpleQueue()
        task = self._loop.submit(
            partial(
                self.dispatcher.dispatch_many,
                calls,
                ctx,
                profile=profile,
                slot=slot,
                on_result=lambda index, result: answers.put((index, result)),
            )
        )
        task.add_done_callback(lambda _: answers.put(None))  # after every answer
        try:
            while (answer := answers.get()) is not None:
                try:
                    on_result(*answer)
                except Exception:
                    log.exception("toolrelay: on_result raised for call %d", answer[0])
        finally:
            if not task.done():
                task.cancel()
        return self._loop.result(task)

    def specs(
        self,
        profile: str | None = None,
        format: str = "openai",
        *,
        unavailable: Unavailable = "hide",
    ) -> list[dict[str, Any]]:
        """The tools a caller with ``profile`` may call, in ``format`` (see
        ``Dispatcher.specs``); read on the loop, like every call."""
        return self._loop.call(
            partial(
                _on_loop, partial(self.dispatcher.specs, profile, format, unavailable=unavailable)
            )
        )

    def model_slot(self, budget_s: float = 30.0) -> SyncModelSlot:
        """A model slot for threads, recorded by this dispatcher's telemetry."""
        return SyncModelSlot(
            self._loop,
            self._loop.call(partial(_on_loop, partial(self.dispatcher.model_slot, budget_s))),
        )

    def close(self, timeout_s: float = CLOSE_TIMEOUT_S) -> None:
        """Cancel every call in flight (its caller gets :class:`CallCancelled` at once),
        close the dispatcher (plugins' ``aclose()``, breaker storage) on its loop, and stop
        the loop, waiting at most ``timeout_s``. Idempotent; any thread but the loop's own."""
        self._loop.close(timeout_s)

    def __enter__(self) -> SyncDispatcher:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()
