"""How much one message from an MCP server may hold, and the text of a refusal.

Plain Python (no MCP SDK): the options model and the gateway's settings read the defaults
without importing the SDK. The transports (:mod:`.stdio`, :mod:`.http`) apply the bounds.
"""

from __future__ import annotations

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


class Lines:
    """Splits a byte stream into newline-terminated messages, each byte scanned once; a
    message over ``max_bytes`` comes out as ``(its first head bytes, False)`` and is
    otherwise dropped as it arrives. :attr:`rest` is what follows the last newline."""

    def __init__(self, max_bytes: int, head: int) -> None:
        self.max_bytes = max_bytes
        self.head = head
        self._buf = bytearray()
        self._scanned = 0  # no newline in _buf[:_scanned]
        self._skipping = False  # inside an oversized message: discard up to its newline

    def feed(self, chunk: bytes) -> list[tuple[bytes, bool]]:
        out: list[tuple[bytes, bool]] = []
        if self._skipping:
            end = chunk.find(b"\n")
            if end < 0:
                return out
            self._skipping = False
            chunk = chunk[end + 1 :]
        self._buf += chunk
        while True:
            end = self._buf.find(b"\n", self._scanned)
            if end < 0:
                if len(self._buf) > self.max_bytes:
                    out.append((bytes(self._buf[: self.head]), False))
                    self._buf = bytearray()  # give the memory back now
                    self._skipping = True
                    self._scanned = 0
                else:
                    self._scanned = len(self._buf)
                return out
            if end > self.max_bytes:
                out.append((bytes(self._buf[: self.head]), False))
            else:
                out.append((bytes(self._buf[:end]), True))
            del self._buf[: end + 1]
            self._scanned = 0
            if not self._buf:
                self._buf = bytearray()

    @property
    def rest(self) -> bytes:
        return bytes(self._buf)
