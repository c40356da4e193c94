"""Approvals: what a host's approver returns for a risky call, and what it may show.

The pipeline's approve stage (:class:`~toolrelay.pipeline.approve.Approve`) asks the
approver; the gateway's approver (``serve/approvals.py``) answers with these values, and
shows a human the arguments as :func:`shown_arguments` renders them (or refuses to ask).
"""

from __future__ import annotations

import json
import re
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Final

from .contract import AuthContext, ToolDeclaration
from .redact import Redactor
from .result import ToolCall

__all__ = [
    "MAX_SHOWN_CHARS",
    "UNASKED",
    "Approval",
    "Approver",
    "Decision",
    "Unasked",
    "shown_arguments",
]

MAX_SHOWN_CHARS: Final = 2000
"""The most characters of arguments an approval shows; a call needing more is not asked."""
_SECRET: Final = (
    "an argument looks like a secret, which an approver would be shown masked: "
    "a tool gets secrets from the host (AuthContext, config), never from the model"
)
_ODD = re.compile(r"[^\n -~]")  # what may hide text: checked one character at a time


@dataclass(frozen=True, slots=True)
class Approval:
    """A decision with who made it, for approvers that know (the audit line's
    ``approver``); ``reason`` (one short phrase) tells the model why a call was refused."""

    approved: bool
    by: str
    reason: str = ""


@dataclass(frozen=True, slots=True)
class Unasked:
    """What an approver returns when it did not ask anybody about this call: answered
    ``needs_approval``, as without an approver; ``reason`` (one short phrase) says why."""

    reason: str = ""


UNASKED: Final = Unasked()
"""Nobody to ask for this call: ``needs_approval``, as without an approver."""

Decision = bool | Approval | Unasked
Approver = Callable[[ToolCall, ToolDeclaration, AuthContext], Awaitable[Decision] | Decision]


def shown_arguments(
    arguments: object, redact: Redactor, limit: int = MAX_SHOWN_CHARS
) -> str | Approval | Unasked:
    """Every argument as an approver is to be shown them, or why they cannot be shown.

    The text is JSON with keys sorted, one to a line (the order is not the model's), and
    every character that could hide or reorder text (controls, bidi and zero-width marks,
    unusual spaces) escaped as ``\\u202e``. Arguments a :class:`Redactor` would mask (a
    secret-named key, a secret-shaped value) are refused (``Approval(False, "toolrelay",
    …)``): a masked value cannot be approved knowingly. Text over ``limit`` characters is
    not cut: :class:`Unasked` with the reason, never a blind yes.
    """
    if redact.value(arguments) != arguments:
        return Approval(False, "toolrelay", _SECRET)
    text = json.dumps(arguments, ensure_ascii=False, indent=2, sort_keys=True, default=str)
    text = _ODD.sub(lambda odd: odd[0] if odd[0].isprintable() else ascii(odd[0])[1:-1], text)
    if len(text) > limit:
        return Unasked(f"its arguments take {len(text):,} characters, over the {limit:,} shown")
    return text
