"""``toolrelay serve`` carries its upstreams' resources, prompts and completions.

Two upstreams (``servers/mcp_test_server.py --lists TAG``): ``a`` over stdio (a 2025-era
connection) and ``b`` over streamable HTTP (a 2026-era one), behind one gateway over HTTP,
asked by a 2025-era client (a session) and a 2026-era one (single requests). Then a
gateway over stdio in front of ``b`` with a profile that denies some, one refused at start
for a collision (``b`` twice), and ``b`` dying: its read answers an error, and its breaker
counts.
"""

from __future__ import annotations

import io
import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import mcp.types as types
import pytest
from mcp import Client, MCPError

from helpers import http_session
from test_gateway_transparency import (
    ENV,
    MCP_URL,
    SERVER,
    free_port,
    start,
    stdio_session,
    stop,
    wait_for,
    wait_for_port,
)
from toolrelay.serve import ServeError, Service, load
from toolrelay.serve.errors import ReloadRefused
from toolrelay.sources.errors import innermost

# the gateway and the upstreams are processes of their own; only the SDK's client runs here
GATEWAY_PROCESS = pytest.mark.parametrize("anyio_backend", ["asyncio"])


def upstream(tmp: Path, tag: str) -> list[str]:
    return [sys.executable, str(SERVER), "--record", str(tmp / f"rec-{tag}"), "--lists", tag]


def config(tmp: Path, upstreams: str, serve: str = 'transport = "http"', extra: str = "") -> Path:
    path = tmp / "toolrelay.toml"
    path.write_text(f"{extra}\n[serve]\n{serve}\n[serve.http]\nport = 0\n{upstreams}")
    return path


def stdio_upstream(tmp: Path, tag: str, prefix: str | None = None) -> str:
    prefix_line = "" if prefix is None else f'prefix = "{prefix}"'
    return f"""
[serve.upstreams.{tag}{prefix or ""}]
command = {json.dumps(upstream(tmp, tag))}
breaker_key = "up-{tag}{prefix or ""}"
risk_override = "read"
{prefix_line}
"""


def http_upstream(url: str, name: str) -> str:
    return f"""
[serve.upstreams.{name}]
url = "{url}"
breaker_key = "up-{name}"
prefix = "{name}"
risk_override = "read"
"""


class Gateway:
    """The gateway over HTTP, its upstream ``b`` (its process and URL) and their folder."""

    def __init__(self, url: str, b: subprocess.Popen[bytes], b_url: str, tmp: Path) -> None:
        self.url, self.b, self.b_url, self.tmp = url, b, b_url, tmp


@pytest.fixture(scope="module")
def gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Gateway]:
    tmp = tmp_path_factory.mktemp("lists")
    port = free_port()
    with (tmp / "b.err").open("a") as err:
        b = subprocess.Popen([*upstream(tmp, "b"), "--http", str(port)], stderr=err)
    wait_for_port(port, b)
    upstreams = (
        stdio_upstream(tmp, "a", "a")
        + f"""
[serve.upstreams.b]
url = "http://127.0.0.1:{port}/mcp"
breaker_key = "up-b"
prefix = "b"
risk_override = "read"
timeout_s = 2.0
backoff_initial_s = 30.0
"""
    )
    extra = '[keys."up-b".breaker]\nfail_max = 2\n'
    path = config(tmp, upstreams, extra=extra)
    errlog = tmp / "serve.err"
    serve = [sys.executable, "-m", "toolrelay", "serve", "--config", str(path)]
    proc = start(serve, errlog)
    try:
        url = wait_for(errlog, MCP_URL, proc)
        yield Gateway(url, b, f"http://127.0.0.1:{port}/mcp", tmp)
    finally:
        stop(proc)
        if b.poll() is None:
            stop(b)
    assert "Traceback" not in errlog.read_text()


async def every_page(list_page: Any, field: str) -> tuple[list[Any], int]:
    items: list[Any] = []
    cursor, pages = None, 0
    while True:
        page = await list_page(params=types.PaginatedRequestParams(cursor=cursor))
        items += getattr(page, field)
        pages += 1
        cursor = page.next_cursor
        if cursor is None:
            return items, pages


@pytest.mark.anyio
@GATEWAY_PROCESS
async def test_a_2025_client_lists_reads_gets_and_completes_across_two_upstreams(
    gateway: Gateway,
) -> None:
    async with http_session(gateway.url) as session:
        caps = session.server_capabilities
        assert caps is not None and caps.resources is not None and caps.prompts is not None
        assert caps.completions is not None and caps.resources.subscribe is True
        # every resource of both upstreams (121 each), in pages of 100
        resources, pages = await every_page(session.list_resources, "resources")
        uris = [str(r.uri) for r in resources]
        assert len(uris) == 242 and len(set(uris)) == 242 and pages == 3
        assert {"a://doc/0", "a://blob", "b://doc/119", "b://blob"} <= set(uris)
        templates, _ = await every_page(session.list_resource_templates, "resource_templates")
        assert [t.uri_template for t in templates] == [
            "a://item/{id}",
            "a://user/{name}/card",
            "b://item/{id}",
            "b://user/{name}/card",
        ]
        # reads routed by URI: listed, by template, a blob as it is
        for uri in ("a://doc/7", "b://doc/7", "b://item/42", "a://user/x/card"):
            read = await session.read_resource(uri)
            content = read.contents[0]
            assert isinstance(content, types.TextResourceContents)
            assert content.text == f"{uri[0]}: {uri}"
        blob = (await session.read_resource("b://blob")).contents[0]
        assert isinstance(blob, types.BlobResourceContents) and blob.mime_type == "image/png"
        # nobody's URI: the protocol's not-found error, not a hang
        with pytest.raises(MCPError) as missing:
            await session.read_resource("c://nothing")
        assert missing.value.error.code == -32002
        # an upstream's own not-found passes through with its code
        with pytest.raises(MCPError) as theirs:
            await session.read_resource("a://item/")
        assert theirs.value.error.code == -32002
        # prompts: prefixed as the tools are, the upstream's pages followed
        prompts, _ = await every_page(session.list_prompts, "prompts")
        assert [p.name for p in prompts] == ["a__greet", "a__plain", "b__greet", "b__plain"]
        got = await session.get_prompt("b__greet", {"name": "Ada"})
        message = got.messages[0].content
        assert isinstance(message, types.TextContent) and message.text == "b says hello to Ada"
        with pytest.raises(MCPError):
            await session.get_prompt("greet", {"name": "Ada"})
        with pytest.raises(MCPError) as bad_cursor:
            await session.list_prompts(params=types.PaginatedRequestParams(cursor="nonsense"))
        assert bad_cursor.value.error.code == types.INVALID_PARAMS
        # completions, for a prompt's argument and a template's
        done = await session.complete(
            types.PromptReference(type="ref/prompt", name="a__greet"),
            {"name": "name", "value": "b"},
        )
        assert done.completion.values == ["bob", "bert"]
        template = types.ResourceTemplateReference(type="ref/resource", uri="b://item/{id}")
        done = await session.complete(template, {"name": "id", "value": "1"})
        assert done.completion.values == ["1", "12"]


@pytest.mark.anyio
@GATEWAY_PROCESS
@pytest.mark.filterwarnings("ignore:resources/(un)?subscribe is removed")
async def test_a_2025_client_is_told_of_updates_to_what_it_subscribed(gateway: Gateway) -> None:
    updates: list[str] = []
    told, prompts_changed = anyio.Event(), anyio.Event()

    async def on_message(message: Any) -> None:
        if isinstance(message, types.ResourceUpdatedNotification):
            updates.append(str(message.params.uri))
            told.set()
        elif isinstance(message, types.PromptListChangedNotification):
            prompts_changed.set()

    async with http_session(gateway.url, message_handler=on_message) as session:
        await session.subscribe_resource("a://doc/3")
        await session.call_tool("a__touch", {"uri": "a://doc/9"})  # not subscribed
        await session.call_tool("a__touch", {"uri": "a://doc/3"})
        with anyio.fail_after(5):
            await told.wait()
        assert updates == ["a://doc/3"]
        await session.unsubscribe_resource("a://doc/3")
        # through the 2026-era upstream: its listen stream carries the subscription
        told = anyio.Event()
        await session.subscribe_resource("b://doc/4")
        await session.call_tool("b__touch", {"uri": "b://doc/4"})
        with anyio.fail_after(5):
            await told.wait()
        assert updates == ["a://doc/3", "b://doc/4"]
        # an upstream's prompt list change: told, and the next list has it
        await session.call_tool("a__add_prompt", {"name": "late"})
        with anyio.fail_after(5):
            await prompts_changed.wait()
        assert "a__late" in {p.name for p in (await session.list_prompts()).prompts}


def subscriptions(record: Path, uri: str) -> list[str]:
    """What an upstream was asked about ``uri``, in order (``subscribe``, ``unsubscribe``)."""
    events = [json.loads(line) for line in record.read_text().splitlines()]
    return [e["event"] for e in events if e.get("uri") == uri and "subscribe" in e["event"]]


@pytest.mark.anyio
@GATEWAY_PROCESS
@pytest.mark.filterwarnings("ignore:resources/(un)?subscribe is removed")
async def test_a_subscriber_that_disconnects_is_unsubscribed_upstream(gateway: Gateway) -> None:
    """The upstream keeps a subscription only while some client holds it: two sessions
    subscribe to one URI, the first leaving keeps it, the last leaving drops it."""
    uri, record = "a://doc/7", gateway.tmp / "rec-a"
    async with http_session(gateway.url) as first:
        async with http_session(gateway.url) as second:
            await first.subscribe_resource(uri)
            await second.subscribe_resource(uri)
        await anyio.sleep(0.3)  # the second session is closed (DELETE)
        assert subscriptions(record, uri) == ["subscribe"]
    with anyio.fail_after(5):
        while subscriptions(record, uri) != ["subscribe", "unsubscribe"]:  # noqa: ASYNC110
            await anyio.sleep(0.02)


@pytest.mark.anyio
@GATEWAY_PROCESS
@pytest.mark.filterwarnings("ignore:resources/(un)?subscribe is removed")
async def test_a_subscriber_whose_subscribe_is_in_flight_keeps_the_uri(gateway: Gateway) -> None:
    """While the upstream has not yet answered the first client's subscribe, a second
    client subscribing and unsubscribing does not unsubscribe the upstream."""
    uri, record = "a://item/late", gateway.tmp / "rec-a"
    async with http_session(gateway.url) as first, http_session(gateway.url) as second:
        async with anyio.create_task_group() as tg:
            tg.start_soon(first.subscribe_resource, uri)  # answered after 1 s
            with anyio.fail_after(5):
                while subscriptions(record, uri) != ["subscribe"]:  # noqa: ASYNC110
                    await anyio.sleep(0.02)
            await second.subscribe_resource(uri)
            await second.unsubscribe_resource(uri)
        assert "unsubscribe" not in subscriptions(record, uri)  # the first holds it


@pytest.mark.anyio
@GATEWAY_PROCESS
async def test_a_listen_stream_that_ends_unsubscribes_each_of_its_uris(gateway: Gateway) -> None:
    """A 2026-era stream's URIs are let go upstream when it ends, each of them, even when
    the upstream does not answer the unsubscribe of another."""
    slow, uri, record = "a://item/slow", "a://doc/8", gateway.tmp / "rec-a"
    async with (
        Client(gateway.url, cache=None) as client,
        client.listen(resource_subscriptions=[slow, uri]),
    ):
        with anyio.fail_after(5):
            while subscriptions(record, uri) != ["subscribe"]:  # noqa: ASYNC110
                await anyio.sleep(0.02)
    with anyio.fail_after(5):
        while subscriptions(record, uri) != ["subscribe", "unsubscribe"]:  # noqa: ASYNC110
            await anyio.sleep(0.02)


@pytest.mark.anyio
@GATEWAY_PROCESS
async def test_a_2026_client_reads_gets_and_listens_through_a_2026_upstream(
    gateway: Gateway,
) -> None:
    async with Client(gateway.url, cache=None) as client:
        assert client.protocol_version == "2026-07-28"
        listed = await client.list_resources()
        assert len(listed.resources) == 100 and listed.next_cursor is not None
        read = await client.read_resource("b://doc/5")
        assert isinstance(read.contents[0], types.TextResourceContents)
        got = await client.get_prompt("a__greet", {"name": "Lin"})
        assert isinstance(got.messages[0].content, types.TextContent)
        async with client.listen(resource_subscriptions=["b://doc/5"]) as subscription:
            await client.call_tool("b__touch", {"uri": "b://doc/5"})
            with anyio.fail_after(5):
                async for event in subscription:
                    assert getattr(event, "uri", None) == "b://doc/5"
                    break
        async with client.listen(prompts_list_changed=True) as subscription:
            await client.call_tool("b__add_prompt", {"name": "later"})
            with anyio.fail_after(5):
                async for event in subscription:
                    assert type(event).__name__ == "PromptsListChanged"
                    break
        assert "b__later" in {p.name for p in (await client.list_prompts()).prompts}


@pytest.mark.anyio
@GATEWAY_PROCESS
async def test_a_profile_hides_resources_and_prompts_and_the_cap_holds(
    gateway: Gateway, tmp_path: Path
) -> None:
    extra = """
[dispatcher]
max_output_bytes = 400
[profiles.limited]
deny_resources = ["b://doc/1*", "b://item/*"]
deny_prompts = ["b__plain"]
"""
    upstreams = http_upstream(gateway.b_url, "b")
    path = config(tmp_path, upstreams, 'profile = "limited"', extra)
    serve = [sys.executable, "-m", "toolrelay", "serve", "--config", str(path)]
    async with stdio_session(serve, tmp_path / "serve.err") as session:
        uris = {str(r.uri) for r in (await session.list_resources()).resources}
        assert "b://doc/2" in uris and not {u for u in uris if u.startswith("b://doc/1")}
        templates = (await session.list_resource_templates()).resource_templates
        assert [t.uri_template for t in templates] == ["b://user/{name}/card"]
        for uri in ("b://doc/1", "b://doc/15", "b://item/3"):
            with pytest.raises(MCPError) as refused:
                await session.read_resource(uri)
            assert refused.value.error.code == -32002
        prompts = {p.name for p in (await session.list_prompts()).prompts}
        assert "b__greet" in prompts and "b__plain" not in prompts
        with pytest.raises(MCPError):
            await session.get_prompt("b__plain")
        assert (await session.read_resource("b://doc/2")).contents
        with pytest.raises(MCPError) as capped:  # a blob of ~450 bytes: over the output cap
            await session.read_resource("b://blob")
        assert "output cap (400 bytes)" in capped.value.error.message
    reads = (gateway.tmp / "rec-b").read_text()
    assert '"b://doc/1"' not in reads and '"b://item/3"' not in reads  # never sent upstream


@pytest.mark.anyio
@GATEWAY_PROCESS
async def test_two_upstreams_offering_one_uri_are_refused_at_start(
    gateway: Gateway, tmp_path: Path
) -> None:
    upstreams = http_upstream(gateway.b_url, "x") + http_upstream(gateway.b_url, "y")
    config_file, settings = load(config(tmp_path, upstreams))
    service = Service(config_file, settings, environ=ENV, handle_signals=False, out=io.StringIO())
    with pytest.raises(BaseException) as refused:  # noqa: PT011 - a group holding it
        await service.run()
    error = innermost(refused.value)
    assert isinstance(error, ServeError)
    assert str(error) == (
        "upstreams 'x' and 'y' both offer the resource URI 'b://blob'; "
        "give one a prefix (prompts) or leave one out"
    )


@pytest.mark.anyio
@GATEWAY_PROCESS
async def test_a_reload_that_would_collide_is_refused_and_the_old_config_kept(
    gateway: Gateway, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = config(tmp_path, http_upstream(gateway.b_url, "x"))
    config_file, settings = load(path)
    out = io.StringIO()
    service = Service(config_file, settings, environ=ENV, handle_signals=False, out=out)
    async with anyio.create_task_group() as tg:
        tg.start_soon(service.run)
        with anyio.fail_after(20):
            while "MCP on" not in out.getvalue():  # noqa: ASYNC110 - its start-up line
                await anyio.sleep(0.02)
        loaded = service.reloader.loaded
        # y offers what x offers (its prompts are prefixed apart; its URIs are the same)
        path.write_text(path.read_text() + http_upstream(gateway.b_url, "y"))
        with pytest.raises(ReloadRefused) as refused:
            await service.reloader.reload()
        assert (refused.value.status, refused.value.error) == (400, "reload_failed")
        assert refused.value.message == (
            "upstreams 'x' and 'y' both offer the resource URI 'b://blob'; "
            "give one a prefix (prompts) or leave one out"
        )
        assert "reload refused, the old config keeps serving: upstreams 'x' and 'y'" in (
            caplog.text
        )
        assert list(service.upstreams.open) == ["x"] and service.reloader.loaded == loaded
        assert not service.dispatcher.registry.owns("y__touch")
        # the same prefix: the same tool names (refused before the URIs are looked at)
        path.write_text(path.read_text().replace('prefix = "y"', 'prefix = "x"'))
        with pytest.raises(ReloadRefused) as same_tools:
            await service.reloader.reload()
        assert same_tools.value.message.endswith("is registered twice"), same_tools.value.message
        assert list(service.upstreams.open) == ["x"] and service.reloader.loaded == loaded
        service.stop()


@pytest.mark.anyio
@GATEWAY_PROCESS
async def test_zz_a_slow_then_dead_upstreams_reads_answer_errors_its_breaker_counts(
    gateway: Gateway,
) -> None:
    async with Client(gateway.url, cache=None) as client:
        messages = []
        # b answers no read within its timeout_s (2 s): the read is cut there
        with anyio.fail_after(10), pytest.raises(MCPError) as slow:
            await client.read_resource("b://item/slow")
        messages.append(slow.value.error.message)
        gateway.b.kill()
        gateway.b.wait(10)
        for _ in range(2):
            with anyio.fail_after(10), pytest.raises(MCPError) as failed:
                await client.read_resource("b://doc/1")
            messages.append(failed.value.error.message)
        # the other upstream still answers
        other = await client.read_resource("a://doc/1")
        assert isinstance(other.contents[0], types.TextResourceContents)
    assert messages[0] == "b did not answer within 2 s"
    assert messages[1].startswith("b is not reachable")
    # fail_max = 2: the third read is refused at once, nothing sent
    assert messages[2].startswith("b is paused (its breaker is open)")
