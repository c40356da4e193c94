"""Approvals at the gateway: the human behind the calling MCP client decides.

A call that needs an approval is put to the client that made the ``tools/call``, as a
form-mode ``elicitation/create`` on that call (or, for a 2026-era call served in rounds,
as one ``InputRequiredResult`` round: :mod:`toolrelay.serve.rounds`). What the message shows,
when a client is asked, and the audit's ``approver``: ``docs/serve.md``, "Approvals". The
form has no fields (an MCP form field is an input the human may edit, never a read-only
display), so *accept* approves and anything else denies; a client that cannot be asked gets
:data:`~toolrelay.approval.UNASKED` (``needs_approval``, as without an approver).

The gateway's server middleware (:meth:`ElicitingApprover.middleware`) remembers which
request a dispatch belongs to; the dispatcher's approval stage calls the approver in the
same task.
"""

from __future__ import annotations

import logging
from contextvars import ContextVar
from typing import Any, Final

import anyio
import mcp.types as types
from mcp.server.context import CallNext, HandlerResult, ServerRequestContext
from mcp.shared.exceptions import MCPError
from mcp.types.version import MODERN_PROTOCOL_VERSIONS
from pydantic import ValidationError

from ..approval import UNASKED, Approval, Decision, shown_arguments
from ..contract import AuthContext, ToolDeclaration
from ..redact import Redactor
from ..result import ToolCall
from ..sources.relay import CALL_CHANNEL
from .rounds import HeldCall
from .settings import DEFAULT_APPROVAL_TIMEOUT_S

log = logging.getLogger("toolrelay.serve")

_FORM: Final[dict[str, Any]] = {"type": "object", "properties": {}}
_REQUEST: ContextVar[ServerRequestContext[Any, Any] | None] = ContextVar(
    "toolrelay_mcp_request", default=None
)


class ElicitingApprover:
    """An approver for ``Dispatcher(approver=...)`` that asks the calling MCP client.

    ``timeout_s`` (``[serve] approval_timeout_s``, checked there) bounds the wait for the
    human (and so does any enclosing deadline, and the model slot's budget when the host
    holds one); ``redact`` is the dispatcher's :class:`~toolrelay.redact.Redactor`, which the
    runner sets (default: the default patterns).
    """

    __slots__ = ("redact", "timeout_s")

    def __init__(self, *, timeout_s: float = DEFAULT_APPROVAL_TIMEOUT_S) -> None:
        self.timeout_s = timeout_s
        self.redact = Redactor()

    async def middleware(
        self, ctx: ServerRequestContext[Any, Any], call_next: CallNext
    ) -> HandlerResult:
        """Server middleware: a ``tools/call`` runs knowing its request (to ask its client)."""
        if ctx.method != "tools/call":
            return await call_next(ctx)
        token = _REQUEST.set(ctx)
        try:
            return await call_next(ctx)
        finally:
            _REQUEST.reset(token)

    async def __call__(self, call: ToolCall, decl: ToolDeclaration, auth: AuthContext) -> Decision:
        request = _REQUEST.get()
        held = CALL_CHANNEL.get()  # a 2026-era call served in rounds: asked in one
        held = held if isinstance(held, HeldCall) else None
        if request is None or not _can_elicit(request, held is not None):
            return UNASKED
        shown = shown_arguments(call.arguments, self.redact)
        if not isinstance(shown, str):
            return shown
        by = "elicitation" if auth.user_id is None else f"elicitation:{auth.user_id}"
        left = anyio.current_effective_deadline() - anyio.current_time()
        limit = max(0.0, min(self.timeout_s, left))
        message = f"Allow the {decl.risk} action {decl.name!r} with these arguments?\n{shown}"
        with anyio.move_on_after(limit) as scope:
            try:
                if held is None:
                    result = await request.session.elicit_form(
                        message, _FORM, related_request_id=request.request_id
                    )
                else:
                    form = types.ElicitRequestFormParams(message=message, requested_schema=_FORM)
                    answer = await held.ask(types.ElicitRequest(params=form), types.ElicitResult)
                    if isinstance(answer, types.ErrorData):
                        raise MCPError.from_error_data(answer)
                    result = answer
            except (MCPError, ValidationError) as exc:
                log.warning(
                    "toolrelay serve: asking the client to approve %s failed: %s",
                    decl.name,
                    type(exc).__name__,
                )
                return Approval(False, by, "the client could not ask for approval")
        if scope.cancelled_caught:
            return Approval(False, by, f"no answer within {limit:.3g} s")
        if result.action == "accept":
            return Approval(True, by)
        return Approval(False, by, "declined" if result.action == "decline" else "cancelled")


def _can_elicit(request: ServerRequestContext[Any, Any], in_rounds: bool) -> bool:
    """Whether this request's client can be asked now (see the module's docstring)."""
    session = request.session
    modern = request.protocol_version in MODERN_PROTOCOL_VERSIONS
    if not in_rounds and (modern or not session.can_send_request):
        return False
    capabilities = session.client_capabilities
    elicitation = None if capabilities is None else capabilities.elicitation
    # A bare ``elicitation: {}`` (before modes existed) means form mode; url-only does not.
    return elicitation is not None and (elicitation.form is not None or elicitation.url is None)
