"""The stdio transport: an MCP server as a local process, read with a bounded, linear reader.

The MCP SDK's stdio reader re-joins and re-splits its whole buffer on every chunk
(quadratic) and has no size limit. :func:`capped_stdio_client` spawns the server as the
SDK's ``stdio_client`` does but scans each chunk once for newlines. A message over
``max_bytes`` or ``max_values`` is never held whole nor parsed: its request is answered
with a JSON-RPC error (:data:`~.errors.MESSAGE_TOO_LARGE`) and the connection stays up,
unless the message's head does not show which request it answers (then the connection is
dropped). A response the SDK cannot parse is answered :data:`~.errors.MESSAGE_UNREADABLE`
rather than left for the deadline. Every line, the SDK's and the raw lane's
(:mod:`.rawlane`), goes through one queue to one writer task.
"""

from __future__ import annotations

import logging
import math
import sys
from collections.abc import AsyncIterator
from contextlib import AbstractAsyncContextManager, asynccontextmanager, suppress
from typing import Any, TextIO

import anyio
import anyio.lowlevel
import mcp.types as mcp_types
from mcp import MCPError
from mcp.client.stdio import StdioServerParameters, get_default_environment
from mcp.shared.message import SessionMessage

from .._compat.mcp_client import (
    TransportStreams,
    create_platform_compatible_process,
    drain_stdout,
    get_executable_command,
    parse_line,
    stop_server_process,
)
from ..jsonlimits import json_values
from .errors import MESSAGE_TOO_LARGE, MESSAGE_UNREADABLE, UNREADABLE_TEXT, closed
from .limits import DEFAULT_MAX_MESSAGE_VALUES, Lines, too_large, too_many
from .rawlane import HEAD_BYTES, RAW_ID_PREFIX, RawLane, answered_id

log = logging.getLogger("toolrelay.sources.mcp")

_WRITER_FLUSH_TIMEOUT = 0.5  # as the SDK's stdio_client
_WRITE_BATCH = 64  # lines joined into one write at most


class StdioTransport(AbstractAsyncContextManager[TransportStreams]):
    """What :func:`capped_stdio_client` returns: the SDK's transport protocol (an async
    context manager yielding the read and write streams), plus the connection's
    :class:`RawLane` (``lane``). One use only."""

    def __init__(
        self, server: StdioServerParameters, max_bytes: int, max_values: int, errlog: TextIO
    ) -> None:
        self.lane = RawLane()
        self._streams = _stdio_streams(server, max_bytes, max_values, errlog, self.lane)

    async def __aenter__(self) -> TransportStreams:
        return await self._streams.__aenter__()

    async def __aexit__(self, *exc_info: Any) -> bool | None:
        return await self._streams.__aexit__(*exc_info)


def capped_stdio_client(
    server: StdioServerParameters,
    max_bytes: int,
    max_values: int = DEFAULT_MAX_MESSAGE_VALUES,
    errlog: TextIO = sys.stderr,
) -> StdioTransport:
    """The SDK's ``stdio_client`` with a linear reader bounded at ``max_bytes`` and
    ``max_values`` a message, and a raw lane beside it."""
    return StdioTransport(server, max_bytes, max_values, errlog)


@asynccontextmanager
async def _stdio_streams(
    server: StdioServerParameters,
    max_bytes: int,
    max_values: int,
    errlog: TextIO,
    lane: RawLane,
) -> AsyncIterator[TransportStreams]:
    command = await get_executable_command(server.command)
    process = await create_platform_compatible_process(
        command=command,
        args=server.args,
        env=get_default_environment() | (server.env or {}),
        errlog=errlog,
        cwd=server.cwd,
    )
    # No awaits until the task group is entered (a cancellation would leak the process).
    read_writer, read_stream = anyio.create_memory_object_stream[SessionMessage | Exception](0)
    write_stream, write_reader = anyio.create_memory_object_stream[SessionMessage](0)
    # Every line, the SDK's and the raw lane's, is queued whole for one writer task: no
    # interleaving, and no caller waits on the pipe (the queue holds at most a line or two
    # per call in flight).
    outbox, lines_out = anyio.create_memory_object_stream[bytes](math.inf)
    writer_done = anyio.Event()
    shutting_down = False
    handed = False  # the session has taken a message since the raw lane's last answer

    def broken() -> None:
        lane.close()
        outbox.close()
        read_writer.close()  # the session sees the end too

    def write(data: bytes) -> None:
        try:
            outbox.send_nowait(data)
        except (anyio.ClosedResourceError, anyio.BrokenResourceError):
            raise closed() from None

    lane.bind(write, server.encoding, server.encoding_error_handler)

    async def refuse(head: bytes, why: str, code: int = MESSAGE_TOO_LARGE) -> bool:
        """Answer the request a refused message was for; False: drop the connection."""
        request_id = answered_id(head[:HEAD_BYTES])
        log.warning(
            "toolrelay: MCP server %s: %s; %s",
            server.command,
            why,
            "answered its request" if request_id is not None else "dropping the connection",
        )
        if request_id is None:
            return False
        if isinstance(request_id, str) and request_id.startswith(RAW_ID_PREFIX):
            lane.answer(request_id, MCPError(code=code, message=why))
            return True
        error = mcp_types.ErrorData(code=code, message=why)
        reply = mcp_types.JSONRPCError(jsonrpc="2.0", id=request_id, error=error)
        await read_writer.send(SessionMessage(reply))
        return True

    async def deliver(line: bytes) -> bool:
        """Pass one message on (or refuse it); False: drop the connection."""
        if json_values(line, max_values) > max_values:
            return await refuse(line, too_many(max_values))
        nonlocal handed
        raw_id = lane.owner(line)
        if raw_id is not None:
            if handed:
                # The session's dispatcher starts a handler for each message it has
                # taken; one turn lets those read before this answer start first (log
                # lines reach the call's client before its channel closes), as for the
                # SDK's answers. None taken since the last answer: no turn to wait.
                handed = False
                await anyio.lowlevel.checkpoint()
            lane.answer(raw_id, line)
            return True
        message = parse_line(line.decode(server.encoding, server.encoding_error_handler))
        if isinstance(message, Exception) and answered_id(line[:HEAD_BYTES]) is not None:
            # e.g. nested too deeply to parse: answer the call instead of leaving it waiting
            return await refuse(line, UNREADABLE_TEXT, MESSAGE_UNREADABLE)
        handed = True
        await read_writer.send(message)
        return True

    async def stdout_reader() -> None:
        assert process.stdout is not None
        lines = Lines(max_bytes, HEAD_BYTES)
        try:
            async with read_writer:
                try:
                    async for chunk in process.stdout:
                        for line, fits in lines.feed(chunk):
                            if fits:
                                kept = await deliver(line)
                            else:
                                kept = await refuse(line, too_large(max_bytes))
                            if not kept:  # the session must see the end before the drain
                                lane.close()
                                await read_writer.aclose()
                                return
                finally:
                    lane.close()
                    await drain_stdout(process)
        except (anyio.ClosedResourceError, anyio.BrokenResourceError, ConnectionError):
            if not shutting_down:
                log.debug("toolrelay: reading an MCP server's stdout ended", exc_info=True)

    async def sdk_messages() -> None:
        try:
            async with write_reader:
                async for message in write_reader:
                    data = message.message.model_dump_json(by_alias=True, exclude_unset=True)
                    write((data + "\n").encode(server.encoding, server.encoding_error_handler))
        except (anyio.ClosedResourceError, anyio.BrokenResourceError, MCPError):
            pass  # the connection is gone (the writer said so) or closing
        finally:
            outbox.close()  # the writer flushes what is queued, then ends

    async def stdin_writer() -> None:
        assert process.stdin is not None
        try:
            async with lines_out:
                async for data in lines_out:
                    # what else is queued goes in the same write: one wake-up of the server
                    batch = [data]
                    with suppress(anyio.WouldBlock, anyio.EndOfStream):
                        while len(batch) < _WRITE_BATCH:
                            batch.append(lines_out.receive_nowait())
                    await process.stdin.send(b"".join(batch) if len(batch) > 1 else data)
        except (anyio.ClosedResourceError, anyio.BrokenResourceError, OSError):
            broken()  # the session sees the end instead of hanging
        finally:
            writer_done.set()

    async def shutdown() -> None:
        lane.close()
        read_stream.close()
        write_stream.close()
        with anyio.move_on_after(_WRITER_FLUSH_TIMEOUT):
            await writer_done.wait()
        await stop_server_process(process)
        for stream in (read_stream, write_stream, read_writer, write_reader, outbox, lines_out):
            await stream.aclose()
        await anyio.lowlevel.checkpoint()

    async with anyio.create_task_group() as tg:
        tg.start_soon(stdout_reader)
        tg.start_soon(sdk_messages)
        tg.start_soon(stdin_writer)
        try:
            yield read_stream, write_stream
        finally:
            shutting_down = True
            with anyio.CancelScope(shield=True):  # bounded: the process must not leak
                await shutdown()
            tg.cancel_scope.cancel()
