"""Stage 10 (terminal): run the handler, and turn whatever happens into an outcome.

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
from collections.abc import Callable

import anyio

from .. import isolation
from ..contract import CURRENT_ATTEMPT, ErrorType, ToolError
from ..events import WorkerAbandoned, WorkerKilled
from ..outcome import Outcome, Verdict, failure, short
from ..redact import Redactor, describe_exception
from ..workers import WorkerPools
from . import Invocation

log = logging.getLogger("toolrelay")

MAX_REDACTED_CHARS = 16384
"""How much of a ``ToolError`` message is redacted (and the rest dropped): the model reads
at most 240 characters of it, and a huge message must not make redaction slow."""
_DEFAULT_REDACTOR = Redactor()


UNKNOWN_EFFECT = "; it may still have taken effect: check before calling it again"


def timeout_outcome(inv: Invocation) -> Outcome:
    """The ``timeout`` answer (built directly: this runs for every call of a hung flood).

    A tool that is not idempotent was stopped after it may have started its effect (an
    abandoned thread or a sent request may still commit it): its timeout is not retryable
    and says so."""
    assert inv.tool is not None
    decl = inv.tool.decl
    if inv.slot_bound:
        assert inv.slot is not None
        message = (
            f"{decl.name} was stopped after {inv.slot.elapsed():.1f} s: "
            "the model's time budget ran out"
        )
        verdict = Verdict.IGNORE
    else:
        message = f"{decl.name} did not answer within its {decl.timeout_s:g} s deadline"
        verdict = Verdict.FAILURE
    if decl.is_idempotent:
        return Outcome(False, None, ErrorType.TIMEOUT, message, True, None, verdict)
    message = short(message + UNKNOWN_EFFECT)
    return Outcome(False, None, ErrorType.TIMEOUT, message, False, None, verdict, False, True)


def error_outcome(
    inv: Invocation, exc: Exception, redact: Callable[[str], str] | None = None
) -> Outcome:
    """The answer for an exception; a plugin's own message is redacted (it may quote an
    upstream, credentials and all) before it is cut to the message cap, so a secret is
    never shown in part. Any other exception is logged with its traceback, redacted too;
    the model reads only its type. ``redact`` defaults to the default patterns."""
    assert inv.tool is not None
    if redact is None:
        redact = _DEFAULT_REDACTOR
    if isinstance(exc, ToolError):
        text = str(exc.message)
        if len(text) > MAX_REDACTED_CHARS:  # the model reads 240 characters of it at most
            text = text[:MAX_REDACTED_CHARS]
        message = short(redact(text)) or f"{inv.tool.decl.name} failed and gave no reason"
        return Outcome(
            False,
            None,
            exc.error_type,
            message,
            exc.retryable,
            exc.retry_after_s,
            Verdict.FAILURE if exc.counts_as_failure else Verdict.IGNORE,
        )
    # Not exc_info: a handler would format the traceback (the exception's text, which may
    # quote a secret) out of reach of redaction. The redacted traceback is the message.
    if isinstance(exc, isolation.WorkerRaised):  # raised in a worker process
        name, details = exc.type_name, redact(exc.details.rstrip())
    else:
        name, details = type(exc).__name__, describe_exception(exc, redact)
    log.warning("toolrelay: tool %s raised %s\n%s", inv.tool.decl.name, name, details)
    return _unexpected(inv, f"{inv.tool.decl.name} failed unexpectedly ({name})")


def _unexpected(inv: Invocation, message: str) -> Outcome:
    """A ``tool_error`` the breaker counts; for a tool that is not idempotent, its effect
    may be done (it failed part-way)."""
    assert inv.tool is not None
    out = failure(ErrorType.TOOL_ERROR, message, verdict=Verdict.FAILURE)
    if not inv.tool.decl.is_idempotent:
        out.message = short(message + UNKNOWN_EFFECT)
        out.effect_unknown = True
    return out


class Invoke:
    __slots__ = ("processes", "redact", "workers")

    def __init__(
        self,
        workers: WorkerPools,
        redact: Callable[[str], str] | None = None,
        processes: isolation.ProcessPools | None = None,
    ) -> None:
        self.workers = workers
        self.redact = redact
        self.processes = processes or isolation.ProcessPools(
            lambda key: workers.get(key).max_threads
        )

    async def __call__(self, inv: Invocation) -> Outcome:
        tool = inv.tool
        assert tool is not None
        if not tool.is_async:
            if tool.process_target is not None:
                return await self._run_process(inv)
            return await self._run_sync(inv)
        # ``CallContext.current()`` reads the attempt from here (built only when asked for)
        attempt = CURRENT_ATTEMPT.set([inv, None])
        try:
            with anyio.CancelScope(deadline=inv.deadline) as scope:
                try:
                    data = await tool.fn(inv.args, inv.ctx)
                except Exception as exc:
                    if scope.cancel_called:
                        return timeout_outcome(inv)
                    return error_outcome(inv, exc, self.redact)
        finally:
            CURRENT_ATTEMPT.reset(attempt)
        if scope.cancel_called:
            return timeout_outcome(inv)
        return Outcome(True, data)

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
        return Outcome(True, data)

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
            why = describe_exception(exc, self.redact or _DEFAULT_REDACTOR)
            log.warning("toolrelay: cannot send a call of %s to a worker process: %s", name, why)
            return failure(
                ErrorType.INTERNAL_ERROR,
                f"toolrelay could not hand {name} its call ({type(exc).__name__})",
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
                    retryable=True,
                )
            except isolation.StartFailed:
                return failure(
                    ErrorType.OVERLOADED,
                    f"{name} could not start: no worker process for {key!r}",
                    retryable=True,
                )
            except isolation.WorkerCrashed as exc:
                log.warning("toolrelay: the worker process of %s %s", name, exc.how)
                return _unexpected(inv, f"{name} failed: its worker process {exc.how}")
        if scope.cancel_called:
            return timeout_outcome(inv)
        kind = reply[0]
        if kind == "ok":
            return Outcome(True, reply[1])
        if kind == "tool_error":
            _, text, error_type, retryable, counts, retry_after_s = reply
            error = ToolError(
                text, error_type=error_type, retryable=retryable,
                counts_as_failure=counts, retry_after_s=retry_after_s,
            )  # fmt: skip
            return error_outcome(inv, error, self.redact)
        if kind == "raised":
            return error_outcome(inv, isolation.WorkerRaised(reply[1], reply[2]), self.redact)
        return failure(ErrorType.INVALID_OUTPUT, f"{name} returned a non-JSON value")
