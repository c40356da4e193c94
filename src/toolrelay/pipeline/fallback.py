"""Fallback: a tool that cannot answer now hands the call to its first healthy fallback.

When the primary answers ``circuit_open`` or ``overloaded``, or (idempotent tools only)
``timeout`` with time left, each of its ``ToolDeclaration.fallback`` re-enters the chain
below this stage in turn, with the primary's deadline as its bound; one that never ran is
skipped, the first other answer is the call's (``served_by``). A fallback's own fallbacks
are never followed. The rules in full: ``docs/fallbacks.md``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Awaitable, Callable

import anyio

from ..contract import ErrorType, ToolDeclaration
from ..events import FallbackEnded
from ..outcome import Outcome
from ..registry import CompiledTool
from . import Invocation, Next

SKIPPED = frozenset(
    {
        ErrorType.UNKNOWN_TOOL,
        ErrorType.TOOL_POLICY,
        ErrorType.CIRCUIT_OPEN,
        ErrorType.INVALID_ARGUMENTS,
        ErrorType.VALIDATION_ERROR,
        ErrorType.NEEDS_APPROVAL,
        ErrorType.DENIED,
        ErrorType.INTERNAL_ERROR,
    }
)
"""A fallback answering one of these never ran: the next one is tried."""


def may_fall_back(out: Outcome, decl: ToolDeclaration, left_s: float) -> bool:
    """May a call that answered ``out`` go to a fallback with ``left_s`` seconds left?

    ``circuit_open`` and ``overloaded`` (the tool never ran) always may; ``timeout`` only
    for an idempotent tool (the effect may have happened otherwise); never with no time
    left, never when the effect is unknown, never for any other answer."""
    if out.ok or out.effect_unknown or left_s <= 0:
        return False
    kind = out.error_type
    if kind is ErrorType.CIRCUIT_OPEN or kind is ErrorType.OVERLOADED:
        return True
    return kind is ErrorType.TIMEOUT and decl.is_idempotent


class Fallback:
    """Placed right after resolve (the primary's policy is checked first: a caller may not
    reach a fallback through a tool it may not call). ``reenter`` is the chain a fallback
    call runs through: every stage but this one (and telemetry), composed by the
    dispatcher before this stage."""

    __slots__ = ("find", "reenter")

    def __init__(self, reenter: Next, find: Callable[[str], CompiledTool | None]) -> None:
        self.reenter = reenter
        self.find = find
        """How the dispatcher looks a tool up (``pipeline/resolve.py``: ``find``)."""

    def __call__(self, call_next: Next, inv: Invocation) -> Awaitable[Outcome]:
        assert inv.tool is not None
        if not inv.tool.decl.fallback:
            return call_next(inv)  # the common case: no coroutine frame of its own
        return self._run(call_next, inv)

    async def _run(self, call_next: Next, inv: Invocation) -> Outcome:
        out = await call_next(inv)
        if out.ok:
            return out
        asked = inv if out.request is None else out.request  # the primary, as it ran
        if out.attempts:  # fast-fail's refused attempt, counted by the primary's call
            asked = asked.attempt(out.attempts)
        assert asked.tool is not None
        # the primary's deadline, or (answered before the deadline stage: a fast-fail)
        # what it would have been
        end = asked.bounded(anyio.current_time(), asked.attempts).deadline
        if not may_fall_back(out, asked.tool.decl, end - anyio.current_time()):
            return out
        primary = str(out.error_type)
        for name in asked.tool.decl.fallback:
            if end - anyio.current_time() <= 0:
                break
            tool = self.find(name)
            sub = Invocation.asked(
                name, inv.raw_args, inv.ctx, inv.profile, inv.call_id, inv.slot, inv.observers,
                tool, end,
            )  # fmt: skip
            answer = await self.reenter(sub)
            ran = sub if answer.request is None else answer.request
            made = answer.attempts or ran.attempts
            result = "ok" if answer.ok else str(answer.error_type)
            passed = answer.error_type in SKIPPED or (
                ran.tool is not None
                and may_fall_back(answer, ran.tool.decl, end - anyio.current_time())
            )
            if asked.observers:
                asked.emit(FallbackEnded(name, ran.key, result, not passed, primary, made))
            if not passed:  # the outer stages read the primary's call: its key, attempts
                return dataclasses.replace(answer, served_by=name, request=asked, attempts=0)
        return out
