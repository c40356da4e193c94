"""Stage 2a: one structured audit line per ``write``/``dangerous`` call.

Each line names the tool, call id, user, tenant, the approval decision and the outcome
(``cancelled`` when the host cancelled the call). Arguments are included only when the
host opts in. Read-only tools are not audited unless ``everything=True``.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from typing import Any

from ..outcome import Outcome
from . import Invocation, Next

__all__ = ["Audit", "AuditSink", "log_sink"]

AuditSink = Callable[[dict[str, Any]], None]
_LOG = logging.getLogger("toolrelay.audit")


def log_sink(record: dict[str, Any]) -> None:
    """The default sink: one JSON line on the ``toolrelay.audit`` logger."""
    _LOG.info(json.dumps(record, default=str, sort_keys=True))


class Audit:
    __slots__ = ("arguments", "everything", "sink")

    def __init__(
        self, sink: AuditSink = log_sink, *, arguments: bool = False, everything: bool = False
    ) -> None:
        self.sink = sink
        self.arguments = arguments
        self.everything = everything

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
        if self.arguments:
            record["arguments"] = inv.args
        try:
            self.sink(record)
        except Exception:  # an audit failure never changes the answer or a cancellation
            _LOG.exception("toolrelay: the audit sink failed for %s", decl.name)

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
