"""A dispatcher's tools as OpenAI Agents SDK ``FunctionTool`` s.

    from toolrelay.integrations.openai_agents import function_tools

    agent = Agent(name="support", tools=function_tools(dispatcher, profile="support"))
    await Runner.run(agent, "…", context=AuthContext(user_id="u1"))

Each tool's ``on_invoke_tool`` hands the model's raw JSON arguments to
:meth:`Dispatcher.dispatch` (toolrelay decodes and validates them) and gives the model the
answer envelope, ``ToolResult.to_model()`` as JSON text, whatever happened: a timeout, an open
breaker and a tool error are answers, and the run goes on. Only cancellation propagates.
See ``docs/integrations/openai-agents.md``.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable
from typing import Any

try:
    from agents import FunctionTool, RunContextWrapper
    from agents.tool import set_function_tool_failure_error_function
    from agents.tool_context import ToolContext
except ImportError as exc:  # pragma: no cover - depends on the environment
    raise ImportError(
        "toolrelay.integrations.openai_agents needs the OpenAI Agents SDK: "
        "pip install 'toolrelay[openai-agents]'"
    ) from exc

from ..contract import AuthContext, ToolDeclaration
from ..dispatcher import Dispatcher
from ..formats import Unavailable, checked_unavailable, strict_form
from ..policy import Profile
from ._common import envelope_text

__all__ = ["AuthFromContext", "context_auth", "function_tools"]

AuthFromContext = Callable[[ToolContext[Any]], AuthContext | None]
"""The host's function from the Agents SDK's run context (a ``ToolContext``, which is a
``RunContextWrapper``) to the caller's :class:`~toolrelay.AuthContext` (``None``: anonymous)."""


def context_auth(ctx: ToolContext[Any]) -> AuthContext | None:
    """The default: the run's context object when it is an ``AuthContext``
    (``Runner.run(..., context=AuthContext(...))``), otherwise anonymous."""
    return ctx.context if isinstance(ctx.context, AuthContext) else None


def function_tools(
    dispatcher: Dispatcher,
    *,
    profile: str | None = None,
    auth: AuthFromContext | None = None,
    unavailable: Unavailable = "show",
    strict: bool | None = None,
) -> list[FunctionTool]:
    """The tools a caller with ``profile`` may call, as ``FunctionTool`` s for ``Agent(tools=…)``.

    ``auth`` turns the run context into the caller's ``AuthContext`` for each call (default:
    :func:`context_auth`). A tool whose breaker fails fast is listed (``"show"``), listed
    with a marked description (``"mark"``) — a call is answered ``circuit_open`` — or left
    out (``"hide"``: a call to it from the conversation fails the run, unless the host runs
    with ``RunConfig(tool_not_found_behavior="return_error_to_model")``). ``strict``: ``None``
    marks a tool strict when its schema has a strict form that toolrelay accepts whole
    (:func:`toolrelay.formats.strict_form`: every object closed, every property required,
    an optional one as nullable — a typed tool's defaulted parameter); ``True`` asks
    for the conversion (the SDK raises ``UserError`` for a schema it cannot convert);
    ``False`` never.

    The list holds the tools declared now: build it again (for instance per run) to pick up
    tools a plugin added or removed.
    """
    chosen = dispatcher.profile(profile)
    unavailable = checked_unavailable(unavailable)
    health = None if unavailable == "show" else _Health(dispatcher, chosen, unavailable)
    out = []
    for compiled in dispatcher.registry.tools():
        decl = compiled.decl
        if not chosen.permits(decl):
            continue
        invoker = _Invoker(dispatcher, decl.name, profile, auth or context_auth)
        strict_schema = None if strict is False else strict_form(decl.parameters)
        tool = FunctionTool(
            name=decl.name,
            description=decl.description,
            params_json_schema=strict_schema or dict(decl.parameters),
            on_invoke_tool=invoker,
            strict_json_schema=strict_schema is not None if strict is None else strict,
        )
        if health is not None:
            tool.is_enabled = health.checker(tool, decl)
        # No formatter: a cancelled call must propagate, never become text for the model
        # (by default the SDK turns a tool task's CancelledError into an error message).
        out.append(set_function_tool_failure_error_function(tool, None))
    return out


class _Invoker:
    """``on_invoke_tool`` of one tool: dispatch the raw arguments, answer the envelope.

    A callable object rather than a function: the SDK inspects the invoker's signature and
    type hints on every call (to choose which context to pass), and a function's string
    annotations cost it ~30 µs a call to evaluate; an object's take the SDK's fast path.
    """

    __slots__ = ("auth", "dispatcher", "name", "profile")

    def __init__(
        self, dispatcher: Dispatcher, name: str, profile: str | None, auth: AuthFromContext
    ) -> None:
        self.dispatcher = dispatcher
        self.name = name
        self.profile = profile
        self.auth = auth

    async def __call__(self, ctx: ToolContext[Any], arguments: str) -> str:
        result = await self.dispatcher.dispatch(
            self.name,
            arguments,
            self.auth(ctx),
            profile=self.profile,
            call_id=ctx.tool_call_id,
        )
        return envelope_text(result)


class _Health:
    """``is_enabled`` of the tools: hides (``"hide"``) or marks (``"mark"``) a tool while its
    breaker fails fast.

    The SDK asks twice a turn: when it lists the tools, and before it runs the calls the
    model made, where a tool that turned disabled in between fails the whole run
    (``ModelBehaviorError``). So each run decides once per turn and tool, the first time it is
    asked: a breaker that opens while the model thinks is answered ``circuit_open`` in this
    turn and hidden or marked from the next one.
    """

    __slots__ = ("chosen", "dispatcher", "runs", "unavailable")

    def __init__(self, dispatcher: Dispatcher, chosen: Profile, unavailable: Unavailable) -> None:
        self.dispatcher = dispatcher
        self.chosen = chosen
        self.unavailable = unavailable
        # id(run context) → (that turn's input list, {tool name: enabled})
        self.runs: dict[int, tuple[object, dict[str, bool]]] = {}

    def checker(
        self, tool: FunctionTool, decl: ToolDeclaration
    ) -> Callable[[RunContextWrapper[Any], Any], bool]:
        def is_enabled(run_context: RunContextWrapper[Any], agent: Any) -> bool:
            turn = run_context.turn_input  # a new list object every turn
            run = self.runs.get(id(run_context))
            if run is None:
                weakref.finalize(run_context, self.runs.pop, id(run_context), None)
            if run is None or run[0] is not turn:
                run = self.runs[id(run_context)] = (turn, {})
            verdicts = run[1]
            verdict = verdicts.get(decl.name)
            if verdict is None:
                description = self.dispatcher.describe(decl, self.chosen, self.unavailable)
                if description is not None:  # marked or not: the breaker's state now
                    tool.description = description
                verdict = verdicts[decl.name] = description is not None
            return verdict

        return is_enabled
