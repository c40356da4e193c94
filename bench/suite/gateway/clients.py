"""The clients: the MCP SDK's sessions, and the light load generator (h11 and JSON-RPC by
hand) that saturates a server; a round's samples (latencies, wall time, CPU on each side)."""

from __future__ import annotations

import contextlib
import functools
import gc
import json
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass

import anyio
import anyio.abc
import h11
import httpx2
from mcp import ClientSession
from mcp.client.streamable_http import streamable_http_client

from .servers import Server

ARGS = {"text": "hello"}
PROGRESS_STEPS = 10
"""How many progress notifications a call of the ``progress`` tool asks for."""
RESOURCE = "echo://text"


@contextlib.asynccontextmanager
async def sessions(server: Server, count: int) -> AsyncIterator[None]:
    async with contextlib.AsyncExitStack() as stack:
        http = await stack.enter_async_context(
            httpx2.AsyncClient(timeout=httpx2.Timeout(30.0, read=60.0))
        )
        for _ in range(count):
            read, write = await stack.enter_async_context(
                streamable_http_client(server.url, http_client=http)
            )
            session = await stack.enter_async_context(ClientSession(read, write))
            await session.initialize()
            server.sessions.append(session)
        listing = await server.sessions[0].list_tools()
        names = [tool.name for tool in listing.tools if tool.name.endswith("echo")]
        if len(names) != 1:
            raise RuntimeError(f"{server.name} lists {[t.name for t in listing.tools]}")
        server.tool = names[0]
        progress = [tool.name for tool in listing.tools if tool.name.endswith("progress")]
        server.progress_tool = progress[0] if progress else "progress"
        yield
        server.sessions.clear()


async def call(server: Server, session: ClientSession) -> None:
    result = await session.call_tool(server.tool, ARGS)
    text = getattr(result.content[0], "text", None) if result.content else None
    if result.is_error or text != ARGS["text"]:
        raise RuntimeError(f"{server.name} answered {result.model_dump(exclude_none=True)}")


async def read(server: Server, session: ClientSession) -> None:
    result = await session.read_resource(RESOURCE)
    text = getattr(result.contents[0], "text", None) if result.contents else None
    if text != ARGS["text"]:
        raise RuntimeError(f"{server.name} read {result.model_dump(exclude_none=True)}")


async def progress(server: Server, session: ClientSession) -> None:
    """One call of the ``progress`` tool; how many notifications came back is recorded
    (a gateway that drops them still answers: the table shows it)."""
    seen = 0

    async def counted(progress: float, total: float | None, message: str | None) -> None:
        nonlocal seen
        seen += 1

    arguments = {"steps": PROGRESS_STEPS}
    result = await session.call_tool(server.progress_tool, arguments, progress_callback=counted)
    text = getattr(result.content[0], "text", None) if result.content else None
    if result.is_error or text != "done":
        raise RuntimeError(f"{server.name} answered {result.model_dump(exclude_none=True)}")
    server.progress_seen.append(seen)


OPERATIONS: dict[str, Callable[[Server, ClientSession], Awaitable[None]]] = {
    "resources/read": read,
    f"tools/call with {PROGRESS_STEPS} progress notifications": progress,
}
"""The rows beyond a plain ``tools/call``: measured with one SDK client."""


async def measure_operation(server: Server, operation: str, calls: int) -> Sample:
    caller = functools.partial(OPERATIONS[operation], server, server.sessions[0])
    return await timed(server, [caller], calls)


# -- the light load generator ----------------------------------------------------------------
HANDSHAKE = "2025-06-18"
"""The protocol version the light client offers (a handshake-era one every server speaks)."""


class LightSession:
    """One keep-alive HTTP/1.1 connection with an MCP session of its own, speaking the
    streamable HTTP transport by hand (h11, JSON-RPC built as bytes): a client that costs
    0.4-0.6 ms of CPU a call where the SDK's costs 2-3 ms, so that at saturation it is the
    server that limits the calls per second, not the client sharing its machine."""

    def __init__(self, server: Server) -> None:
        self.server = server
        self.stream: anyio.abc.SocketStream | None = None
        self.conn = h11.Connection(h11.CLIENT)
        self.headers: list[tuple[str, str]] = []
        self.ids = 0

    async def connect(self) -> None:
        if self.stream is not None:
            await self.stream.aclose()
        self.stream = await anyio.connect_tcp("127.0.0.1", self.server.port)
        self.conn = h11.Connection(h11.CLIENT)

    async def open(self) -> None:
        await self.connect()
        params = {
            "protocolVersion": HANDSHAKE,
            "capabilities": {},
            "clientInfo": {"name": "bench-light", "version": "1"},
        }
        status, headers, body = await self.post(self.request("initialize", params))
        answer = self.answer(headers, body)
        session = dict(headers).get(b"mcp-session-id")
        if status != 200 or session is None or "result" not in answer:
            raise RuntimeError(f"{self.server.name} refused initialize: {status} {body[:200]!r}")
        version = answer["result"]["protocolVersion"]
        self.headers = [("Mcp-Session-Id", session.decode()), ("MCP-Protocol-Version", version)]
        note = b'{"jsonrpc":"2.0","method":"notifications/initialized"}'
        status, _, body = await self.post(note)
        if status not in (200, 202):
            raise RuntimeError(f"{self.server.name} refused initialized: {status} {body[:200]!r}")

    def request(self, method: str, params: dict[str, object]) -> bytes:
        self.ids += 1
        return json.dumps(
            {"jsonrpc": "2.0", "id": self.ids, "method": method, "params": params}
        ).encode()

    async def post(self, body: bytes) -> tuple[int, list[tuple[bytes, bytes]], bytes]:
        """POST ``body``; a connection the server closed while idle (uvicorn's keep-alive
        timeout is 5 s, and a round measures the other servers meanwhile) is opened again."""
        try:
            return await self._post(body)
        except (anyio.EndOfStream, anyio.BrokenResourceError):
            await self.connect()
            return await self._post(body)

    async def _post(self, body: bytes) -> tuple[int, list[tuple[bytes, bytes]], bytes]:
        assert self.stream is not None
        conn = self.conn
        headers = [
            ("Host", f"127.0.0.1:{self.server.port}"),
            ("Content-Type", "application/json"),
            ("Accept", "application/json, text/event-stream"),
            ("Content-Length", str(len(body))),
            *self.headers,
        ]
        data = conn.send(h11.Request(method="POST", target="/mcp", headers=headers))
        data = (data or b"") + (conn.send(h11.Data(data=body)) or b"")
        await self.stream.send(data + (conn.send(h11.EndOfMessage()) or b""))
        status, got, chunks = 0, [], []
        while True:
            event = conn.next_event()
            if event is h11.NEED_DATA:
                conn.receive_data(await self.stream.receive(65536))
            elif isinstance(event, h11.Response):
                status, got = event.status_code, list(event.headers)
            elif isinstance(event, h11.Data):
                chunks.append(bytes(event.data))
            elif isinstance(event, h11.EndOfMessage):
                break
            elif isinstance(event, h11.ConnectionClosed):
                raise anyio.EndOfStream
        conn.start_next_cycle()
        return status, got, b"".join(chunks)

    @staticmethod
    def answer(headers: list[tuple[bytes, bytes]], body: bytes) -> dict[str, object]:
        """The JSON-RPC answer in a JSON body or in an SSE stream's data lines."""
        if dict(headers).get(b"content-type", b"").startswith(b"text/event-stream"):
            for line in body.splitlines():
                if line.startswith(b"data:"):
                    message = json.loads(line[5:])
                    if isinstance(message, dict) and "id" in message:
                        return message
            return {}
        message = json.loads(body)
        return message if isinstance(message, dict) else {}

    async def call(self) -> None:
        body = self.request("tools/call", {"name": self.server.tool, "arguments": ARGS})
        status, headers, raw = await self.post(body)
        answer = self.answer(headers, raw)
        result = answer.get("result")
        content = result.get("content") if isinstance(result, dict) else None
        text = content[0].get("text") if isinstance(content, list) and content else None
        if status != 200 or text != ARGS["text"]:
            raise RuntimeError(f"{self.server.name} answered {status} {raw[:300]!r}")

    async def aclose(self) -> None:
        if self.stream is not None:
            await self.stream.aclose()


@contextlib.asynccontextmanager
async def light_sessions(server: Server, count: int) -> AsyncIterator[list[LightSession]]:
    opened = [LightSession(server) for _ in range(count)]
    try:
        for session in opened:
            await session.open()
        yield opened
    finally:
        for session in opened:
            await session.aclose()


@dataclass
class Sample:
    latencies: list[float]
    wall_s: float
    cpu_s: float
    calls: int
    upstream_cpu_s: float = 0.0
    client_cpu_s: float = 0.0


async def timed(
    server: Server, callers: Sequence[Callable[[], Awaitable[None]]], each: int
) -> Sample:
    """Every caller makes ``each`` calls back to back, all callers at once; the wall time,
    the server's (and its upstream's) CPU and this process's CPU over the whole of it."""
    latencies: list[float] = []

    async def worker(call_once: Callable[[], Awaitable[None]]) -> None:
        for _ in range(each):
            began = time.perf_counter()
            await call_once()
            latencies.append(time.perf_counter() - began)

    gc.collect()
    cpu, upstream, client = server.cpu_s(), server.children_cpu_s(), time.process_time()
    began = time.perf_counter()
    async with anyio.create_task_group() as tg:
        for caller in callers:
            tg.start_soon(worker, caller)
    wall = time.perf_counter() - began
    return Sample(
        latencies,
        wall,
        server.cpu_s() - cpu,
        each * len(callers),
        server.children_cpu_s() - upstream,
        time.process_time() - client,
    )


async def measure(server: Server, clients: int, calls: int) -> Sample:
    """``calls`` calls through ``clients`` of the SDK's sessions at once."""
    callers = [functools.partial(call, server, session) for session in server.sessions[:clients]]
    return await timed(server, callers, max(1, calls // clients))


async def saturate(server: Server, light: Sequence[LightSession], calls: int) -> Sample:
    """``calls`` calls over the light sessions at once, each calling back to back."""
    return await timed(server, [session.call for session in light], max(1, calls // len(light)))
