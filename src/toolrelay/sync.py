"""``SyncDispatcher``: the dispatcher for threads (Flask, Django, Celery, scripts).

One event loop runs in a daemon thread behind an anyio ``BlockingPortal``; every call from
any thread becomes a task on that loop, so the wrapped :class:`~toolrelay.Dispatcher`'s
loop-bound parts (bulkhead semaphores, model slot locks, plugins' connections) only ever see
one loop. See ``docs/sync.md``.
"""

from __future__ import annotations

import concurrent.futures
import logging
import os
import queue
import weakref
from collections.abc import Callable, Iterator, Mapping, Sequence
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
from .loop_thread import CLOSE_TIMEOUT_S, CallCancelled, DispatcherClosed, Loop
from .registry import ToolRegistry
from .result import ToolCall, ToolResult
from .slot import ModelSlot, SlotLease

__all__ = [
    "CLOSE_TIMEOUT_S",
    "CallCancelled",
    "DispatcherClosed",
    "SyncDispatcher",
    "SyncModelSlot",
]

log = logging.getLogger("toolrelay")

T = TypeVar("T")


class SyncModelSlot:
    """A :class:`~toolrelay.ModelSlot` for threads, from :meth:`SyncDispatcher.model_slot`.

    ``with slot.hold() as lease:`` waits (blocking) for the slot, then hands out a lease to
    pass as ``dispatch(..., slot=lease)``: every tool deadline is capped by the budget left.
    """

    __slots__ = ("_loop", "slot")

    def __init__(self, loop: Loop, slot: ModelSlot) -> None:
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
        self._loop = Loop(dispatcher, backend, backend_options)
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
