"""The raw lane for ``tools/call`` on stdio upstreams (issue 19's speed work).

On stdio, :class:`~toolrelay.sources.mcp.McpSource` writes ``tools/call`` itself and reads
the answer back without the SDK's session (see ``toolrelay.sources.rawlane.RawLane``);
the session still does everything else. These tests prove, with real processes:

* the request line is the one the SDK writes for the same call (ids aside), in both
  protocol eras, trace context included;
* answers (text, structured, blocks) and every failure path map as they did through the
  SDK: JSON-RPC errors, results that are not tool results, unreadable, oversized and
  too-wide answers, the server dying mid-call;
* cancellation (deadline or host) sends ``notifications/cancelled`` with the raw id, a late
  answer to it is dropped, and the connection keeps serving;
* many calls interleaved with the session's own traffic (``tools/list``, pings, the
  server's notifications and requests) each get their own answer.

The upstreams are ``servers/mcp_test_server.py`` (the SDK's low-level server, both eras)
and a small hand-written 2025-era server below (``SERVER``), which answers ``tools/call``
in threads (so out of order) in whatever way ``kind`` asks, and records every line it is
sent.
"""

from __future__ import annotations

import json
import sys
from collections.abc import AsyncIterator, Callable, Coroutine
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import pytest

from helpers import dispatcher_with, wait_until
from toolrelay import (
    BreakerOptions,
    BulkheadOptions,
    Dispatcher,
    ErrorType,
    KeyPolicy,
    RetryOptions,
    ToolRegistry,
)
from toolrelay.contract import AuthContext

pytest.importorskip("mcp", reason="needs the MCP SDK: pip install 'toolrelay[mcp]'")
from opentelemetry import trace
from opentelemetry.trace import NonRecordingSpan, SpanContext, TraceFlags, TraceState

from toolrelay.sources.mcp import McpSource, McpSourceOptions

pytestmark = pytest.mark.anyio

TEST_SERVER = Path(__file__).parent / "servers" / "mcp_test_server.py"
ERAS = {"2026-07-28": "2026-07-28", "legacy": "2025-11-25"}  # the mode pins the era
ONCE = KeyPolicy(
    breaker=BreakerOptions(fail_max=100), retry=RetryOptions(max_attempts=1)
)  # no retry, never open
WIDE = KeyPolicy(bulkhead=BulkheadOptions(max_concurrent=256))  # many calls in flight at once

SERVER = r"""
import json, os, sys, threading, time

record = open(sys.argv[1], "a", buffering=1)
lock = threading.Lock()
TOOL = {"name": "answer", "inputSchema": {"type": "object"}, "annotations": {"readOnlyHint": True}}


def send(message):
    text = message if isinstance(message, str) else json.dumps(message)
    with lock:
        sys.stdout.write(text + "\n")
        sys.stdout.flush()


def text(value):
    return {"content": [{"type": "text", "text": value}]}


def call(rid, args):
    time.sleep(float(args.get("delay", 0)))
    kind = args.get("kind", "text")
    head = '{"jsonrpc":"2.0","id":%s,"result":' % json.dumps(rid)
    if kind == "hang":
        return
    if kind == "die":
        os._exit(1)
    if kind == "chatty":  # the session's traffic in the middle of a raw call
        note = {"level": "info", "data": "about tr-1 and tr-2"}
        send({"jsonrpc": "2.0", "method": "notifications/message", "params": note})
        send({"jsonrpc": "2.0", "id": "srv-%s" % rid, "method": "ping"})
    if kind in ("text", "chatty"):
        send(head + json.dumps(text("echo: %s" % args.get("text"))) + "}")
    elif kind == "structured":
        result = text("%s doubled" % args["n"])
        result["structuredContent"] = {"n": args["n"], "doubled": 2 * args["n"]}
        send(head + json.dumps(result) + "}")
    elif kind == "blocks":
        image = {"type": "image", "data": "aGk=", "mimeType": "image/png"}
        send(head + json.dumps({"content": [image, {"type": "text", "text": "hi"}]}) + "}")
    elif kind == "is_error":
        send(head + json.dumps({**text("the widget is broken"), "isError": True}) + "}")
    elif kind == "error":
        error = {"code": args["code"], "message": args["message"]}
        send({"jsonrpc": "2.0", "id": rid, "error": error})
    elif kind == "not_a_result":
        send(head + '{"nothing":1}}')
    elif kind == "scalar":
        send(head + "5}")
    elif kind == "garbage":
        send(head + '{"content":[')
    elif kind == "id_last":
        send('{"jsonrpc":"2.0","result":%s,"id":%s}' % (json.dumps(text("last")), json.dumps(rid)))
    elif kind == "big":
        send(head + json.dumps(text("a" * 4096)) + "}")
    elif kind == "wide":
        send(head + json.dumps({"content": [], "structuredContent": {"z": [0] * 500}}) + "}")


for line in sys.stdin:
    record.write(line)
    message = json.loads(line)
    method, rid = message.get("method"), message.get("id")
    if rid is None or method is None:
        continue
    reply = {"jsonrpc": "2.0", "id": rid}
    if method == "initialize":
        info = {"name": "hand", "version": "1"}
        reply["result"] = {"protocolVersion": "2025-11-25", "capabilities": {"tools": {}},
                           "serverInfo": info}
    elif method == "tools/list":
        reply["result"] = {"tools": [TOOL]}
    elif method == "ping":
        reply["result"] = {}
    elif method == "tools/call":
        args = message["params"].get("arguments") or {}
        if args.get("kind") == "deaf":  # stop reading stdin: the pipe fills up
            time.sleep(3600)
        threading.Thread(target=call, args=(rid, args), daemon=True).start()
        continue
    else:
        reply["error"] = {"code": -32601, "message": "Method not found"}
    send(reply)
"""


class Upstream:
    """An upstream process; every line it was sent is in ``wire`` (the hand-written server
    records them itself; the SDK's is started through ``tee``)."""

    def __init__(self, tmp: Path, *server: str, tee: bool) -> None:
        self.wire = tmp / "wire.jsonl"
        self.errlog = tmp / "server.err"
        self.command = [sys.executable, *server, str(self.wire)]
        if tee:
            self.command = ["sh", "-c", 'tee -a "$0" | "$@"', str(self.wire), sys.executable]
            self.command += [*server, str(tmp / "record.jsonl")]

    def sent(self) -> list[dict[str, Any]]:
        lines = self.wire.read_text().splitlines() if self.wire.exists() else []
        return [json.loads(line) for line in lines]

    def calls(self) -> list[dict[str, Any]]:
        return [m for m in self.sent() if m.get("method") == "tools/call"]

    def cancelled(self) -> list[Any]:
        return [
            m["params"]["requestId"]
            for m in self.sent()
            if m.get("method") == "notifications/cancelled"
        ]

    @asynccontextmanager
    async def source(self, **options: Any) -> AsyncIterator[McpSource]:
        with self.errlog.open("a") as errlog:
            async with McpSource.stdio(
                self.command, McpSourceOptions(breaker_key="up", **options), errlog=errlog
            ) as source:
                yield source


def hand_server(tmp: Path) -> Upstream:
    script = tmp / "hand_server.py"
    script.write_text(SERVER)
    return Upstream(tmp, str(script), tee=False)


def sdk_server(tmp: Path) -> Upstream:
    return Upstream(tmp, str(TEST_SERVER), "--record", tee=True)


def dispatcher_for(source: McpSource, **options: Any) -> Dispatcher:
    registry = ToolRegistry()
    registry.register(source)
    return dispatcher_with(registry, **options)


def without_id(message: dict[str, Any]) -> dict[str, Any]:
    return {key: value for key, value in message.items() if key != "id"}


async def each_era(
    tmp_path: Path, case: Callable[[Upstream, str], Coroutine[Any, Any, None]]
) -> None:
    """``case(upstream, protocol)`` for both protocol eras at once, each on an SDK server of
    its own (independent processes: started side by side)."""
    async with anyio.create_task_group() as tg:
        for protocol in sorted(ERAS):
            (tmp_path / protocol).mkdir()
            tg.start_soon(case, sdk_server(tmp_path / protocol), protocol)


# -- the request ----------------------------------------------------------------------------
async def test_the_raw_request_is_the_one_the_sdk_writes(tmp_path: Path) -> None:
    parent = SpanContext(
        trace_id=0x4BF92F3577B34DA6A3CE929D0E0E4736,
        span_id=0x00F067AA0BA902B7,
        is_remote=False,
        trace_flags=TraceFlags(TraceFlags.SAMPLED),
        trace_state=TraceState([("rojo", "00f067aa0ba902b7")]),
    )

    async def case(upstream: Upstream, protocol: str) -> None:
        async with upstream.source(protocol=protocol) as source:
            assert source.protocol_version == ERAS[protocol]
            conn = source.conn  # the SDK's own client on the same connection
            assert conn is not None and conn.client is not None
            args = {"n": 7}
            plain = await source.execute("structured", args, AuthContext())
            await conn.client.call_tool("structured", args)
            with trace.use_span(NonRecordingSpan(parent)):
                traced = await source.execute("structured", args, AuthContext())
                await conn.client.call_tool("structured", args)
        assert plain == traced == {"n": 7, "doubled": 14}, protocol
        raw, sdk, raw_traced, sdk_traced = upstream.calls()
        assert isinstance(raw["id"], str) and raw["id"].startswith("tr-"), protocol
        assert isinstance(sdk["id"], int), protocol
        assert without_id(raw) == without_id(sdk), protocol
        assert without_id(raw_traced) == without_id(sdk_traced), protocol
        meta = raw_traced["params"]["_meta"]
        assert meta["traceparent"] == "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
        assert meta["tracestate"] == "rojo=00f067aa0ba902b7", protocol
        stamped = "io.modelcontextprotocol/protocolVersion"
        # 2026-era requests carry the stamp
        assert (stamped in meta) is (protocol != "legacy"), protocol
        assert "_meta" not in raw["params"] or stamped in raw["params"]["_meta"], protocol

    await each_era(tmp_path, case)


# -- answers --------------------------------------------------------------------------------
async def test_answers_map_as_through_the_sdk(tmp_path: Path) -> None:
    upstream = hand_server(tmp_path)
    async with upstream.source() as source:
        dispatcher = dispatcher_for(source)

        async def answer(**args: Any) -> Any:
            return (await dispatcher.dispatch("answer", args)).to_model()

        assert await answer(kind="text", text="hi") == {"ok": True, "data": "echo: hi"}
        assert await answer(kind="structured", n=4) == {
            "ok": True,
            "data": {"n": 4, "doubled": 8},
        }
        blocks = await answer(kind="blocks")
        assert blocks["data"] == [
            {"type": "image", "data": "aGk=", "mimeType": "image/png"},
            {"type": "text", "text": "hi"},
        ]
        failed = await answer(kind="is_error")
        assert failed["error_type"] == "tool_error" and failed["retryable"] is False
        assert failed["message"] == "the widget is broken"
        assert await answer(kind="id_last") == {"ok": True, "data": "last"}
        chatty = await answer(kind="chatty", text="x")
        assert chatty == {"ok": True, "data": "echo: x"}
    assert dispatcher.breakers.snapshot()["up"]["failures"] == 0
    calls = upstream.calls()
    assert len(calls) == 6 and all(str(call["id"]).startswith("tr-") for call in calls)
    # the server's ping went to the SDK's session, which answered it
    assert any(m.get("id") == f"srv-{calls[-1]['id']}" and "result" in m for m in upstream.sent())


@pytest.mark.parametrize(
    ("code", "message", "counted", "relisted"),
    [
        (-32603, "boom", True, False),  # INTERNAL_ERROR: the server's failure
        (-32602, "Unknown tool: answer", False, True),  # INVALID_PARAMS: our list may be stale
        (-32601, "no such method", False, True),  # METHOD_NOT_FOUND
        (-32050, "not today", False, False),  # any other code
    ],
)
async def test_json_rpc_errors_map_as_through_the_sdk(
    tmp_path: Path, code: int, message: str, counted: bool, relisted: bool
) -> None:
    upstream = hand_server(tmp_path)
    async with upstream.source() as source:
        dispatcher = dispatcher_for(source, default_key=ONCE)
        got = await dispatcher.dispatch(
            "answer", {"kind": "error", "code": code, "message": message}
        )
        assert got.error_type is ErrorType.TOOL_ERROR and not got.retryable
        assert got.message == f"up refused the call: {message}"
        assert dispatcher.breakers.snapshot()["up"]["failures"] == int(counted)
        if relisted:
            await wait_until(
                lambda: len([m for m in upstream.sent() if m.get("method") == "tools/list"]) == 2
            )
        again = await dispatcher.dispatch("answer", {"kind": "text", "text": "ok"})
        assert again.data == "echo: ok" and source.connects == 1
    listed = [m for m in upstream.sent() if m.get("method") == "tools/list"]
    assert len(listed) == (2 if relisted else 1)


async def test_a_session_gone_error_loses_the_connection(tmp_path: Path) -> None:
    upstream = hand_server(tmp_path)
    async with upstream.source(backoff_initial_s=0.2) as source:
        dispatcher = dispatcher_for(source, default_key=ONCE)
        error = {"kind": "error", "code": -32001, "message": "Session not found"}
        got = await dispatcher.dispatch("answer", error)
        assert got.error_type is ErrorType.TOOL_ERROR and got.retryable
        assert got.message == "up server is not reachable"
        assert source.connection_failures == 1
        await anyio.sleep(0.25)
        again = await dispatcher.dispatch("answer", {"kind": "text", "text": "ok"})
        assert again.data == "echo: ok" and source.connects == 2


@pytest.mark.parametrize("kind", ["not_a_result", "scalar", "garbage"])
async def test_answers_that_are_not_tool_results(tmp_path: Path, kind: str) -> None:
    upstream = hand_server(tmp_path)
    async with upstream.source() as source:
        dispatcher = dispatcher_for(source, default_key=ONCE)
        got = await dispatcher.dispatch("answer", {"kind": kind})
        assert got.error_type is ErrorType.INVALID_OUTPUT, got.to_model()
        assert got.message == "up sent an answer that is not a valid MCP tool result"
        assert dispatcher.breakers.snapshot()["up"]["failures"] == 1  # counted, as before
        again = await dispatcher.dispatch("answer", {"kind": "text", "text": "ok"})
        assert again.data == "echo: ok" and source.connects == 1


@pytest.mark.parametrize("kind", ["big", "wide"])
async def test_oversized_answers_are_refused_and_not_counted(tmp_path: Path, kind: str) -> None:
    upstream = hand_server(tmp_path)
    async with upstream.source(max_message_bytes=1024, max_message_values=100) as source:
        dispatcher = dispatcher_for(source, default_key=ONCE)
        got = await dispatcher.dispatch("answer", {"kind": kind})
        assert got.error_type is ErrorType.INVALID_OUTPUT and not got.retryable
        assert got.message.startswith("up sent an answer too large to read")
        assert dispatcher.breakers.snapshot()["up"]["failures"] == 0
        again = await dispatcher.dispatch("answer", {"kind": "text", "text": "ok"})
        assert again.data == "echo: ok" and source.connects == 1


# -- the connection ends --------------------------------------------------------------------
async def test_the_server_dying_fails_every_waiting_call(tmp_path: Path) -> None:
    upstream = hand_server(tmp_path)
    async with upstream.source(backoff_initial_s=0.2) as source:
        dispatcher = dispatcher_for(source, default_key=ONCE)
        results: list[Any] = []

        async def waiting(n: int) -> None:
            results.append(await dispatcher.dispatch("answer", {"kind": "hang", "n": n}))

        async with anyio.create_task_group() as tg:
            for n in range(5):
                tg.start_soon(waiting, n)
            await wait_until(lambda: len(upstream.calls()) == 5)
            results.append(await dispatcher.dispatch("answer", {"kind": "die", "delay": 0.1}))
        assert len(results) == 6
        for got in results:
            assert got.error_type is ErrorType.TOOL_ERROR and got.retryable, got.to_model()
            assert got.message == "up server is not reachable"
        assert source.connection_failures == 1
        await anyio.sleep(0.25)
        again = await dispatcher.dispatch("answer", {"kind": "text", "text": "back"})
        assert again.data == "echo: back" and source.connects == 2


# -- cancellation ---------------------------------------------------------------------------
async def test_a_deadline_cancels_on_the_server_and_a_late_answer_is_dropped(
    tmp_path: Path,
) -> None:
    upstream = hand_server(tmp_path)
    async with upstream.source(timeout_s=0.3) as source:
        dispatcher = dispatcher_for(source, default_key=ONCE)
        late = await dispatcher.dispatch("answer", {"kind": "text", "text": "late", "delay": 0.8})
        assert late.error_type is ErrorType.TIMEOUT
        assert dispatcher.breakers.snapshot()["up"]["failures"] == 1  # the timeout, once
        (call,) = upstream.calls()
        await wait_until(lambda: upstream.cancelled() == [call["id"]])
        await anyio.sleep(0.7)  # the late answer arrives meanwhile: nobody waits for it
        again = await dispatcher.dispatch("answer", {"kind": "text", "text": "now"})
        assert again.data == "echo: now" and source.connects == 1
    assert "Traceback" not in upstream.errlog.read_text()


async def test_a_server_that_stops_reading_cannot_hold_a_call_past_its_deadline(
    tmp_path: Path,
) -> None:
    """Lines wait in the connection's queue, not in the caller: with the server's stdin
    pipe full, a call still answers at its deadline (a caller that wrote the pipe itself
    would wait for it, or cut a line short if it gave up)."""
    upstream = hand_server(tmp_path)
    async with upstream.source(timeout_s=0.4) as source:
        dispatcher = dispatcher_for(source, default_key=ONCE)
        deaf = await dispatcher.dispatch("answer", {"kind": "deaf"})
        assert deaf.error_type is ErrorType.TIMEOUT
        big = "x" * (200 * 1024)  # beyond a pipe's buffer (64 KiB on Linux)
        for _ in range(3):
            started = anyio.current_time()
            stuck = await dispatcher.dispatch("answer", {"kind": "text", "text": big})
            elapsed = anyio.current_time() - started
            assert stuck.error_type is ErrorType.TIMEOUT
            assert elapsed < 0.4 + 0.3, f"answered {elapsed - 0.4:.2f} s after its deadline"


async def test_host_cancellation_propagates_and_reaches_the_server(tmp_path: Path) -> None:
    async def case(upstream: Upstream, protocol: str) -> None:
        async with upstream.source(protocol=protocol) as source:
            dispatcher = dispatcher_for(source)
            reached = False
            with anyio.CancelScope() as scope:
                async with anyio.create_task_group() as tg:

                    async def cancel_when_sent() -> None:
                        await wait_until(lambda: len(upstream.calls()) == 1)
                        scope.cancel()

                    tg.start_soon(cancel_when_sent)
                    await dispatcher.dispatch("hang", {"seconds": 30, "tag": "host"})
                    reached = True
            # never turned into an answer
            assert scope.cancelled_caught and not reached, protocol
            (call,) = upstream.calls()
            await wait_until(lambda: upstream.cancelled() == [call["id"]])
            quick = await dispatcher.dispatch("hang", {"seconds": 0, "tag": "quick"})
            assert quick.data == "woke up", protocol
        assert dispatcher.breakers.snapshot()["up"]["failures"] == 0, protocol

    await each_era(tmp_path, case)


# -- concurrency ----------------------------------------------------------------------------
async def test_interleaved_calls_and_session_traffic_each_get_their_answer(
    tmp_path: Path,
) -> None:
    upstream = hand_server(tmp_path)
    async with upstream.source() as source:
        dispatcher = dispatcher_for(source, default_key=WIDE)
        answers: dict[int, Any] = {}

        async def one(n: int) -> None:
            kind = "chatty" if n % 7 == 0 else "text"
            delay = (n % 5) / 100  # answered out of order
            args = {"kind": kind, "text": str(n), "delay": delay}
            answers[n] = (await dispatcher.dispatch("answer", args)).to_model()

        async def session_traffic() -> None:
            for _ in range(10):
                await source.refresh()
                assert await source.ping(5.0)

        async with anyio.create_task_group() as tg:
            tg.start_soon(session_traffic)
            for n in range(200):
                tg.start_soon(one, n)
    assert answers == {n: {"ok": True, "data": f"echo: {n}"} for n in range(200)}
    ids = [call["id"] for call in upstream.calls()]
    assert len(set(ids)) == 200 and all(str(i).startswith("tr-") for i in ids)
    assert source.connects == 1


async def test_sdk_server_under_concurrency(tmp_path: Path) -> None:
    async def case(upstream: Upstream, protocol: str) -> None:
        async with upstream.source(protocol=protocol) as source:
            assert source.protocol_version == ERAS[protocol]
            dispatcher = dispatcher_for(source, default_key=WIDE)
            got: dict[int, Any] = {}

            async def one(n: int) -> None:
                got[n] = (await dispatcher.dispatch("structured", {"n": n})).to_model()

            async with anyio.create_task_group() as tg:
                for n in range(100):
                    tg.start_soon(one, n)
                tg.start_soon(source.refresh)
            expected = {n: {"ok": True, "data": {"n": n, "doubled": 2 * n}} for n in range(100)}
            assert got == expected, protocol
        assert all(str(call["id"]).startswith("tr-") for call in upstream.calls()), protocol

    await each_era(tmp_path, case)


# -- reading results ------------------------------------------------------------------------
TEXT = {"type": "text", "text": "hi"}
LEGACY, MODERN = ERAS["legacy"], ERAS["2026-07-28"]
SHAPES: list[tuple[dict[str, Any], set[str]]] = [  # a result, and the eras it is read quickly in
    ({"content": [TEXT]}, {LEGACY}),
    ({"content": [TEXT], "isError": False}, {LEGACY}),
    ({"content": [TEXT], "isError": False, "resultType": "complete"}, {MODERN}),
    ({"content": [TEXT], "resultType": "complete", "_meta": {"x/y": 1}}, {MODERN}),
    ({"content": [TEXT], "isError": True, "resultType": "complete"}, set()),
    ({"content": [TEXT, TEXT], "resultType": "complete"}, set()),
    ({"content": [TEXT], "structuredContent": {"a": 1}, "resultType": "complete"}, set()),
    ({"content": [{**TEXT, "annotations": {"priority": 1}}], "resultType": "complete"}, set()),
    ({"content": [{"type": "text", "text": 5}], "resultType": "complete"}, set()),
    ({"content": [TEXT], "_meta": 5, "resultType": "complete"}, set()),
    ({"content": [TEXT], "isError": 0, "resultType": "complete"}, set()),
    ({"content": [], "resultType": "complete"}, set()),
    ({"content": [TEXT], "resultType": "input_required"}, set()),
]


@pytest.mark.parametrize("era", [LEGACY, MODERN])
@pytest.mark.parametrize(("raw", "quick_in"), SHAPES)
def test_the_plain_text_shortcut_reads_as_pydantic_does(
    raw: dict[str, Any], quick_in: set[str], era: str
) -> None:
    """``plain_text`` reads the commonest answer only, and as the full read does."""
    from pydantic import ValidationError

    from toolrelay.sources.mcp_mapping import call_result, plain_text, result_data

    quick = plain_text(raw, modern=era == MODERN)
    assert (quick is not None) is (era in quick_in)
    if quick is not None:
        try:
            result = call_result(dict(raw), era)
        except ValidationError:
            result = None
        assert result is not None and not result.is_error
        assert quick == result_data(result) == "hi"
