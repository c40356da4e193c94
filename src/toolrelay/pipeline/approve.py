"""Stage 4: risky tools need an approval, decided by the host's approver."""

from __future__ import annotations

import inspect
import logging
from collections.abc import Awaitable, Callable

import anyio

from ..contract import AuthContext, ErrorType, ToolDeclaration
from ..outcome import Outcome, failure
from ..result import ToolCall
from . import Invocation, Next

log = logging.getLogger("toolrelay")

Approver = Callable[[ToolCall, ToolDeclaration, AuthContext], Awaitable[bool] | bool]


class Approve:
    """No approver → ``needs_approval``; the approver says no (or fails) → ``denied``.

    The wait for a decision is bounded by the model slot's budget when a slot is held.
    """

    __slots__ = ("approver",)

    def __init__(self, approver: Approver | None) -> None:
        self.approver = approver

    def __call__(self, call_next: Next, inv: Invocation) -> Awaitable[Outcome]:
        assert inv.tool is not None
        decl = inv.tool.decl
        if not inv.profile.needs_approval(decl):
            return call_next(inv)
        if self.approver is None:
            inv.approval = "needs_approval"
            return failure(
                ErrorType.NEEDS_APPROVAL,
                f"tool {decl.name!r} is a {decl.risk} action and needs approval first",
            )
        return self._ask(call_next, inv, decl, self.approver)

    async def _ask(
        self, call_next: Next, inv: Invocation, decl: ToolDeclaration, approver: Approver
    ) -> Outcome:
        request = ToolCall(decl.name, inv.args, inv.call_id)
        inv.approval = "pending"
        limit = float("inf") if inv.slot is None else inv.slot.remaining()
        approved = False
        try:
            with anyio.move_on_after(limit) as scope:
                decision = approver(request, decl, inv.ctx)
                if inspect.isawaitable(decision):
                    decision = await decision
                approved = decision is True
        except Exception:
            log.exception("toolrelay: approver failed for %s", decl.name)
            inv.approval = "approver_failed"
            return failure(ErrorType.DENIED, f"approval for {decl.name!r} could not be obtained")
        if scope.cancelled_caught:
            inv.approval = "approval_timeout"
            return failure(
                ErrorType.TIMEOUT,
                f"approval for {decl.name!r} did not come within the model's time budget",
                retryable=True,
            )
        if not approved:
            inv.approval = "denied"
            return failure(ErrorType.DENIED, f"{decl.name!r} was not approved")
        inv.approval = "approved"
        return await call_next(inv)
