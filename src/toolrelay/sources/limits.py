"""How much one message from an MCP server may hold, and the text of a refusal.

Plain Python (no MCP SDK): the options model and the gateway's settings read the defaults
without importing the SDK. The transports (:mod:`.stdio`, :mod:`.http`) apply the bounds.
"""

from __future__ import annotations

__all__ = [
    "DEFAULT_MAX_MESSAGE_BYTES",
    "DEFAULT_MAX_MESSAGE_VALUES",
    "TOO_LARGE_TEXT",
    "too_large",
    "too_many",
]

DEFAULT_MAX_MESSAGE_BYTES = 4 * 1024 * 1024
"""The default bound on one message from an MCP server (4 MiB)."""

DEFAULT_MAX_MESSAGE_VALUES = 50_000
"""The default bound on the JSON values in one message (parsing is ~1 µs a value, on the
event loop)."""

TOO_LARGE_TEXT = "toolrelay refused a message"
"""The start of every refusal's text, on stdio and on HTTP."""


def too_large(max_bytes: int) -> str:
    return f"{TOO_LARGE_TEXT} larger than {max_bytes} bytes"


def too_many(max_values: int) -> str:
    return f"{TOO_LARGE_TEXT} with more than {max_values} JSON values"
