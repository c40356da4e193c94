"""The MCP gateway side by side: a bare upstream, ``mcp-proxy``, and ``toolrelay serve``.

    python bench/gateway.py [--quick] [--rounds N] [--calls N] [--variant NAME=TOML]...
                            [--no-mcp-proxy] [--profile SECONDS]

Servers, each its own process on a loopback port, serving streamable HTTP at ``/mcp``:

* ``upstream``: bench/gateway_echo.py, the MCP SDK's low-level ``Server`` with one ``echo``
  tool, on the SDK's default HTTP settings; ``upstream[json]``: the same with
  ``json_response=True`` (what the in-process plugin is compared with, too);
* ``mcp-proxy``: the PyPI ``mcp-proxy`` in front of the same server over stdio, installed
  by this script into its own venv (it pins ``mcp<2``) under
  ``$XDG_CACHE_HOME/toolrelay/bench-mcp-proxy`` (else ``~/.cache/…``); skipped, with a
  line saying why, when it cannot be installed;
* ``toolrelay``: ``toolrelay serve`` with the same server as an upstream over stdio;
* ``toolrelay-plugin``: ``toolrelay serve`` with the tool as an in-process plugin;
* one more toolrelay pair per ``--variant NAME=TOML``: ``TOML`` lines added to the config's
  ``[serve.http]`` table (``--variant json='json_response = true'``), except lines starting
  with ``upstream.``, which go to the upstream's table without that prefix
  (``upstream.protocol = "legacy"``), and lines starting with ``!``: Python run in the
  gateway before it starts
  (``--variant nofreeze='!import gc; gc.freeze = lambda: None'``: what a change buys;
  ``!import toolrelay.sources.mcp_connection as m; m.stamped_meta = lambda client: None``
  sends the upstream's ``tools/call`` through the SDK's session instead of the raw lane).

The client is the MCP SDK's Python client (``ClientSession`` over
``streamable_http_client``, the 2025-era handshake every server here speaks), in this
process: 1 client making calls one after another, then 8 clients at once (8 sessions,
each calling in turn). Every server is measured in every round, the order alternating
round by round. Per server: p50 and p99 of the call latencies of all rounds, calls/s (the
median of the rounds' calls / wall time), the server process's CPU time per call (its
``utime + stime`` from ``/proc``, the gateway process alone, not its upstream) and its RSS
at the end. Ratios against the targets of issue 19 are the median of the per-round ratios.

Then every server is **saturated**: 8 keep-alive connections of a light client
(:class:`LightSession`: h11, JSON-RPC written by hand, its own MCP session on each
connection, the same handshake), each calling back to back, rounds interleaved as above.
The SDK's client costs 2-3 ms of CPU a call in this process, more than a gateway and its
upstream together, so with 8 SDK sessions the calls per second measure the client as much
as the server; the light client costs 0.4-0.6 ms, so saturated it is the server (and its
upstream) that sets the rate. The throughput target (≥ 1.2× mcp-proxy's) is checked on
the saturated row, and so are the 8-client targets of the in-process plugin against the
bare server (p50 and calls/s within 1.05×); the 8-SDK-client rates, and the plugin's
8-SDK-client p50, are shown for context.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import gc
import json
import math
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import anyio
import anyio.abc
import h11
import httpx2
from mcp import ClientSession
from mcp.client.streamable_http import streamable_http_client

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
ECHO = HERE / "gateway_echo.py"
MCP_PROXY_VERSION = "mcp-proxy==0.13.0"
CONCURRENCY = (1, 8)
TICKS = os.sysconf("SC_CLK_TCK")
PAGE = os.sysconf("SC_PAGE_SIZE")
ARGS = {"text": "hello"}
UPSTREAMS = {"upstream": [], "upstream[json]": ["--json"]}
"""The bare server: on the SDK's default HTTP settings (SSE answers), and with JSON answers."""


# -- the servers ----------------------------------------------------------------------------
def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "toolrelay" / "bench-mcp-proxy"


def mcp_proxy() -> tuple[Path | None, str]:
    """The ``mcp-proxy`` executable in its own venv (installed on first use), or why not."""
    venv = cache_dir()
    exe = venv / "bin" / "mcp-proxy"
    if exe.exists():
        return exe, ""
    shutil.rmtree(venv, ignore_errors=True)
    try:
        subprocess.run(
            [sys.executable, "-m", "venv", str(venv)], check=True, capture_output=True, timeout=300
        )
        pip = [str(venv / "bin" / "python"), "-m", "pip", "install", "-q", MCP_PROXY_VERSION]
        proc = subprocess.run(pip, capture_output=True, text=True, timeout=600)
    except (OSError, subprocess.SubprocessError) as exc:
        return None, f"cannot create a venv for mcp-proxy: {exc}"
    if proc.returncode != 0 or not exe.exists():
        shutil.rmtree(venv, ignore_errors=True)
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-1:] or ["?"]
        return None, f"pip install {MCP_PROXY_VERSION} failed: {tail[0]}"
    return exe, ""


@dataclass
class Server:
    name: str
    command: list[str]
    port: int
    env: dict[str, str] = field(default_factory=dict)
    proc: subprocess.Popen[bytes] | None = None
    tool: str = ""
    sessions: list[ClientSession] = field(default_factory=list)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/mcp"

    def cpu_s(self) -> float:
        assert self.proc is not None
        fields = Path(f"/proc/{self.proc.pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / TICKS

    def children_cpu_s(self) -> float:
        """CPU time of the server's child processes (its upstream), 0 for none."""
        assert self.proc is not None
        total = 0.0
        for task in Path(f"/proc/{self.proc.pid}/task").iterdir():
            for child in (task / "children").read_text().split():
                with contextlib.suppress(OSError):
                    stat = Path(f"/proc/{child}/stat").read_text().rsplit(")", 1)[1].split()
                    total += (int(stat[11]) + int(stat[12])) / TICKS
        return total

    def rss_mb(self) -> float:
        assert self.proc is not None
        pages = int(Path(f"/proc/{self.proc.pid}/statm").read_text().split()[1])
        return pages * PAGE / 1e6


def toolrelay_config(
    workdir: Path, name: str, port: int, upstream: bool, http: str, upstream_toml: str = ""
) -> Path:
    path = workdir / f"{name}.toml"
    lines = []
    if upstream:
        command = [sys.executable, str(ECHO)]
        lines += ["[serve.upstreams.echo]", f"command = {json.dumps(command)}"]
        lines += ['breaker_key = "echo"', "timeout_s = 10", upstream_toml]
    else:
        lines += ["[plugins.echo]", 'module = "gateway_echo"']
    lines += ["[serve]", 'transport = "http"', "[serve.http]", f"port = {port}"]
    lines += ["max_sessions = 100", "max_sessions_per_client = 100", http]
    path.write_text("\n".join(lines) + "\n")
    return path


def toolrelay_command(config: Path, prelude: str) -> list[str]:
    if not prelude:
        return [sys.executable, "-m", "toolrelay", "serve", "--config", str(config)]
    code = f"{prelude}\nimport runpy\nrunpy.run_module('toolrelay', run_name='__main__')"
    return [sys.executable, "-c", code, "serve", "--config", str(config)]


def plan(workdir: Path, variants: Sequence[tuple[str, str]], proxy: bool) -> list[Server]:
    env = {"PYTHONPATH": os.pathsep.join([str(HERE), os.environ.get("PYTHONPATH", "")])}
    echo = [sys.executable, str(ECHO), "--http", "{port}"]
    servers = [Server(name, echo + extra, free_port()) for name, extra in UPSTREAMS.items()]
    if proxy:
        exe, why = mcp_proxy()
        if exe is None:
            print(f"mcp-proxy: skipped ({why})", file=sys.stderr)
        else:
            command = [str(exe), "--host", "127.0.0.1", "--port", "{port}"]
            command += ["--log-level", "WARNING", "--", sys.executable, str(ECHO)]
            servers.append(Server("mcp-proxy", command, free_port()))
    for label, extra in [("", ""), *variants]:
        lines = extra.splitlines()
        prelude = "\n".join(line[1:] for line in lines if line.startswith("!"))
        of_upstream = "\n".join(line[9:] for line in lines if line.startswith("upstream."))
        http = "\n".join(line for line in lines if not line.startswith(("!", "upstream.")))
        for kind, upstream in (("toolrelay", True), ("toolrelay-plugin", False)):
            name = f"{kind}[{label}]" if label else kind
            port = free_port()
            config = toolrelay_config(workdir, name, port, upstream, http, of_upstream)
            servers.append(Server(name, toolrelay_command(config, prelude), port, env))
    return servers


@contextlib.contextmanager
def running(servers: Sequence[Server], workdir: Path) -> Iterator[None]:
    try:
        for server in servers:
            command = [part.replace("{port}", str(server.port)) for part in server.command]
            err = (workdir / f"{server.name}.err").open("wb")
            server.proc = subprocess.Popen(
                command,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=err,
                env={**os.environ, **server.env},
                cwd=workdir,
                start_new_session=True,
            )
        yield
    finally:
        for server in servers:
            if server.proc is not None and server.proc.poll() is None:
                server.proc.terminate()
        for server in servers:
            if server.proc is None:
                continue
            try:
                server.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                server.proc.kill()
                server.proc.wait()


# -- the clients ----------------------------------------------------------------------------
async def wait_listening(server: Server, workdir: Path, timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while True:
        assert server.proc is not None
        if server.proc.poll() is not None:
            log = (workdir / f"{server.name}.err").read_text(errors="replace")[-2000:]
            raise RuntimeError(f"{server.name} exited ({server.proc.returncode}):\n{log}")
        try:
            stream = await anyio.connect_tcp("127.0.0.1", server.port)
        except OSError:
            if time.monotonic() > deadline:
                raise RuntimeError(f"{server.name} is not listening on {server.port}") from None
            await anyio.sleep(0.05)
        else:
            await stream.aclose()
            return


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
        yield
        server.sessions.clear()


async def call(server: Server, session: ClientSession) -> None:
    result = await session.call_tool(server.tool, ARGS)
    text = getattr(result.content[0], "text", None) if result.content else None
    if result.is_error or text != ARGS["text"]:
        raise RuntimeError(f"{server.name} answered {result.model_dump(exclude_none=True)}")


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


# -- the report -----------------------------------------------------------------------------
def percentile(values: Sequence[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[max(0, math.ceil(q / 100 * len(ordered)) - 1)]


@dataclass
class Figures:
    p50_ms: float
    p99_ms: float
    rate: float
    cpu_ms: float
    upstream_cpu_ms: float
    client_cpu_ms: float

    @classmethod
    def of(cls, samples: Sequence[Sample]) -> Figures:
        pooled = [x for s in samples for x in s.latencies]
        return cls(
            percentile(pooled, 50) * 1e3,
            percentile(pooled, 99) * 1e3,
            statistics.median(s.calls / s.wall_s for s in samples),
            statistics.median(s.cpu_s / s.calls for s in samples) * 1e3,
            statistics.median(s.upstream_cpu_s / s.calls for s in samples) * 1e3,
            statistics.median(s.client_cpu_s / s.calls for s in samples) * 1e3,
        )


def round_ratio(top: Sequence[Sample], bottom: Sequence[Sample], what: str) -> float:
    def figure(s: Sample) -> float:
        if what == "rate":
            return s.calls / s.wall_s
        return percentile(s.latencies, 50 if what == "p50" else 99)

    return statistics.median(figure(a) / figure(b) for a, b in zip(top, bottom, strict=True))


@dataclass(frozen=True)
class Ratio:
    """One target of issue 19: ``value`` against ``target`` (at least or at most)."""

    name: str
    value: float
    target: float | None
    """``None``: shown for context, no target."""
    at_least: bool
    label: str = ""
    """The toolrelay configuration judged: "" (as configured by default) or a variant's name."""

    @property
    def passed(self) -> bool:
        if self.target is None:
            return True
        return self.value >= self.target if self.at_least else self.value <= self.target

    @property
    def shown_target(self) -> str:
        if self.target is None:
            return "—"
        return f"{'≥' if self.at_least else '≤'} {self.target:g}×"


@dataclass
class Comparison:
    servers: list[str]
    labels: list[str]
    """"" (toolrelay as configured by default), then each variant's name"""
    results: dict[tuple[str, int], list[Sample]]
    rss: dict[str, float]
    saturated: dict[str, list[Sample]] = field(default_factory=dict)
    """Per server: the rounds of :func:`saturate` (the light client, 8 connections)."""

    def figures(self, server: str, clients: int) -> Figures:
        return Figures.of(self.results[server, clients])

    def ratios(self) -> list[Ratio]:
        out: list[Ratio] = []
        light = "saturated (8 light connections)"
        for label in self.labels:
            tag = f"[{label}]" if label else ""
            tr, plugin = f"toolrelay{tag}", f"toolrelay-plugin{tag}"

            def add(
                name: str,
                top: Sequence[Sample],
                bottom: Sequence[Sample],
                what: str,
                target: float | None,
                at_least: bool = False,
                label: str = label,
            ) -> None:
                value = round_ratio(top, bottom, what)
                out.append(Ratio(name, value, target, at_least, label))

            if "mcp-proxy" in self.servers:
                for clients in CONCURRENCY:
                    top, bottom = self.results[tr, clients], self.results["mcp-proxy", clients]
                    name = f"{tr} / mcp-proxy, {clients} client(s)"
                    add(f"p50 {name}", top, bottom, "p50", 0.9)
                    add(f"p99 {name}", top, bottom, "p99", 1.0)
                top, bottom = self.results[tr, 8], self.results["mcp-proxy", 8]
                name = f"calls/s {tr} / mcp-proxy, 8 SDK clients (client-bound)"
                add(name, top, bottom, "rate", None, at_least=True)
                if self.saturated:
                    top, bottom = self.saturated[tr], self.saturated["mcp-proxy"]
                    add(f"calls/s {tr} / mcp-proxy, {light}", top, bottom, "rate", 1.2, True)
            for bare in UPSTREAMS:
                for clients in CONCURRENCY:
                    # Eight SDK clients cost more CPU than either server: context only.
                    target = 1.05 if clients == 1 or not self.saturated else None
                    top, bottom = self.results[plugin, clients], self.results[bare, clients]
                    how = "1 client(s)" if clients == 1 else "8 SDK clients (client-bound)"
                    add(f"p50 {plugin} / {bare}, {how}", top, bottom, "p50", target)
                    add(f"calls/s {bare} / {plugin}, {how}", bottom, top, "rate", target)
                if self.saturated:
                    top, bottom = self.saturated[plugin], self.saturated[bare]
                    add(f"p50 {plugin} / {bare}, {light}", top, bottom, "p50", 1.05)
                    add(f"calls/s {bare} / {plugin}, {light}", bottom, top, "rate", 1.05)
        return out

    def table(self) -> str:
        out = [
            "| server | clients | p50 | p99 | calls/s | server CPU/call "
            "| its upstream's | the clients' | RSS |"
        ]
        out.append("|---|---:|---:|---:|---:|---:|---:|---:|---:|")
        for clients in CONCURRENCY:
            for server in self.servers:
                f = self.figures(server, clients)
                out.append(
                    f"| {server} | {clients} | {f.p50_ms:.2f} ms | {f.p99_ms:.2f} ms | "
                    f"{f.rate:,.0f} | {f.cpu_ms:.2f} ms | {f.upstream_cpu_ms:.2f} ms | "
                    f"{f.client_cpu_ms:.2f} ms | {self.rss[server]:.0f} MB |"
                )
        for server, samples in self.saturated.items():
            f = Figures.of(samples)
            out.append(
                f"| {server} | 8 light | {f.p50_ms:.2f} ms | {f.p99_ms:.2f} ms | "
                f"{f.rate:,.0f} | {f.cpu_ms:.2f} ms | {f.upstream_cpu_ms:.2f} ms | "
                f"{f.client_cpu_ms:.2f} ms | {self.rss[server]:.0f} MB |"
            )
        out += ["", "| ratio (median of the per-round ratios) | result | target | status |"]
        out.append("|---|---:|---|---|")
        for r in self.ratios():
            verdict = "ok" if r.passed else "MISS"
            out.append(f"| {r.name} | {r.value:.2f}× | {r.shown_target} | {verdict} |")
        return "\n".join(out)


# -- the run --------------------------------------------------------------------------------
async def compare(
    rounds: int,
    calls: int,
    variants: Sequence[tuple[str, str]] = (),
    proxy: bool = True,
    profile_s: float = 0,
    keep: bool = False,
) -> Comparison:
    """Start the servers, measure them side by side, stop them."""
    workdir = Path(tempfile.mkdtemp(prefix="toolrelay-bench-gateway-"))
    servers = plan(workdir, variants, proxy)
    results: dict[tuple[str, int], list[Sample]] = {
        (s.name, c): [] for s in servers for c in CONCURRENCY
    }
    rss: dict[str, float] = {}
    saturated: dict[str, list[Sample]] = {s.name: [] for s in servers}
    try:
        with running(servers, workdir):
            for server in servers:
                await wait_listening(server, workdir)
            async with contextlib.AsyncExitStack() as stack:
                for server in servers:
                    await stack.enter_async_context(sessions(server, max(CONCURRENCY)))
                for server in servers:  # warm-up
                    await measure(server, max(CONCURRENCY), calls // 4)
                for clients in CONCURRENCY:
                    for index in range(rounds):
                        order = servers if index % 2 == 0 else list(reversed(servers))
                        for server in order:
                            sample = await measure(server, clients, calls)
                            results[server.name, clients].append(sample)
                if profile_s:
                    await profile(servers, profile_s)
                rss = {server.name: server.rss_mb() for server in servers}
            # The SDK's sessions are closed first: idle meanwhile, a server may expire them.
            async with contextlib.AsyncExitStack() as stack:
                light = {}
                for server in servers:
                    light[server.name] = await stack.enter_async_context(
                        light_sessions(server, max(CONCURRENCY))
                    )
                    await saturate(server, light[server.name], calls // 4)  # warm-up
                for index in range(rounds):
                    order = servers if index % 2 == 0 else list(reversed(servers))
                    for server in order:
                        sample = await saturate(server, light[server.name], 2 * calls)
                        saturated[server.name].append(sample)
    finally:
        if not keep:
            shutil.rmtree(workdir, ignore_errors=True)
    labels = ["", *(name for name, _ in variants)]
    return Comparison([s.name for s in servers], labels, results, rss, saturated)


async def profile(servers: Sequence[Server], seconds: float) -> None:
    """py-spy each toolrelay gateway for ``seconds`` under 8 clients (flame graphs kept;
    only samples holding the GIL: where the CPU goes, not where the loop waits)."""
    spy = shutil.which("py-spy") or str(Path(sys.executable).with_name("py-spy"))
    for server in servers:
        if not server.name.startswith("toolrelay") or server.proc is None:
            continue
        out = Path.cwd() / f"profile-{server.name}.txt"
        command = [spy, "record", "-p", str(server.proc.pid), "-d", str(int(seconds))]
        command += ["-f", "raw", "-o", str(out), "--nonblocking", "--gil"]  # CPU, not waits
        spying = await anyio.open_process(
            command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
        )
        until = time.monotonic() + seconds
        while time.monotonic() < until:
            await measure(server, max(CONCURRENCY), 200)
        await spying.wait()
        print(f"profile of {server.name}: {out}", file=sys.stderr)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="2 rounds of 80 calls")
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--calls", type=int, default=400, help="calls per server and round")
    parser.add_argument("--variant", action="append", default=[], metavar="NAME=TOML")
    parser.add_argument("--no-mcp-proxy", action="store_true", help="leave mcp-proxy out")
    parser.add_argument("--profile", type=float, default=0, metavar="SECONDS")
    parser.add_argument("--keep", action="store_true", help="keep the work dir (logs)")
    options = parser.parse_args(argv)
    if options.quick:
        options.rounds, options.calls = 2, 80
    variants = [tuple(v.split("=", 1)) for v in options.variant]
    if any(len(v) != 2 for v in variants):
        parser.error("--variant takes NAME=TOML (or NAME=!PYTHON)")
    comparison = anyio.run(
        compare,
        options.rounds,
        options.calls,
        variants,
        not options.no_mcp_proxy,
        options.profile,
        options.keep,
    )
    print(comparison.table())
    return 0


if __name__ == "__main__":
    sys.exit(main())
