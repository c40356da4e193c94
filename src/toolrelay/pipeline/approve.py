"""Approve: risky tools need an approval, decided by the host's approver."""

from __future__ import annotations

import inspect
import logging
from collections.abc import Awaitable

import anyio

from ..approval import Approval, Approver, Decision, Unasked
from ..contract import ErrorType, ToolDeclaration
from ..outcome import Outcome, failure
from ..result import ToolCall
from . import Invocation, Next

log = logging.getLogger("toolrelay")


class Approve:
    """No approver (or it returns :class:`~toolrelay.approval.Unasked`) → ``needs_approval``
    (with its reason); the approver says no (anything but ``True`` or an approving
    :class:`Approval`, or it fails) → ``denied``.

    The wait for a decision is bounded by the model slot's budget when a slot is held.
    """

    __slots__ = ("approver",)

    def __init__(self, approver: Approver | None) -> None:
        self.approver = approver

    def __call__(self, call_next: Next, inv: Invocation) -> Awaitable[Outcome]:
        assert inv.tool is not None
        decl = inv.tool.decl
        if decl.risk not in inv.profile.require_approval:  # Profile.needs_approval, inline
            if inv.audit is not None:
                inv.audit(inv, "not_required", None)
            return call_next(inv)
        if self.approver is None:
            return _needs_approval(inv, decl)
        return self._ask(call_next, inv, decl, self.approver)

    async def _ask(
        self, call_next: Next, inv: Invocation, decl: ToolDeclaration, approver: Approver
    ) -> Outcome:
        request = ToolCall(decl.name, inv.args, inv.call_id)
        note = inv.audit
        if note is not None:
            note(inv, "pending", None)
        limit = float("inf") if inv.slot is None else inv.slot.remaining()
        decision: Decision = False
        try:
            with anyio.move_on_after(limit) as scope:
                answer = approver(request, decl, inv.ctx)
                decision = await answer if inspect.isawaitable(answer) else answer
        except Exception:
            log.exception("toolrelay: approver failed for %s", decl.name)
            if note is not None:
                note(inv, "approver_failed", None)
            message = f"approval for {decl.name!r} could not be obtained"
            return failure(ErrorType.DENIED, message, inv)
        if scope.cancelled_caught:
            if note is not None:
                note(inv, "approval_timeout", None)
            return failure(
                ErrorType.TIMEOUT,
                f"approval for {decl.name!r} did not come within the model's time budget",
                inv,
                retryable=True,
            )
        if isinstance(decision, Unasked):
            return _needs_approval(inv, decl, decision.reason)
        by = None
        if isinstance(decision, Approval):
            by = decision.by
            approved = decision.approved is True
            why = f" ({decision.reason})" if decision.reason and not approved else ""
        else:
            approved = decision is True
            why = ""
        if not approved:
            if note is not None:
                note(inv, "denied", by)
            return failure(ErrorType.DENIED, f"{decl.name!r} was not approved{why}", inv)
        if note is not None:
            note(inv, "approved", by)
        return await call_next(inv)


def _needs_approval(inv: Invocation, decl: ToolDeclaration, reason: str = "") -> Outcome:
    if inv.audit is not None:
        inv.audit(inv, "needs_approval", None)
    why = f" ({reason})" if reason else ""
    return failure(
        ErrorType.NEEDS_APPROVAL,
        f"tool {decl.name!r} is a {decl.risk} action and needs approval first{why}",
        inv,
    )
