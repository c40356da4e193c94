"""Approvals: what a host's approver returns for a risky call.

The pipeline's approve stage (:class:`~toolrelay.pipeline.approve.Approve`) asks the
approver; the gateway's approver (``serve/approvals.py``) answers with these values.
"""

from __future__ import annotations

import enum
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Final

from .contract import AuthContext, ToolDeclaration
from .result import ToolCall

__all__ = ["UNASKED", "Approval", "Approver", "Decision"]


@dataclass(frozen=True, slots=True)
class Approval:
    """A decision with who made it, for approvers that know (the audit line's
    ``approver``); ``reason`` (one short phrase) tells the model why a call was refused."""

    approved: bool
    by: str
    reason: str = ""


class _Unasked(enum.Enum):
    UNASKED = "unasked"


UNASKED: Final = _Unasked.UNASKED
"""What an approver returns when it has nobody to ask for this call: answered
``needs_approval``, as without an approver."""

Decision = bool | Approval | _Unasked
Approver = Callable[[ToolCall, ToolDeclaration, AuthContext], Awaitable[Decision] | Decision]
