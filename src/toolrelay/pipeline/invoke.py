"""Invoke (terminal): run the handler, and turn whatever happens into an outcome.

Async handlers are awaited inside a cancel scope with the call's deadline; at the deadline
they are cancelled (their ``finally`` runs). Sync handlers run on a worker thread of their
breaker key; at the deadline the answer comes back at once and the thread is abandoned
(counted, and still occupying its key's place until it ends). Sync handlers declared
``isolation="process"`` run in a worker process of their key, killed at the deadline
(``toolrelay.isolation``).
"""

from __future__ import annotations

import logging
import time
import types
from collections.abc import Callable, Coroutine, Generator
from time import perf_counter
from typing import Any

import anyio

from .. import isolation
from ..contract import CURRENT_ATTEMPT, ErrorType, ToolError
from ..events import LoopBlocked, WorkerAbandoned, WorkerKilled
from ..outcome import (
    Outcome,
    Verdict,
    error_outcome,
    failure,
    raised_outcome,
    timeout_outcome,
    unexpected,
)
from ..redact import Redactor, describe_exception
from ..registry import CompiledTool
from ..workers import WorkerPools
from . import Invocation

_UNTIMED = [0.0]  # an untimed call's held time: never written
SUCCESS = Verdict.SUCCESS  # an answer built positionally: ~0.1 µs less than by keyword

log = logging.getLogger("toolrelay")

BLOCKING_STEP_S = 0.02
"""A step of an async handler (from one ``await`` that suspends to the next) that holds the
event loop this long is a blocking call, counted in ``toolrelay_loop_blocked_seconds_total``."""


@types.coroutine
def _stepped(coro: Coroutine[Any, Any, Any], held: list[float]) -> Generator[Any, Any, Any]:
    """``await coro``, adding each step (from one suspension to the next) that held the
    loop ``BLOCKING_STEP_S`` or more to ``held[0]``. As ``await`` does, what the loop sends
    or throws (a cancellation) goes to ``coro``."""
    step: Callable[[Any], Any] = coro.send
    value: Any = None
    while True:
        start = perf_counter()
        try:
            signal = step(value)
        except StopIteration as done:
            return done.value
        finally:
            if perf_counter() - start >= BLOCKING_STEP_S:
                held[0] += perf_counter() - start
        try:
            value, step = (yield signal), coro.send
        except GeneratorExit:
            coro.close()
            raise
        except BaseException as exc:  # delivered to the handler (a cancellation), as await does
            value, step = exc, coro.throw


class Invoke:
    __slots__ = ("blocking", "processes", "redact", "workers")

    def __init__(
        self, workers: WorkerPools, redact: Redactor, processes: isolation.ProcessPools
    ) -> None:
        self.workers = workers
        self.redact = redact
        self.blocking: set[str] = set()  # tools logged as holding the loop
        self.processes = processes

    async def __call__(self, inv: Invocation) -> Outcome:
        tool = inv.tool
        assert tool is not None
        if not tool.is_async:
            if tool.process_target is not None:
                return await self._run_process(inv)
            return await self._run_sync(inv)
        # ``CallContext.current()`` reads the attempt from here (built only when asked for)
        attempt = CURRENT_ATTEMPT.set([inv, None])
        # its steps are timed unless its last call ended within BLOCKING_STEP_S (a call
        # that short cannot have held the loop that long): fast tools cost nothing more
        timed = tool.timed[0]
        held = [0.0] if timed else _UNTIMED
        try:
            with anyio.CancelScope(deadline=inv.deadline) as scope:
                start = perf_counter()
                try:
                    if timed:
                        data = await _stepped(tool.fn(inv.args, inv.ctx), held)
                    else:
                        data = await tool.fn(inv.args, inv.ctx)
                except Exception as exc:
                    if scope.cancel_called:
                        return timeout_outcome(inv)
                    return error_outcome(inv, exc, self.redact)
                finally:
                    if timed or perf_counter() - start >= BLOCKING_STEP_S:
                        self._timed(tool, perf_counter() - start, held[0], inv)
        finally:
            CURRENT_ATTEMPT.reset(attempt)
        if scope.cancel_called:
            return timeout_outcome(inv)
        return Outcome(True, data, None, "", False, None, SUCCESS, False, False, None, inv)

    def _timed(self, tool: CompiledTool, took: float, held: float, inv: Invocation) -> None:
        """After a call that was step-timed or took ``BLOCKING_STEP_S`` or more: whether
        the next is timed; the time its steps held the loop counted, the tool logged once."""
        tool.timed[0] = took >= BLOCKING_STEP_S
        if not held:
            return
        name = tool.decl.name
        if name not in self.blocking:
            self.blocking.add(name)
            log.warning(
                "toolrelay: the async handler of %s held the event loop for %.3f s: a "
                "blocking call in an async def (no deadline can fire while it runs; make it "
                "a sync handler, or run the call in a thread)",
                name, held,
            )  # fmt: skip
        if inv.observers:
            inv.emit(LoopBlocked(held))

    async def _run_sync(self, inv: Invocation) -> Outcome:
        tool = inv.tool
        assert tool is not None and inv.key is not None
        pool = self.workers.get(inv.key)
        job = pool.try_start()
        if job is None:
            return failure(
                ErrorType.OVERLOADED,
                f"{tool.decl.name} is busy: all {pool.max_threads} workers for "
                f"{inv.key!r} are in use",
                inv,
                retryable=True,
            )
        finished = False
        # the worker thread runs in a copy of this context, where the event loop's clock
        # cannot be read: it gets the deadline on ``time.monotonic()``'s clock
        deadline = inv.deadline - anyio.current_time() + time.monotonic()
        attempt = CURRENT_ATTEMPT.set([inv, deadline])
        try:
            with anyio.CancelScope(deadline=inv.deadline) as scope:
                try:
                    data = await pool.run(job, tool.fn, inv.args, inv.ctx)
                    finished = True
                except Exception as exc:
                    finished = True
                    return error_outcome(inv, exc, self.redact)
        finally:
            CURRENT_ATTEMPT.reset(attempt)
            if not finished and pool.abandon(job) and inv.observers:
                inv.emit(WorkerAbandoned(inv.key))
        if scope.cancel_called:
            return timeout_outcome(inv)
        return Outcome(True, data, request=inv)

    async def _run_process(self, inv: Invocation) -> Outcome:
        tool = inv.tool
        assert tool is not None and tool.process_target is not None and inv.key is not None
        name, key = tool.decl.name, inv.key
        try:
            message = isolation.encode_call(
                tool.process_target, inv.args, inv.ctx, call_id=inv.call_id,
                attempt=inv.attempts, key=key,
                deadline=inv.deadline - anyio.current_time() + time.monotonic(),
            )  # fmt: skip
        except Exception as exc:  # the host's AuthContext holds something pickle refuses
            why = describe_exception(exc, self.redact)
            log.warning("toolrelay: cannot send a call of %s to a worker process: %s", name, why)
            return failure(
                ErrorType.INTERNAL_ERROR,
                f"toolrelay could not hand {name} its call ({type(exc).__name__})",
                inv,
            )

        def killed() -> None:
            if inv.observers:
                inv.emit(WorkerKilled(key))

        pool = self.processes.get(key)
        with anyio.CancelScope(deadline=inv.deadline) as scope:
            try:
                reply = await pool.call(message, killed)
            except isolation.PoolFull:
                return failure(
                    ErrorType.OVERLOADED,
                    f"{name} is busy: all {pool.max_processes} worker processes for "
                    f"{key!r} are in use",
                    inv,
                    retryable=True,
                )
            except isolation.StartFailed:
                return failure(
                    ErrorType.OVERLOADED,
                    f"{name} could not start: no worker process for {key!r}",
                    inv,
                    retryable=True,
                )
            except isolation.WorkerCrashed as exc:
                log.warning("toolrelay: the worker process of %s %s", name, exc.how)
                return unexpected(inv, f"{name} failed: its worker process {exc.how}")
        if scope.cancel_called:
            return timeout_outcome(inv)
        kind = reply[0]
        if kind == "ok":
            return Outcome(True, reply[1], request=inv)
        if kind == "tool_error":
            _, text, error_type, retryable, counts, retry_after_s = reply
            error = ToolError(
                text, error_type=error_type, retryable=retryable,
                counts_as_failure=counts, retry_after_s=retry_after_s,
            )  # fmt: skip
            return error_outcome(inv, error, self.redact)
        if kind == "raised":
            details = self.redact(reply[2].rstrip())  # raised in the worker process
            return raised_outcome(inv, reply[1], details)
        if kind == "too_large":
            return failure(
                ErrorType.INVALID_OUTPUT,
                f"{name}'s result is {reply[1]:,} bytes as it leaves its worker process, "
                f"over the output cap ({reply[2]:,} bytes)",
                inv,
            )
        return failure(ErrorType.INVALID_OUTPUT, f"{name} returned a non-JSON value", inv)
