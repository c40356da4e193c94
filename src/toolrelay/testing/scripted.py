"""A fake plugin whose tools answer by script: :class:`ScriptedPlugin` (async ``execute``)
and :class:`SyncScriptedPlugin` (plain ``def execute``, run on a worker thread)."""

from __future__ import annotations

import copy
import threading
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any, Literal

import anyio

from ..contract import AuthContext, CallContext, ErrorType, ToolDeclaration, ToolError

ANY_OBJECT: Mapping[str, Any] = {"type": "object"}


@dataclass(frozen=True, slots=True)
class Step:
    """One scripted answer; made by :func:`ok`, :func:`error`, :func:`hang` or :func:`slow`."""

    kind: Literal["ok", "error", "hang", "slow"]
    data: Any = None
    seconds: float = 0.0
    error: ToolError | None = None
    """What an ``error`` step raises: a new copy per call (an exception raised twice would
    carry both tracebacks)."""

    def answer(self) -> Any:
        """The step's data, or a copy of its error raised."""
        if self.error is None:
            return self.data
        raise copy.copy(self.error)


def ok(data: Any = None) -> Step:
    """Answer ``data`` at once."""
    return Step("ok", data)


def error(
    message: str = "scripted failure",
    *,
    retryable: bool = False,
    error_type: ErrorType | str = ErrorType.TOOL_ERROR,
    counts_as_failure: bool | None = None,
    retry_after_s: float | None = None,
) -> Step:
    """Raise a :class:`~toolrelay.ToolError` with these fields (as its constructor defaults
    them: ``counts_as_failure`` follows ``retryable``)."""
    raised = ToolError(
        message,
        error_type=error_type,
        retryable=retryable,
        counts_as_failure=counts_as_failure,
        retry_after_s=retry_after_s,
    )
    return Step("error", error=raised)


def hang() -> Step:
    """Never answer: the call ends at its deadline (or when cancelled)."""
    return Step("hang")


def slow(seconds: float, data: Any = None) -> Step:
    """Answer ``data`` after ``seconds`` (real time: deadlines are real time)."""
    if seconds < 0:
        raise ValueError("slow(seconds): seconds must be >= 0")
    return Step("slow", data, seconds)


@dataclass(frozen=True, slots=True)
class ScriptedCall:
    """One call a scripted tool received: its ``args`` and ``ctx``, the step it answered
    with, and ``attempt`` (1 = the call's first; 0 when called outside a dispatch)."""

    tool: str
    args: dict[str, Any]
    ctx: AuthContext
    attempt: int
    step: Step


@dataclass(slots=True)
class _Script:
    decl: ToolDeclaration
    steps: tuple[Step, ...]
    cycle: bool
    used: int = 0

    def next(self) -> Step:
        index = self.used % len(self.steps) if self.cycle else min(self.used, len(self.steps) - 1)
        self.used += 1
        return self.steps[index]


class ScriptedPlugin:
    """A plugin whose tools answer by script, recording every call.

    ``plugin.script("search", error("down", retryable=True), ok({"hits": []}))`` declares
    tool ``search`` (any object as arguments; other :class:`~toolrelay.ToolDeclaration`
    fields as keywords, or a whole declaration instead of the name): its calls take the
    steps in order, and once they are used up the last one repeats (``then="cycle"``: start
    again). Register the plugin before or after scripting; a tool scripted again keeps its
    recorded calls and starts its new script from the first step.
    """

    def __init__(self) -> None:
        self._scripts: dict[str, _Script] = {}
        self._calls: list[ScriptedCall] = []
        self._lock = threading.Lock()

    def script(
        self,
        tool: str | ToolDeclaration,
        *steps: Step,
        then: Literal["repeat", "cycle"] = "repeat",
        **declaration: Any,
    ) -> ToolDeclaration:
        """Declare (or re-script) a tool; returns its declaration."""
        if not steps:
            raise ValueError("script() needs at least one step (ok(), error(), hang(), slow())")
        if then not in ("repeat", "cycle"):
            raise ValueError(f'then must be "repeat" or "cycle", not {then!r}')
        if isinstance(tool, ToolDeclaration):
            decl = replace(tool, **declaration)
        else:
            fields = {"description": f"scripted tool {tool}", "parameters": ANY_OBJECT}
            decl = ToolDeclaration(tool, **(fields | declaration))
        with self._lock:
            self._scripts[decl.name] = _Script(decl, steps, then == "cycle")
        return decl

    @property
    def calls(self) -> list[ScriptedCall]:
        """Every call received, in order, over all tools."""
        with self._lock:
            return list(self._calls)

    def calls_to(self, tool: str) -> list[ScriptedCall]:
        """The calls ``tool`` received, in order."""
        with self._lock:
            return [call for call in self._calls if call.tool == tool]

    # -- the plugin contract ---------------------------------------------------------------
    def describe(self) -> list[ToolDeclaration]:
        with self._lock:
            return [script.decl for script in self._scripts.values()]

    def _take(self, name: str, args: dict[str, Any], ctx: AuthContext) -> Step:
        try:
            attempt = CallContext.current().attempt
        except LookupError:
            attempt = 0
        with self._lock:
            script = self._scripts.get(name)
            if script is None:
                raise ToolError(f"no script for tool {name!r}")
            step = script.next()
            self._calls.append(ScriptedCall(name, args, ctx, attempt, step))
        return step

    async def execute(self, name: str, args: dict[str, Any], ctx: AuthContext) -> Any:
        step = self._take(name, args, ctx)
        if step.kind == "hang":
            await anyio.sleep_forever()
        if step.kind == "slow":
            await anyio.sleep(step.seconds)
        return step.answer()


class SyncScriptedPlugin(ScriptedPlugin):
    """:class:`ScriptedPlugin` with a plain ``def execute``: each call runs on a worker
    thread of its breaker key, as a sync tool does. A hung or slow call's thread is let go
    by :meth:`aclose` (``Dispatcher.aclose()`` calls it), so no thread outlives the test."""

    def __init__(self) -> None:
        super().__init__()
        self._closed = threading.Event()

    def execute(self, name: str, args: dict[str, Any], ctx: AuthContext) -> Any:
        step = self._take(name, args, ctx)
        if step.kind == "hang":
            self._closed.wait()
        if step.kind == "slow":
            self._closed.wait(step.seconds)
        return step.answer()

    async def aclose(self) -> None:
        """Let every hung or slow call's thread end."""
        self._closed.set()
