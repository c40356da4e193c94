"""The streamable HTTP transport, with JSON answers bounded while they are read.

The SDK reads a JSON answer whole; :func:`capped_http_client` stops its body at
``max_bytes`` (a larger ``Content-Length`` is refused unread) and the SDK answers the
waiting request with a parse error carrying :data:`~.limits.TOO_LARGE_TEXT`. SSE events are
bounded by the SDK's ``max_sse_event_size``, set to the same limit.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager

import httpx2
from mcp.client.streamable_http import streamable_http_client

from .._compat.mcp_client import TransportStreams
from ..jsonlimits import json_values
from .limits import DEFAULT_MAX_MESSAGE_VALUES, too_large, too_many

_HTTP_TIMEOUT = httpx2.Timeout(30.0, read=300.0)  # the SDK's defaults for MCP over HTTP


class MessageTooLarge(httpx2.StreamError):
    """A response body went over the transport's message limit."""


class _CappedStream(httpx2.AsyncByteStream):
    """A response body that raises :class:`MessageTooLarge` (a ``StreamError``, which the
    SDK turns into an error answer for the request) once it goes over ``max_bytes``, or
    holds more than ``max_values`` JSON values; a ``Content-Length`` over ``max_bytes`` is
    refused before anything is read. The body is passed on whole, once read."""

    def __init__(
        self, inner: httpx2.AsyncByteStream, max_bytes: int, max_values: int, declared: int
    ) -> None:
        self._inner = inner
        self._max_bytes = max_bytes
        self._max_values = max_values
        self._declared = declared

    async def __aiter__(self) -> AsyncIterator[bytes]:
        if self._declared > self._max_bytes:
            await self._inner.aclose()
            raise MessageTooLarge(too_large(self._max_bytes))
        body = bytearray()
        async for chunk in self._inner:
            body += chunk
            if len(body) > self._max_bytes:
                await self._inner.aclose()
                raise MessageTooLarge(too_large(self._max_bytes))
        if json_values(bytes(body), self._max_values) > self._max_values:
            raise MessageTooLarge(too_many(self._max_values))
        if body:
            yield bytes(body)

    async def aclose(self) -> None:
        await self._inner.aclose()


def capped_http_client(
    max_bytes: int,
    max_values: int = DEFAULT_MAX_MESSAGE_VALUES,
    *,
    headers: Mapping[str, str] | None,
    timeout: httpx2.Timeout,
) -> httpx2.AsyncClient:
    """An HTTP client whose non-SSE response bodies are refused past ``max_bytes`` or
    ``max_values``."""

    async def cap(response: httpx2.Response) -> None:
        if response.headers.get("content-type", "").lower().startswith("text/event-stream"):
            return  # bounded per event by the SDK (max_sse_event_size)
        length = response.headers.get("content-length", "")
        declared = int(length) if length.isdigit() else 0
        stream = response.stream
        if isinstance(stream, httpx2.AsyncByteStream):  # never raise here: the SDK's
            capped = _CappedStream(stream, max_bytes, max_values, declared)  # POST task would die
            response.stream = capped

    return httpx2.AsyncClient(
        headers=dict(headers or {}), timeout=timeout, event_hooks={"response": [cap]}
    )


@asynccontextmanager
async def http_transport(
    url: str, headers: Mapping[str, str] | None, max_bytes: int, max_values: int
) -> AsyncIterator[TransportStreams]:
    """The SDK's streamable HTTP transport over :func:`capped_http_client`."""
    async with (
        capped_http_client(max_bytes, max_values, headers=headers, timeout=_HTTP_TIMEOUT) as http,
        streamable_http_client(url, http_client=http, max_sse_event_size=max_bytes) as streams,
    ):
        yield streams
