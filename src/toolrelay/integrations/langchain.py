"""A dispatcher's tools as LangChain ``BaseTool``\\ s, for LangGraph's ``ToolNode`` and agents.

Every call goes through :meth:`~toolrelay.Dispatcher.dispatch`: the model's arguments are
validated by toolrelay (not by LangChain), the tool call id is the ``call_id``, the
:class:`~toolrelay.AuthContext` comes from the host's ``auth(config)``, and the answer is the
envelope (``ToolResult.to_model()``) as JSON text — a ``ToolMessage`` with ``status="error"``
for a failure. Cancellation of the host's task propagates; it is never an answer.

Needs ``langchain-core`` (``pip install 'toolrelay[langchain]'``). See
``docs/integrations/langchain.md``.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable
from contextvars import ContextVar
from typing import Any

from anyio.from_thread import BlockingPortal
from pydantic import SkipValidation

try:
    from langchain_core.messages import ToolMessage
    from langchain_core.runnables import RunnableConfig, ensure_config
    from langchain_core.tools import BaseTool
except ImportError as exc:  # pragma: no cover - exercised only without the extra
    raise ImportError(
        "toolrelay.integrations.langchain needs langchain-core: pip install 'toolrelay[langchain]'"
    ) from exc

from ..contract import AuthContext
from ..dispatcher import Dispatcher
from ..formats import Unavailable
from ..result import ToolResult
from ._common import envelope_text

__all__ = ["AuthSource", "RelayTool", "answer_artifact", "langchain_tools"]

AuthSource = Callable[[RunnableConfig], AuthContext | None]
"""Turns the run's ``RunnableConfig`` (e.g. ``config["configurable"]``) into the caller's
identity; ``None`` means anonymous."""

_CALL_ID: ContextVar[str | None] = ContextVar("toolrelay_langchain_call_id", default=None)
"""The tool call id of the call running in this context: ``BaseTool`` hands it to
``_format_output`` but not to ``_arun``/``_run`` when ``args_schema`` is a JSON Schema dict."""


def answer_artifact(result: ToolResult) -> dict[str, Any]:
    """The ``ToolMessage.artifact`` of an answer: every field of ``result`` as JSON-safe
    data (``error_type`` as its string), so it survives LangGraph's checkpointers;
    ``ToolResult(**artifact)`` rebuilds the result."""
    fields = {field.name: getattr(result, field.name) for field in dataclasses.fields(result)}
    if result.error_type is not None:
        fields["error_type"] = str(result.error_type)
    return fields


class RelayTool(BaseTool):
    """One tool of a dispatcher. Build them with :func:`langchain_tools`.

    ``args_schema`` is the tool's JSON Schema as declared: LangChain passes the model's
    arguments through untouched and toolrelay validates them (``validation_error`` answer).
    """

    dispatcher: SkipValidation[Dispatcher]
    profile: str | None = None
    auth: SkipValidation[AuthSource | None] = None
    portal: BlockingPortal | None = None
    """Where a sync ``invoke`` runs the call; ``None``: only ``ainvoke`` works."""

    # -- the id LangChain knows but does not hand to _arun/_run ------------------------
    async def arun(
        self, tool_input: Any, *args: Any, tool_call_id: str | None = None, **kwargs: Any
    ) -> Any:
        token = _CALL_ID.set(tool_call_id)
        try:
            return await super().arun(tool_input, *args, tool_call_id=tool_call_id, **kwargs)
        finally:
            _CALL_ID.reset(token)

    def run(
        self, tool_input: Any, *args: Any, tool_call_id: str | None = None, **kwargs: Any
    ) -> Any:
        token = _CALL_ID.set(tool_call_id)
        try:
            return super().run(tool_input, *args, tool_call_id=tool_call_id, **kwargs)
        finally:
            _CALL_ID.reset(token)

    # -- the call ----------------------------------------------------------------------
    # ``args`` are the model's arguments as LangChain passes them (keyword arguments,
    # copied). The signature names no ``config``/``run_manager`` parameter on purpose:
    # LangChain would overwrite a model argument of that name with its own object.
    async def _arun(self, /, *_: Any, **args: Any) -> Any:
        call_id = _CALL_ID.get()
        ctx = self._auth_context()
        result = await self.dispatcher.dispatch(
            self.name, args, ctx, profile=self.profile, call_id=call_id
        )
        return self._answer(result, call_id)

    def _run(self, /, *_: Any, **args: Any) -> Any:
        if self.portal is None:
            raise RuntimeError(
                f"toolrelay tool {self.name!r} was invoked synchronously without a portal: "
                "run the graph with ainvoke/astream, or build the tools with a portal: "
                "langchain_tools(relay.dispatcher, portal=relay.portal) for a SyncDispatcher "
                "relay, or inside `with anyio.from_thread.start_blocking_portal() as portal:`"
            )
        call_id = _CALL_ID.get()
        dispatch = functools.partial(
            self.dispatcher.dispatch,
            self.name,
            args,
            self._auth_context(),
            profile=self.profile,
            call_id=call_id,
        )
        return self._answer(self.portal.call(dispatch), call_id)

    def _auth_context(self) -> AuthContext | None:
        # LangChain sets the run's config as the current one around _arun/_run.
        return None if self.auth is None else self.auth(ensure_config())

    def _answer(self, result: ToolResult, call_id: str | None) -> str | ToolMessage:
        content = envelope_text(result)
        if call_id is None:  # invoked with bare arguments: LangChain returns the content
            return content
        return ToolMessage(
            content,
            tool_call_id=call_id,
            name=self.name,
            status="success" if result.ok else "error",
            artifact=answer_artifact(result),
        )


def langchain_tools(
    dispatcher: Dispatcher,
    *,
    profile: str | None = None,
    auth: AuthSource | None = None,
    unavailable: Unavailable = "show",
    portal: BlockingPortal | None = None,
) -> list[RelayTool]:
    """The tools a caller with ``profile`` may call, as LangChain tools, in registry order.

    ``unavailable`` treats tools whose breaker is open as :meth:`Dispatcher.specs` does.
    Give a ``ToolNode`` the default (``"show"``): a tool missing from it would be answered
    by LangGraph, not by toolrelay, and an open breaker is answered by the tool itself
    (``circuit_open`` with ``retry_after_s``). To keep such tools from the *model*, build
    the list again for every model step with ``"hide"`` (or ``"mark"``) and bind that.

    ``auth(config)`` gives the :class:`AuthContext` of each call from the run's
    ``RunnableConfig``. ``portal`` (an anyio ``BlockingPortal`` running the dispatcher's
    event loop, e.g. a ``SyncDispatcher``'s ``portal``) lets sync hosts call ``invoke``;
    without one only ``ainvoke`` works.
    """
    tools = []
    for spec in dispatcher.specs(profile, "openai", unavailable=unavailable):
        function = spec["function"]
        tools.append(
            RelayTool(
                name=function["name"],
                description=function["description"],
                args_schema=function["parameters"],
                dispatcher=dispatcher,
                profile=profile,
                auth=auth,
                portal=portal,
            )
        )
    return tools
