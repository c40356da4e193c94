"""MCP client transports that bound the size of one message while it is read.

The MCP SDK's stdio reader is quadratic in a message's size and unbounded, and its HTTP
reader reads a JSON answer whole: an upstream answering with tens of megabytes would hold
the event loop for seconds. These transports stand in front of the SDK's session (what
:meth:`McpSource.stdio <toolrelay.sources.mcp.McpSource.stdio>` and
:meth:`~toolrelay.sources.mcp.McpSource.http` use; a host building its own transport for
``McpSource(...)`` can use them too):

- :func:`capped_stdio_client` (:mod:`.stdio`): a linear reader bounded at ``max_bytes``
  and ``max_values`` a message, refusing an oversized answer's request with
  :data:`MESSAGE_TOO_LARGE`, and the :class:`RawLane` beside the SDK's session
  (:mod:`.rawlane`).
- :func:`capped_http_client` (:mod:`.http`): an HTTP client whose JSON answers stop at the
  same bounds (SSE events are bounded by the SDK's ``max_sse_event_size``).
"""

from __future__ import annotations

from .errors import MESSAGE_TOO_LARGE, UNREADABLE_TEXT
from .http import MessageTooLarge, capped_http_client
from .limits import DEFAULT_MAX_MESSAGE_BYTES, DEFAULT_MAX_MESSAGE_VALUES, TOO_LARGE_TEXT
from .rawlane import RawLane
from .stdio import StdioTransport, capped_stdio_client

__all__ = [
    "DEFAULT_MAX_MESSAGE_BYTES",
    "DEFAULT_MAX_MESSAGE_VALUES",
    "MESSAGE_TOO_LARGE",
    "TOO_LARGE_TEXT",
    "UNREADABLE_TEXT",
    "MessageTooLarge",
    "RawLane",
    "StdioTransport",
    "capped_http_client",
    "capped_stdio_client",
]
