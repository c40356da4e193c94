"""A :class:`~toolrelay.Dispatcher`'s tools as a Pydantic AI toolset (:class:`ToolrelayToolset`),
approvals through Pydantic AI's deferred tools (:func:`deferred_approver`); see
``docs/integrations/pydantic-ai.md``.

Needs ``pip install 'toolrelay[pydantic-ai]'``.
"""

from __future__ import annotations

import contextvars
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Literal

try:
    from pydantic_ai import RunContext
    from pydantic_ai.tools import AgentDepsT, ToolDefinition
    from pydantic_ai.toolsets import AbstractToolset, ToolsetTool
    from pydantic_core import from_json
except ImportError as exc:  # pragma: no cover - depends on the environment
    raise ImportError(
        "toolrelay.integrations.pydantic_ai needs Pydantic AI: pip install 'toolrelay[pydantic-ai]'"
    ) from exc

from ..contract import AuthContext, ErrorType, ToolDeclaration
from ..dispatcher import Dispatcher
from ..formats import Unavailable, checked_unavailable
from ..result import ToolCall

__all__ = ["ToolrelayToolset", "deferred_approver"]

log = logging.getLogger("toolrelay")

Approver = Callable[[ToolCall, ToolDeclaration, AuthContext], Awaitable[bool] | bool]
AuthFrom = Callable[[RunContext[Any]], AuthContext | None]


@dataclass(slots=True)
class _Grant:
    """The host approved this call (``ctx.tool_call_approved``): one approval, for one tool."""

    tool: str
    spent: bool = False


_GRANT: contextvars.ContextVar[_Grant | None] = contextvars.ContextVar(
    "toolrelay_pydantic_ai_grant", default=None
)


def deferred_approver(fallback: Approver | None = None) -> Approver:
    """An approver for ``Dispatcher(approver=...)`` that approves exactly the calls a
    Pydantic AI host approved through ``DeferredToolResults`` (each once, for the tool it
    was approved for). Any other call needing approval goes to ``fallback``; without one
    it is denied."""

    def approve(call: ToolCall, decl: ToolDeclaration, ctx: AuthContext) -> Awaitable[bool] | bool:
        grant = _GRANT.get()
        if grant is not None and not grant.spent and grant.tool == call.name:
            grant.spent = True
            return True
        return False if fallback is None else fallback(call, decl, ctx)

    return approve


class _Unparsed(dict[str, Any]):
    """Arguments that are not a JSON object, kept as the model sent them for toolrelay to
    answer (``invalid_arguments``)."""

    __slots__ = ("raw",)

    def __init__(self, raw: Any) -> None:
        super().__init__()
        self.raw = raw


class _Permissive:
    """Pydantic AI's argument validator for toolrelay's tools: parses, never refuses.

    Validation is toolrelay's (one validator, the same messages for every host); arguments
    that do not parse to an object reach ``dispatch`` as sent."""

    def validate_json(
        self,
        input: str | bytes | bytearray,
        *,
        allow_partial: bool | Literal["off", "on", "trailing-strings"] = False,
        **kwargs: Any,
    ) -> Any:
        try:
            value = from_json(input, allow_partial=allow_partial)
        except ValueError:  # not JSON (pydantic_core's errors are ValueErrors)
            return _Unparsed(input)
        return value if isinstance(value, dict) else _Unparsed(input)

    def validate_python(
        self,
        input: Any,
        *,
        allow_partial: bool | Literal["off", "on", "trailing-strings"] = False,
        **kwargs: Any,
    ) -> Any:
        return input if isinstance(input, dict) else _Unparsed(input)


_PERMISSIVE = _Permissive()


class ToolrelayToolset(AbstractToolset[AgentDepsT]):
    """The dispatcher's tools for ``profile``, as a Pydantic AI toolset.

    - ``get_tools`` (every step): ``dispatcher.specs(profile, unavailable=...)``, so a tool
      whose breaker is open is listed (``"show"``), described as unavailable (``"mark"``) or
      hidden (``"hide"``: a call to it from the conversation then ends the run once its
      retries are spent). With ``defer_approval`` a tool the profile requires approval for
      is ``kind="unapproved"``: Pydantic AI defers its calls to the host
      (``DeferredToolRequests``), and runs them once approved.
    - ``call_tool``: ``dispatch(name, args, auth(ctx), profile=profile,
      call_id=ctx.tool_call_id)``; the envelope is the tool's return value. Every failure
      is an answer; the host's cancellation propagates.

    ``auth`` turns the run context into the caller's :class:`AuthContext` (typically from
    ``ctx.deps``); without it calls are anonymous.
    """

    def __init__(
        self,
        dispatcher: Dispatcher,
        *,
        profile: str | None = None,
        auth: AuthFrom | None = None,
        unavailable: Unavailable = "show",
        defer_approval: bool = True,
        id: str | None = None,
    ) -> None:
        self.dispatcher = dispatcher
        self.profile = profile
        self.auth = auth
        self.unavailable = checked_unavailable(unavailable)
        self.defer_approval = defer_approval
        self._id = id
        self._warned = False

    @property
    def id(self) -> str | None:
        return self._id

    async def get_tools(self, ctx: RunContext[AgentDepsT]) -> dict[str, ToolsetTool[AgentDepsT]]:
        dispatcher = self.dispatcher
        chosen = dispatcher.profile(self.profile)
        tools: dict[str, ToolsetTool[AgentDepsT]] = {}
        for spec in dispatcher.specs(self.profile, "openai", unavailable=self.unavailable):
            fn = spec["function"]
            deferred = False
            if self.defer_approval:
                compiled = dispatcher.registry.resolve(fn["name"])
                deferred = compiled is not None and chosen.needs_approval(compiled.decl)
            tool_def = ToolDefinition(
                name=fn["name"],
                parameters_json_schema=fn["parameters"],
                description=fn["description"],
                kind="unapproved" if deferred else "function",
            )
            tools[tool_def.name] = ToolsetTool(
                toolset=self, tool_def=tool_def, max_retries=1, args_validator=_PERMISSIVE
            )
        return tools

    async def call_tool(
        self,
        name: str,
        tool_args: dict[str, Any],
        ctx: RunContext[AgentDepsT],
        tool: ToolsetTool[AgentDepsT],
    ) -> dict[str, Any]:
        auth = None if self.auth is None else self.auth(ctx)
        args: Any = tool_args.raw if isinstance(tool_args, _Unparsed) else tool_args
        grant = _Grant(name) if ctx.tool_call_approved else None
        token = _GRANT.set(grant)
        try:
            result = await self.dispatcher.dispatch(
                name, args, auth, profile=self.profile, call_id=ctx.tool_call_id
            )
        finally:
            _GRANT.reset(token)
        needed = result.error_type == ErrorType.NEEDS_APPROVAL
        if needed and grant is not None and not grant.spent and not self._warned:
            self._warned = True
            log.warning(
                "toolrelay: %r was approved in Pydantic AI but the dispatcher has no "
                "approver; build it with approver=deferred_approver()",
                name,
            )
        return result.to_model()
