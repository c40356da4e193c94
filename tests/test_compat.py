"""Third-party internals stay in ``toolrelay._compat`` and still exist in the installed releases.

The lint half walks ``src/`` and ``plugins/`` (outside ``_compat/``) for a private name of a
third-party library: an import of a private module or name, an access to one of the private
attributes ``_compat`` quarantines, a ``getattr``/``setattr`` naming one, an override of one of
the SDK's private methods. The existence half checks, per ``_compat`` module, that every name
it relies on is there with the shape it uses; each failure names the installed version.
"""

from __future__ import annotations

import ast
import importlib
import importlib.metadata
import inspect
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import anyio
import httpcore
import httpx
import pytest
from prometheus_client import CollectorRegistry, Counter, Gauge

ROOT = Path(__file__).resolve().parent.parent
COMPAT = ROOT / "src" / "toolrelay" / "_compat"

FOREIGN = {
    "anyio",
    "httpcore",
    "httpx",
    "httpx2",
    "mcp",
    "mcp_types",
    "prometheus_client",
    "sse_starlette",
    "starlette",
    "uvicorn",
}
"""Libraries whose private names only ``_compat`` may use."""

QUARANTINED = {
    # mcp, server side (_compat/mcp_server.py)
    "_admit_session",
    "_check_content_type",
    "_connection",
    "_create_error_response",
    "_discard_session",
    "_event_store",
    "_handle_stateful_request",
    "_idle_timeout",
    "_otel",
    "_read_stream_writer",
    "_requests_in_flight",
    "_security",
    "_serve_opening_request",
    "_server_instances",
    "_session_creation_lock",
    "_session_owners",
    # mcp, client side (_compat/mcp_client.py)
    "_create_platform_compatible_process",
    "_drain_stdout",
    "_get_executable_command",
    "_later_revision_fields",
    "_parse_line",
    "_stamp",
    "_stop_server_process",
    "_transport",
    # httpx / httpcore (_compat/httpcore.py)
    "_network_backend",
    "_pool",
    # prometheus-client (_compat/prometheus_client.py)
    "_value",
}
"""The private attributes ``_compat`` reaches for; nobody else may touch them."""

REPLACED = {"validate_tool_result"}
"""Public methods of a third-party object that ``_compat`` alone may assign over."""

SDK_OVERRIDES = {
    "_admit_session",
    "_discard_session",
    "_handle_stateful_request",
    "_serve_opening_request",
}
"""The SDK's private methods a subclass could override; only ``_compat`` may."""

PRIVATE_MCP_PATH = re.compile(r"\bmcp\.[a-z_.]*\._")
OWN = {"self", "cls"}


def _sources() -> list[Path]:
    files = [*(ROOT / "src").rglob("*.py"), *(ROOT / "plugins").rglob("*.py")]
    return sorted(p for p in files if COMPAT not in p.parents)


def _private_part(dotted: str) -> bool:
    return any(part.startswith("_") and not part.startswith("__") for part in dotted.split("."))


def _violations(path: Path, root: Path = ROOT) -> list[str]:
    text = path.read_text(encoding="utf-8")
    where = path.relative_to(root)
    found: list[str] = []

    def flag(node: ast.AST, what: str) -> None:
        found.append(f"{where}:{getattr(node, 'lineno', 0)}: {what}")

    for node in ast.walk(ast.parse(text)):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] in FOREIGN and _private_part(alias.name):
                    flag(node, f"imports private module {alias.name}")
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            if node.module.split(".")[0] not in FOREIGN:
                continue
            if _private_part(node.module):
                flag(node, f"imports from private module {node.module}")
            for alias in node.names:
                if _private_part(alias.name):
                    flag(node, f"imports private name {alias.name} from {node.module}")
        elif isinstance(node, ast.Attribute):
            owner = node.value
            if isinstance(owner, ast.Name) and owner.id in OWN:
                continue
            if node.attr in QUARANTINED:
                flag(node, f"touches private attribute .{node.attr}")
        elif isinstance(node, ast.Assign | ast.AugAssign):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for target in targets:
                if isinstance(target, ast.Attribute) and target.attr in REPLACED:
                    flag(node, f"replaces {target.attr}")
        elif isinstance(node, ast.Call):
            fn = node.func
            if isinstance(fn, ast.Name) and fn.id in {"getattr", "setattr", "hasattr", "delattr"}:
                name = node.args[1] if len(node.args) > 1 else None
                if isinstance(name, ast.Constant) and name.value in QUARANTINED | REPLACED:
                    flag(node, f"{fn.id}(…, {name.value!r})")
        elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and (
            node.name in SDK_OVERRIDES
        ):
            flag(node, f"overrides the SDK's private method {node.name}")
    for number, line in enumerate(text.splitlines(), 1):
        if PRIVATE_MCP_PATH.search(line):
            found.append(f"{where}:{number}: names a private MCP SDK module: {line.strip()}")
    return found


def test_no_private_third_party_name_outside_compat() -> None:
    found = [v for path in _sources() for v in _violations(path)]
    assert not found, "private third-party names outside toolrelay/_compat/:\n" + "\n".join(found)


@pytest.mark.parametrize(
    ("snippet", "expected"),
    [
        ("from mcp.client._transport import TransportStreams\n", "private module"),
        ("from mcp.client.stdio import _parse_line\n", "private name _parse_line"),
        ("import mcp.server._otel\n", "private module mcp.server._otel"),
        ("n = manager._server_instances\n", "._server_instances"),
        ("x = getattr(session, '_stamp', None)\n", "getattr(…, '_stamp')"),
        ("client.session.validate_tool_result = f\n", "replaces validate_tool_result"),
        ("class M:\n    async def _discard_session(self): ...\n", "_discard_session"),
        ("p = 'mcp.server._otel'\n", "private MCP SDK module"),
    ],
)
def test_the_lint_check_refuses_each_kind(tmp_path: Path, snippet: str, expected: str) -> None:
    plugins = tmp_path / "plugins"
    plugins.mkdir()
    bad = plugins / "bad.py"
    bad.write_text(snippet, encoding="utf-8")
    found = _violations(bad, tmp_path)
    assert any(expected in v and v.startswith("plugins/bad.py:") for v in found), found


def test_the_lint_check_lets_own_attributes_pass(tmp_path: Path) -> None:
    ok = tmp_path / "ok.py"
    ok.write_text("class A:\n    def f(self):\n        return self._transport\n")
    assert _violations(ok, tmp_path) == []


# == existence: what each _compat module relies on =============================================


def _versions(*dists: str) -> str:
    return ", ".join(f"{d} {importlib.metadata.version(d)}" for d in dists)


def _need(ok: bool, what: str, module: str, *dists: str) -> None:
    assert ok, f"{what} — relied on by toolrelay._compat.{module}; installed: {_versions(*dists)}"


def _params(fn: Callable[..., Any]) -> list[str]:
    return list(inspect.signature(fn).parameters)


def _calls(fn: Callable[..., Any], name: str) -> bool:
    return name in inspect.getsource(fn)


def _sdk(what: str, ok: bool) -> None:
    _need(ok, what, "mcp_server", "mcp")


def test_mcp_server_names_exist() -> None:
    from mcp.server.lowlevel.server import Server
    from mcp.server.session import ServerSession
    from mcp.server.streamable_http import StreamableHTTPServerTransport
    from mcp.server.streamable_http_manager import StreamableHTTPSessionManager as Manager

    try:
        otel = importlib.import_module("mcp.server._otel")
    except ImportError:
        otel = None
    _sdk(
        "mcp.server._otel.OpenTelemetryMiddleware is a class",
        inspect.isclass(getattr(otel, "OpenTelemetryMiddleware", None)),
    )
    for name, params in {
        "_handle_stateful_request": ["self", "scope", "receive", "send"],
        "_discard_session": ["self", "session_id", "transport"],
        "_admit_session": ["self", "requestor"],
        "_serve_opening_request": ["self", "http_transport", "scope", "receive", "send"],
    }.items():
        method = getattr(Manager, name, None)
        _sdk(f"StreamableHTTPSessionManager.{name}{tuple(params[1:])}", callable(method))
        assert method is not None
        _sdk(f"StreamableHTTPSessionManager.{name}{tuple(params[1:])}", _params(method) == params)
    _sdk(
        "StreamableHTTPSessionManager._handle_request calls _handle_stateful_request",
        _calls(Manager._handle_request, "self._handle_stateful_request("),
    )
    _sdk(
        "StreamableHTTPSessionManager._serve_opening_request ends sessions by _discard_session",
        _calls(Manager._serve_opening_request, "self._discard_session("),
    )
    manager = Manager(app=Server("compat"))
    _sdk(
        "StreamableHTTPSessionManager()._session_creation_lock is an anyio.Lock",
        isinstance(getattr(manager, "_session_creation_lock", None), anyio.Lock),
    )
    for name in ("_server_instances", "_session_owners"):
        _sdk(
            f"StreamableHTTPSessionManager().{name} is a dict",
            isinstance(getattr(manager, name, None), dict),
        )

    transport = StreamableHTTPServerTransport(mcp_session_id="s", idle_timeout=5.0)
    _sdk("transport._requests_in_flight == 0", getattr(transport, "_requests_in_flight", 1) == 0)
    _sdk("transport._idle_timeout == idle_timeout", getattr(transport, "_idle_timeout", 0) == 5.0)
    _sdk("transport.idle_scope", hasattr(transport, "idle_scope"))
    _sdk(
        "StreamableHTTPServerTransport.handle_request counts _requests_in_flight",
        _calls(StreamableHTTPServerTransport.handle_request, "self._requests_in_flight"),
    )
    _sdk("transport._read_stream_writer", hasattr(transport, "_read_stream_writer"))
    _sdk("transport._event_store is None", getattr(transport, "_event_store", 0) is None)
    security = getattr(transport, "_security", None)
    validate = getattr(security, "validate_request", None)
    _sdk(
        "transport._security.validate_request(request, is_post)",
        inspect.iscoroutinefunction(validate) and _params(validate)[:2] == ["request", "is_post"],
    )
    check = getattr(transport, "_check_content_type", None)
    _sdk(
        "transport._check_content_type(request)",
        callable(check) and _params(check) == ["request"],
    )
    error = getattr(transport, "_create_error_response", None)
    _sdk(
        "transport._create_error_response(error_message, status_code, error_code, …)",
        callable(error) and _params(error)[:3] == ["error_message", "status_code", "error_code"],
    )
    _sdk("ServerSession keeps _connection", _calls(ServerSession.__init__, "self._connection ="))


@pytest.mark.anyio
async def test_mcp_server_busy_counts_as_the_transport_does() -> None:
    from mcp.server.streamable_http import StreamableHTTPServerTransport

    from toolrelay._compat.mcp_server import busy, is_busy

    transport = StreamableHTTPServerTransport(mcp_session_id="s", idle_timeout=5.0)
    transport.idle_scope = anyio.CancelScope()
    with busy(transport):
        assert is_busy(transport)
        assert transport.idle_scope.deadline == float("inf")
    assert not is_busy(transport)
    assert transport.idle_scope.deadline <= anyio.current_time() + 5.0


def test_mcp_client_names_exist() -> None:
    from mcp.client.client import Client
    from mcp.client.session import ClientSession
    from mcp.shared.message import SessionMessage

    def need(what: str, ok: bool) -> None:
        _need(ok, what, "mcp_client", "mcp")

    try:
        transport = importlib.import_module("mcp.client._transport")
    except ImportError:
        transport = None
    need("mcp.client._transport.TransportStreams", hasattr(transport, "TransportStreams"))
    stdio = importlib.import_module("mcp.client.stdio")
    for name, params in {
        "_create_platform_compatible_process": ["command", "args", "env", "errlog", "cwd"],
        "_drain_stdout": ["process"],
        "_get_executable_command": ["command"],
        "_stop_server_process": ["process"],
    }.items():
        fn = getattr(stdio, name, None)
        need(
            f"async mcp.client.stdio.{name}{tuple(params)}",
            inspect.iscoroutinefunction(fn) and _params(fn) == params,
        )
    parse = getattr(stdio, "_parse_line", None)
    need("mcp.client.stdio._parse_line(line)", callable(parse))
    assert parse is not None
    parsed = parse('{"jsonrpc": "2.0", "id": 1, "result": {}}')
    need("_parse_line returns a SessionMessage", isinstance(parsed, SessionMessage))
    need("_parse_line returns a bad line's error", isinstance(parse("{"), Exception))
    later = getattr(importlib.import_module("mcp.client.session"), "_later_revision_fields", None)
    need("mcp.client.session._later_revision_fields(method, version)", callable(later))
    assert later is not None
    need(
        "_later_revision_fields returns a frozenset",
        isinstance(later("tools/call", "2025-11-25"), frozenset),
    )
    need("ClientSession keeps _stamp", _calls(ClientSession.__init__, "self._stamp"))
    need(
        "ClientSession.validate_tool_result(name, result)",
        _params(ClientSession.validate_tool_result) == ["self", "name", "result"],
    )
    need(
        "the client checks tool results through session.validate_tool_result",
        _calls(Client.call_tool, "self.session.validate_tool_result(")
        or _calls(ClientSession.call_tool, "self.validate_tool_result("),
    )


@pytest.mark.anyio
async def test_mcp_client_stamp_and_check_are_reachable() -> None:
    from mcp.client.session import ClientSession

    from toolrelay._compat.mcp_client import replace_tool_result_check, session_stamp

    send_writer, send_reader = anyio.create_memory_object_stream[Any](1)
    recv_writer, recv_reader = anyio.create_memory_object_stream[Any](1)
    async with send_writer, send_reader, recv_writer, recv_reader:
        session = ClientSession(recv_reader, send_writer)
        stamp = session_stamp(session)
        _need(stamp is not None, "ClientSession()._stamp is callable", "mcp_client", "mcp")
        checked: list[str] = []

        async def check(name: str, result: Any) -> None:
            checked.append(name)

        replace_tool_result_check(session, check)
        await session.validate_tool_result("t", None)  # type: ignore[arg-type]
        assert checked == ["t"]


def test_httpcore_names_exist() -> None:
    from toolrelay._compat.httpcore import wrap_network_backend

    transport = httpx.AsyncHTTPTransport()
    pool = getattr(transport, "_pool", None)
    _need(
        isinstance(pool, httpcore.AsyncConnectionPool),
        "httpx.AsyncHTTPTransport()._pool is an httpcore.AsyncConnectionPool",
        "httpcore",
        "httpx",
        "httpcore",
    )
    backend = getattr(pool, "_network_backend", None)
    _need(
        isinstance(backend, httpcore.AsyncNetworkBackend),
        "httpcore.AsyncConnectionPool()._network_backend is an AsyncNetworkBackend",
        "httpcore",
        "httpx",
        "httpcore",
    )
    wrapped = httpcore.AsyncMockBackend([])
    assert wrap_network_backend(transport, lambda inner: wrapped)
    assert getattr(pool, "_network_backend", None) is wrapped


@pytest.mark.parametrize("kind", [Counter, Gauge])
def test_prometheus_client_names_exist(kind: type[Counter] | type[Gauge]) -> None:
    from toolrelay._compat.prometheus_client import value_inc

    child = kind("compat_x", "x", ["a"], registry=CollectorRegistry()).labels("v")
    inc = value_inc(child)
    _need(
        inc is not None,
        f"{kind.__name__}(...).labels(...)._value.inc is callable",
        "prometheus_client",
        "prometheus_client",
    )
