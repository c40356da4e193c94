"""The gateway reads no MCP request whole past ``[serve] max_request_bytes``.

A stdio line or an HTTP body over the limit is answered with a JSON-RPC error (the request's
id where it can be read) and the server goes on serving the next request.
"""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx

from test_serve_mcp import start_http_server, stop_http_server
from toolrelay.chaos.upstream import StandInUpstream
from toolrelay.serve.limits import _lines

LIMIT = 4096
EXTRA = f"max_request_bytes = {LIMIT}\n"


def request(method: str, request_id: int, params: dict[str, Any] | None = None) -> bytes:
    body = {"jsonrpc": "2.0", "id": request_id, "method": method, "params": params or {}}
    return json.dumps(body).encode() + b"\n"


INITIALIZE = request(
    "initialize",
    1,
    {
        "protocolVersion": "2025-06-18",
        "capabilities": {},
        "clientInfo": {"name": "limits-test", "version": "1"},
    },
)
INITIALIZED = b'{"jsonrpc": "2.0", "method": "notifications/initialized"}\n'


def test_lines_drop_what_is_too_long_and_keep_the_rest() -> None:
    big = b'{"jsonrpc": "2.0", "id": 7, "method": "tools/call", "params": {"x": "' + b"a" * 50_000
    data = b"short one\n" + big + b'"}}\n' + b'{"id": "after"}\n' + b"tail without newline"
    for chunk_size in (1, 7, 1000, 64 * 1024):
        source = io.BytesIO(data)
        refused: list[Any] = []
        got = list(_lines(lambda s=source, n=chunk_size: s.read(n), 100, refused))
        assert got == [b"short one", None, b'{"id": "after"}', b"tail without newline"]
        assert refused == [7]


def test_a_refused_line_without_a_readable_id_gets_null() -> None:
    source = io.BytesIO(b"x" * 500 + b"\n")
    refused: list[Any] = []
    assert list(_lines(lambda: source.read(64), 100, refused)) == [None]
    assert refused == [None]


def test_stdio_answers_an_oversized_line_and_serves_the_next(tmp_path: Path) -> None:
    with StandInUpstream().run_in_thread() as up:
        config = tmp_path / "toolrelay.toml"
        config.write_text(
            f'[plugins.weather]\nbase_url = "{up.url}"\ngeocoding_url = "{up.url}"\n'
            f'[serve]\ntransport = "stdio"\n{EXTRA}'
        )
        huge = request(
            "tools/call", 7, {"name": "weather_current", "arguments": {"city": "x" * (5 << 20)}}
        )
        errlog = tmp_path / "serve.err"
        with errlog.open("wb") as err:
            proc = subprocess.Popen(
                [sys.executable, "-m", "toolrelay", "serve", "--config", str(config)],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=err,
                env={**os.environ, "TOOLRELAY_ADMIN_TOKEN": "t" * 32},
            )
            assert proc.stdin is not None and proc.stdout is not None
            try:
                proc.stdin.write(INITIALIZE + INITIALIZED + huge + request("tools/list", 8))
                proc.stdin.flush()
                answers: dict[Any, Any] = {}
                while 8 not in answers:  # stdin stays open until the last answer is read
                    line = proc.stdout.readline()
                    assert line, errlog.read_text()[-2000:]
                    message = json.loads(line)
                    answers[message.get("id")] = message
                proc.stdin.close()
                assert proc.wait(30) == 0
            finally:
                if proc.poll() is None:
                    proc.kill()
    assert answers[7]["error"] == {
        "code": -32600,
        "message": f"request larger than {LIMIT} bytes",
    }
    assert {t["name"] for t in answers[8]["result"]["tools"]} >= {"weather_current"}
    assert "Traceback" not in errlog.read_text()


def test_http_answers_an_oversized_body_413_and_serves_the_next(tmp_path: Path) -> None:
    with StandInUpstream().run_in_thread() as up:
        server = start_http_server(tmp_path, up.url, serve_extra=EXTRA)
        try:
            headers = {
                "Accept": "application/json, text/event-stream",
                "Content-Type": "application/json",
            }
            with httpx.Client(timeout=10, headers=headers) as http:
                big = http.post(server.mcp_url, content=b'{"jsonrpc":"2.0","id":3,' + b" " * 10_000)
                assert big.status_code == 413
                assert big.json() == {
                    "jsonrpc": "2.0",
                    "id": 3,
                    "error": {"code": -32600, "message": f"request larger than {LIMIT} bytes"},
                }

                def chunks() -> Any:
                    for _ in range(100):  # no content-length: counted as it streams
                        yield b" " * 1000

                streamed = http.post(server.mcp_url, content=chunks())
                assert streamed.status_code == 413
                ok = http.post(server.mcp_url, content=INITIALIZE)
                assert ok.status_code == 200, ok.text
        finally:
            stop_http_server(server)
