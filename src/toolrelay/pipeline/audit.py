"""Audit: one structured audit line per ``write``/``dangerous`` call.

Each line names the tool, call id, user, tenant, the approval decision (and who made it,
when the approver says: ``approver``) and the outcome
(``cancelled`` when the host cancelled the call). Arguments are included only when the
host opts in, and then redacted (:meth:`~toolrelay.redact.Redactor.value`: secret-named
keys masked whole, every string through the patterns). Read-only tools are not audited.
"""

from __future__ import annotations

import dataclasses
import json
import logging
from collections.abc import Awaitable, Callable
from typing import Any

from ..outcome import Outcome
from ..redact import Redactor, describe_exception
from . import Invocation, Next

AuditSink = Callable[[dict[str, Any]], None]
_LOG = logging.getLogger("toolrelay.audit")


def log_sink(record: dict[str, Any]) -> None:
    """The default sink: one JSON line on the ``toolrelay.audit`` logger."""
    _LOG.info(json.dumps(record, default=str, sort_keys=True))


class Audit:
    """``redact`` is the dispatcher's :class:`~toolrelay.redact.Redactor`."""

    __slots__ = ("arguments", "redact", "sink")

    def __init__(self, sink: AuditSink, *, arguments: bool, redact: Redactor) -> None:
        self.sink = sink
        self.arguments = arguments
        self.redact = redact

    def __call__(self, call_next: Next, inv: Invocation) -> Awaitable[Outcome]:
        tool = inv.tool
        if tool is None or tool.decl.risk == "read":
            return call_next(inv)  # no line to write: no coroutine frame of its own
        return self._watch(call_next, inv)

    async def _watch(self, call_next: Next, inv: Invocation) -> Outcome:
        seen = _Seen(inv)
        try:
            out = await call_next(dataclasses.replace(inv, audit=seen.note))
        except BaseException:
            self._write(seen, seen.inv, "cancelled")
            raise
        asked = out.request if out.request is not None else seen.inv
        self._write(seen, asked, "ok" if out.ok else str(out.error_type))
        return out

    def _write(self, seen: _Seen, asked: Invocation, outcome: str) -> None:
        """One line: ``asked`` is the latest invocation known (its arguments decoded, if
        they were)."""
        decl = seen.call.decl
        inv = seen.inv
        record: dict[str, Any] = {
            "tool": decl.name,
            "risk": decl.risk,
            "call_id": inv.call_id,
            "user_id": inv.ctx.user_id,
            "tenant_id": inv.ctx.tenant_id,
            "decision": seen.decision,
            "outcome": outcome,
        }
        if seen.approver is not None:
            record["approver"] = seen.approver
        if self.arguments:
            record["arguments"] = self.redact.value(asked.args)  # a copy: the handler's stay
        try:
            self.sink(record)
        except Exception as exc:  # an audit failure never changes the answer or a cancellation
            # Not exc_info: the sink's error may quote the record; the traceback is redacted.
            _LOG.error(
                "toolrelay: the audit sink failed for %s\n%s",
                decl.name,
                describe_exception(exc, self.redact),
            )


class _Seen:
    """What the audit stage heard of one call it watches: the resolve stage's (policy) and approve
    stage's decision (``not_required`` unless one came), who made it, and the latest
    invocation they saw."""

    __slots__ = ("approver", "call", "decision", "inv")

    def __init__(self, inv: Invocation) -> None:
        assert inv.tool is not None
        self.call = inv.tool
        self.inv = inv
        self.decision = "not_required"
        self.approver: str | None = None

    def note(self, inv: Invocation, decision: str, approver: str | None) -> None:
        self.inv = inv
        self.decision = decision
        if approver is not None:
            self.approver = approver
