"""Tool calls over HTTP from a plain WSGI app (no framework), through a ``SyncDispatcher``.

    python examples/wsgi_app.py [port]     # serves on 127.0.0.1:8080 by default
    curl -s 127.0.0.1:8080/tools
    curl -s -X POST 127.0.0.1:8080/tools/get_weather -d '{"city": "Oslo"}'
    curl -s -X POST 127.0.0.1:8080/tools/slow_report -d '{}'      # a timeout answer after 1 s

A Flask or Django view does the same: one ``SyncDispatcher`` per process, built at start-up,
shared by every request thread, closed at shutdown. Every answer is the model-facing
envelope with HTTP 200 (the envelope *is* the answer); 503 once the dispatcher is closed.
"""

from __future__ import annotations

import json
import socketserver
import sys
import threading
from collections.abc import Callable, Iterable
from typing import Any
from wsgiref.simple_server import WSGIServer, make_server

from toolrelay import (
    AuthContext,
    Dispatcher,
    DispatcherClosed,
    SyncDispatcher,
    ToolError,
    ToolRegistry,
)

StartResponse = Callable[[str, list[tuple[str, str]]], Any]
WSGIApp = Callable[[dict[str, Any], StartResponse], Iterable[bytes]]

MAX_BODY = 1 << 20
CITY = {
    "type": "object",
    "properties": {"city": {"type": "string", "minLength": 1, "maxLength": 80}},
    "required": ["city"],
    "additionalProperties": False,
}
NO_ARGS = {"type": "object", "properties": {}, "additionalProperties": False}


def demo_registry(release: threading.Event | None = None) -> ToolRegistry:
    """Two tools: a quick async one and a blocking sync one that outlives its deadline
    (``release`` ends it early, for tests)."""
    registry = ToolRegistry()
    stuck = release or threading.Event()

    @registry.tool(
        name="get_weather",
        description="Current weather for a city.",
        parameters=CITY,
        breaker_key="weather",
    )
    async def get_weather(args: dict[str, Any], ctx: AuthContext) -> dict[str, Any]:
        if args["city"].lower() == "atlantis":
            raise ToolError("no place named Atlantis", counts_as_failure=False)
        return {"city": args["city"], "temperature_c": 4.5, "asked_by": ctx.user_id}

    @registry.tool(
        name="slow_report",
        description="A report from a service that hangs.",
        parameters=NO_ARGS,
        timeout_s=1.0,
        breaker_key="reports",
    )
    def slow_report(args: dict[str, Any], ctx: AuthContext) -> str:
        stuck.wait(30)  # a blocking client call that never returns in time
        return "never in time"

    return registry


def make_app(relay: SyncDispatcher) -> WSGIApp:
    """``GET /tools`` → the specs; ``POST /tools/<name>`` (JSON arguments) → the answer."""

    def app(environ: dict[str, Any], start_response: StartResponse) -> Iterable[bytes]:
        method = environ["REQUEST_METHOD"]
        path = environ.get("PATH_INFO", "")
        try:
            if method == "GET" and path == "/tools":
                return reply(start_response, "200 OK", relay.specs())
            if method == "POST" and path.startswith("/tools/"):
                try:
                    size = int(environ.get("CONTENT_LENGTH") or 0)
                except ValueError:
                    return reply(start_response, "400 Bad Request", {"error": "bad length"})
                if size > MAX_BODY:
                    return reply(start_response, "413 Content Too Large", {"error": "too big"})
                raw = environ["wsgi.input"].read(size) if size > 0 else b""
                # Identity comes from your authentication, never from the model's arguments.
                ctx = AuthContext(user_id=environ.get("REMOTE_USER"))
                result = relay.dispatch(
                    path.removeprefix("/tools/"),
                    raw,
                    ctx,
                    call_id=environ.get("HTTP_X_CALL_ID"),
                )
                return reply(start_response, "200 OK", result.to_model())
        except DispatcherClosed:  # shutting down (CallCancelled included): no answer
            return reply(start_response, "503 Service Unavailable", {"error": "shutting down"})
        return reply(start_response, "404 Not Found", {"error": "not found"})

    return app


def reply(start_response: StartResponse, status: str, body: Any) -> list[bytes]:
    data = json.dumps(body).encode()
    start_response(
        status, [("Content-Type", "application/json"), ("Content-Length", str(len(data)))]
    )
    return [data]


class ThreadingWSGIServer(socketserver.ThreadingMixIn, WSGIServer):
    """wsgiref's server with a thread per request, like a threaded Flask or gunicorn."""

    daemon_threads = True


def main() -> None:
    port = int(sys.argv[1]) if len(sys.argv) > 1 else 8080
    with SyncDispatcher(Dispatcher(demo_registry())) as relay:
        server = make_server("127.0.0.1", port, make_app(relay), ThreadingWSGIServer)
        print(f"serving tool calls on http://127.0.0.1:{server.server_port}/tools")
        try:
            server.serve_forever()
        except KeyboardInterrupt:
            pass
        finally:
            server.server_close()


if __name__ == "__main__":
    main()
