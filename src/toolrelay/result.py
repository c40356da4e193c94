"""What the host hands in (``ToolCall``) and gets back (``ToolResult``)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from .contract import ErrorType

MAX_CALL_ID_CHARS = 128
"""The longest call id kept; a longer one is cut (and ends with ``…``)."""


def safe_call_id(call_id: object) -> str | None:
    """``call_id`` as every sink (result, audit line, span, approver) gets it: a string of
    at most :data:`MAX_CALL_ID_CHARS` printable characters. Anything not printable
    (control characters, line breaks, …) becomes ``?``; a non-string id is ``str()``-ed."""
    if call_id is None:
        return None
    text = call_id if isinstance(call_id, str) else str(call_id)
    if len(text) > MAX_CALL_ID_CHARS:
        text = text[: MAX_CALL_ID_CHARS - 1] + "…"
    if not text.isprintable():
        text = "".join(ch if ch.isprintable() else "?" for ch in text)
    return text


@dataclass(frozen=True, slots=True)
class ToolCall:
    """One tool call as the model asked for it. ``arguments`` is raw JSON text or a dict."""

    name: str
    arguments: str | bytes | Mapping[str, Any] = "{}"
    call_id: str | None = None


@dataclass(frozen=True, slots=True)
class ToolResult:
    """The answer to one call, with what the host needs and the model does not."""

    ok: bool
    tool: str
    call_id: str | None
    data: Any = None
    error_type: ErrorType | None = None
    message: str = ""
    retryable: bool = False
    retry_after_s: float | None = None
    duration_s: float = 0.0
    attempts: int = 0
    breaker_key: str | None = None
    effect_unknown: bool = False
    """A tool that is not idempotent failed or was stopped after it may have taken effect:
    calling it again may repeat the effect (the answer is not retryable)."""
    served_by: str | None = None
    """The fallback tool that answered instead of ``tool`` (its breaker was open, it was
    overloaded, or it timed out with time left: ``docs/fallbacks.md``); ``None`` otherwise."""
    deprecated: Mapping[str, str] | None = None
    """A deprecated tool's hint, ``{"use": successor, "sunset": ...}`` (``docs/catalog.md``)."""

    def to_model(self) -> dict[str, Any]:
        """The stable JSON envelope the model reads."""
        if self.ok:
            if self.served_by is None and self.deprecated is None:
                return {"ok": True, "data": self.data}
            answer: dict[str, Any] = {"ok": True, "data": self.data}
        else:
            answer = {
                "ok": False,
                "error_type": str(self.error_type),
                "message": self.message,
                "retryable": self.retryable,
            }
            if self.retry_after_s is not None:
                answer["retry_after_s"] = round(self.retry_after_s, 3)
            if self.effect_unknown:
                answer["effect_unknown"] = True
        if self.served_by is not None:
            answer["served_by"] = self.served_by
        if self.deprecated is not None:
            answer["deprecated"] = dict(self.deprecated)
        return answer
