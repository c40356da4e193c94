"""What the adapters share: the answer envelope as the text a model reads."""

from __future__ import annotations

import json

from ..result import ToolResult


def envelope_text(result: ToolResult) -> str:
    """``result.to_model()`` as compact JSON text, non-ASCII characters kept as they are
    (fewer tokens than ``\\u`` escapes) — except when the text holds a lone surrogate (a
    file name decoded with ``surrogateescape``, say): no UTF-8 request body can carry one,
    so the model's next request would fail; that text is escaped (``\\udce9``) instead."""
    envelope = result.to_model()
    text = json.dumps(envelope, ensure_ascii=False, separators=(",", ":"))
    if not text.isascii():
        try:
            text.encode("utf-8")
        except UnicodeEncodeError:
            return json.dumps(envelope, separators=(",", ":"))
    return text
