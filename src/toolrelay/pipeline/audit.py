"""Stage 2a: one structured audit line per ``write``/``dangerous`` call.

Each line names the tool, call id, user, tenant, the approval decision (and who made it,
when the approver says: ``approver``) and the outcome
(``cancelled`` when the host cancelled the call). Arguments are included only when the
host opts in, and then redacted (:meth:`~toolrelay.redact.Redactor.value`: secret-named
keys masked whole, every string through the patterns). Read-only tools are not audited
unless ``everything=True``.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from typing import Any

from ..outcome import Outcome
from ..redact import Redactor, describe_exception
from . import Invocation, Next

__all__ = ["Audit", "AuditSink", "log_sink"]

AuditSink = Callable[[dict[str, Any]], None]
_LOG = logging.getLogger("toolrelay.audit")


def log_sink(record: dict[str, Any]) -> None:
    """The default sink: one JSON line on the ``toolrelay.audit`` logger."""
    _LOG.info(json.dumps(record, default=str, sort_keys=True))


class Audit:
    """``redact`` is the dispatcher's :class:`~toolrelay.redact.Redactor` (default: the
    default patterns only)."""

    __slots__ = ("arguments", "everything", "redact", "sink")

    def __init__(
        self,
        sink: AuditSink = log_sink,
        *,
        arguments: bool = False,
        everything: bool = False,
        redact: Redactor | None = None,
    ) -> None:
        self.sink = sink
        self.arguments = arguments
        self.everything = everything
        self.redact = Redactor() if redact is None else redact

    def _write(self, inv: Invocation, outcome: str) -> None:
        assert inv.tool is not None
        decl = inv.tool.decl
        record: dict[str, Any] = {
            "tool": decl.name,
            "risk": decl.risk,
            "call_id": inv.call_id,
            "user_id": inv.ctx.user_id,
            "tenant_id": inv.ctx.tenant_id,
            "decision": inv.approval,
            "outcome": outcome,
        }
        if inv.approver is not None:
            record["approver"] = inv.approver
        if self.arguments:
            record["arguments"] = self.redact.value(inv.args)  # a copy: the handler's stay
        try:
            self.sink(record)
        except Exception as exc:  # an audit failure never changes the answer or a cancellation
            # Not exc_info: the sink's error may quote the record; the traceback is redacted.
            _LOG.error(
                "toolrelay: the audit sink failed for %s\n%s",
                decl.name,
                describe_exception(exc, self.redact),
            )

    async def __call__(self, call_next: Next, inv: Invocation) -> Outcome:
        try:
            out = await call_next(inv)
        except BaseException:
            if inv.tool is not None and (self.everything or inv.tool.decl.risk != "read"):
                self._write(inv, "cancelled")
            raise
        if inv.tool is not None and (self.everything or inv.tool.decl.risk != "read"):
            self._write(inv, "ok" if out.ok else str(out.error_type))
        return out
