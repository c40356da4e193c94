"""A 2026-era client is asked what its upstream asks during its call (``InputRequiredResult``
rounds through ``toolrelay serve``).

One ``toolrelay serve`` (HTTP, two client tokens) runs in front of
``servers/everything_server.py`` over HTTP (``new__``: the 2026-era protocol, so it asks with
an ``InputRequiredResult`` that the gateway's MCP client drives) and of
``servers/mcp_relay_server.py`` over stdio (``rec__``: the 2025 handshake, so it asks with a
request on the call's stream; it records what reached it). The clients are the MCP SDK's
``mcp.Client`` speaking 2026-07-28 (stateless: every round is a request of its own).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import httpx2
import mcp.types as types
import pytest
from mcp import Client, ClientSession, MCPError
from mcp.client.session import ClientRequestContext
from mcp.client.streamable_http import streamable_http_client

from helpers import wait_until
from test_gateway_relay import MCP_URL, texts
from toolrelay.serve.rounds import HELD_PER_CLIENT

pytestmark = [pytest.mark.anyio, pytest.mark.parametrize("anyio_backend", ["asyncio"])]

SERVERS = Path(__file__).parent / "servers"
ALICE, BOB = "alice-" + "a" * 32, "bob-" + "b" * 32
SLOW = 3  # s: the deadline of the tools a client never comes back to
SLOW_ASK = ("new__test_elicitation_sep1330_enums", {})  # asks the client, SLOW deadline


class Gateway:
    def __init__(self, tmp: Path, url: str) -> None:
        self.tmp, self.url = tmp, url
        self.record = tmp / "rec.jsonl"
        self.errlog = tmp / "serve.err"

    def events(self, kind: str) -> list[dict[str, Any]]:
        if not self.record.exists():
            return []
        lines = self.record.read_text().splitlines()
        return [e for e in map(json.loads, lines) if e["event"] == kind]

    def refused(self, word: str) -> list[dict[str, Any]]:
        """The errors the relay server got for its requests, with ``word`` in them."""
        return [e for e in self.events("refused") if word in e["message"]]


def wait_for_line(path: Path, proc: subprocess.Popen[Any], pattern: Any) -> Any:
    deadline = time.monotonic() + 30
    while not (found := pattern.search(path.read_text())):
        assert proc.poll() is None and time.monotonic() < deadline, path.read_text()
        time.sleep(0.05)
    return found


@pytest.fixture(scope="module")
def gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Gateway]:
    tmp = tmp_path_factory.mktemp("ask")
    everything = subprocess.Popen(
        [sys.executable, str(SERVERS / "everything_server.py"), "--http", "0"],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert everything.stdout is not None
    port = everything.stdout.readline().split()[1]  # "PORT <n>", once it listens
    gw = Gateway(tmp, "")
    relay = [sys.executable, str(SERVERS / "mcp_relay_server.py"), "--record", str(gw.record)]
    config = tmp / "toolrelay.toml"
    config.write_text(
        f"""
[serve]
transport = "http"
[serve.http]
port = 0
[serve.http.clients.alice]
token_env = "ALICE_TOKEN"
[serve.http.clients.bob]
token_env = "BOB_TOKEN"
[serve.upstreams.new]
url = "http://127.0.0.1:{port}/mcp"
breaker_key = "new"
prefix = "new"
risk_override = "read"
tool_timeouts = {{ test_elicitation_sep1330_enums = {SLOW} }}
tool_risk_override = {{ test_simple_text = "write" }}  # needs the client's approval
new_tool_risk = "read"
[serve.upstreams.rec]
command = {json.dumps(relay)}
breaker_key = "rec"
prefix = "rec"
risk_override = "read"
tool_timeouts = {{ elicit = {SLOW} }}
"""
    )
    env = {**os.environ, "ALICE_TOKEN": ALICE, "BOB_TOKEN": BOB}
    command = [sys.executable, "-m", "toolrelay", "serve", "--config", str(config)]
    with gw.errlog.open("a") as err:
        proc = subprocess.Popen(command, stdin=subprocess.DEVNULL, stderr=err, env=env)
    try:
        gw.url = wait_for_line(gw.errlog, proc, MCP_URL).group(1)
        yield gw
    finally:
        for running in (proc, everything):
            running.terminate()
            running.wait(15)
    assert "Traceback" not in gw.errlog.read_text()


class Human:
    """A 2026-era client's callbacks: it samples, answers forms and has a root."""

    async def sampling(
        self, context: ClientRequestContext, params: types.CreateMessageRequestParams
    ) -> types.CreateMessageResult:
        content = types.TextContent(type="text", text="4")
        return types.CreateMessageResult(role="assistant", content=content, model="m")

    async def elicitation(
        self, context: ClientRequestContext, params: types.ElicitRequestParams
    ) -> types.ElicitResult:
        assert isinstance(params, types.ElicitRequestFormParams)
        if "color" in params.requested_schema["properties"]:
            return types.ElicitResult(action="accept", content={"color": "blue"})
        return types.ElicitResult(action="accept", content={"username": "ada", "email": "a@b.c"})

    async def roots(self, context: ClientRequestContext) -> types.ListRootsResult:
        return types.ListRootsResult(roots=[types.Root(uri="file:///work/x")])

    def callbacks(self) -> dict[str, Any]:
        return {
            "sampling_callback": self.sampling,
            "elicitation_callback": self.elicitation,
            "list_roots_callback": self.roots,
        }


@asynccontextmanager
async def client(url: str, token: str, **callbacks: Any) -> AsyncIterator[Client]:
    headers = {"Authorization": f"Bearer {token}"}
    async with (
        httpx2.AsyncClient(headers=headers, timeout=httpx2.Timeout(30.0, read=60.0)) as http,
        Client(streamable_http_client(url, http_client=http), cache=None, **callbacks) as c,
    ):
        assert c.protocol_version == "2026-07-28"
        yield c


async def first_round(who: Client, name: str, arguments: dict[str, Any]) -> Any:
    return await who.session.call_tool(name, arguments, allow_input_required=True)


async def test_a_2026_client_is_asked_what_either_era_of_upstream_asks(gateway: Gateway) -> None:
    async with client(gateway.url, ALICE, **Human().callbacks()) as alice:
        # a 2026-era upstream: its InputRequiredResult, driven by the gateway's MCP client
        elicited = await alice.call_tool("new__test_elicitation", {"message": "Who?"})
        sampled = await alice.call_tool("new__test_sampling", {"prompt": "2+2?"})
        # a 2025-era upstream: its requests on the call's stream
        rec_sampled = await alice.call_tool("rec__sample", {})
        rec_elicited = await alice.call_tool("rec__elicit", {})
        rec_roots = await alice.call_tool("rec__roots", {})
    content = json.dumps({"email": "a@b.c", "username": "ada"})
    assert texts(elicited) == f"Elicitation completed: action=accept, content={content}"
    assert texts(sampled) == "LLM response: 4"
    assert texts(rec_sampled) == "sampled: 4"
    assert texts(rec_elicited) == "accept: {'color': 'blue'}"
    assert texts(rec_roots) == "file:///work/x"


async def test_the_request_state_is_the_callers_own_for_this_call_once(gateway: Gateway) -> None:
    human = Human().callbacks()
    arguments = {"message": "Who?"}
    async with (
        client(gateway.url, ALICE, **human) as alice,
        client(gateway.url, BOB, **human) as bob,
    ):
        first = await first_round(alice, "new__test_elicitation", arguments)
        assert isinstance(first, types.InputRequiredResult), first
        assert first.input_requests is not None and first.request_state is not None
        [(key, request)] = first.input_requests.items()
        assert isinstance(request, types.ElicitRequest)
        state = first.request_state
        answer: dict[str, Any] = {key: types.ElicitResult(action="decline")}
        refused = [
            (alice, "new__test_elicitation", arguments, "v1.guessed"),  # never issued
            (bob, "new__test_elicitation", arguments, state),  # another client's
            (alice, "new__test_elicitation", {"message": "Other"}, state),  # another call
            (alice, "new__test_sampling", {"prompt": "x"}, state),
        ]
        for who, name, args, given in refused:
            with pytest.raises(MCPError) as invalid:
                await who.session.call_tool(
                    name,
                    args,
                    input_responses=answer,
                    request_state=given,
                    allow_input_required=True,
                )
            assert invalid.value.error.code == types.INVALID_PARAMS
            assert invalid.value.error.message == "Invalid or expired requestState"
        done = await alice.session.call_tool(
            "new__test_elicitation",
            arguments,
            input_responses=answer,
            request_state=state,
            allow_input_required=True,
        )
        assert isinstance(done, types.CallToolResult)
        assert texts(done) == "Elicitation completed: action=decline, content=null"
        with pytest.raises(MCPError) as replayed:  # the call has ended: its state with it
            await alice.session.call_tool(
                "new__test_elicitation",
                arguments,
                input_responses=answer,
                request_state=state,
                allow_input_required=True,
            )
        assert replayed.value.error.code == types.INVALID_PARAMS


async def test_a_client_without_the_capability_fails_the_upstream_at_once(
    gateway: Gateway,
) -> None:
    async with client(gateway.url, ALICE, sampling_callback=Human().sampling) as alice:
        started = time.monotonic()
        new = await alice.call_tool("new__test_elicitation", {"message": "Who?"})
        rec = await alice.call_tool("rec__elicit", {})
        took = time.monotonic() - started
        sampled = await alice.call_tool("rec__sample", {})  # what it declared: asked
    assert took < 3
    assert new.is_error and "did not declare the capability" in texts(new), texts(new)
    assert rec.is_error and f"refused {types.METHOD_NOT_FOUND}: elicitation/create" in texts(rec)
    assert texts(sampled) == "sampled: 4"


async def test_a_client_that_never_comes_back_holds_nothing_past_the_deadline(
    gateway: Gateway,
) -> None:
    """Bob leaves his calls unanswered: shortly before each call's deadline its upstream's
    request is answered with an error (the upstream ends the call itself, no timeout for its
    breaker to count), and at most HELD_PER_CLIENT calls wait on him at once."""
    slow = ("new__test_elicitation_sep1330_enums", {})
    held: list[Any] = []
    async with client(gateway.url, BOB, **Human().callbacks()) as bob:
        started = time.monotonic()

        async def hold(name: str, arguments: dict[str, Any]) -> None:
            held.append(await first_round(bob, name, arguments))

        async with anyio.create_task_group() as tg:
            tg.start_soon(hold, "rec__elicit", {})
            for _ in range(HELD_PER_CLIENT - 1):
                tg.start_soon(hold, *slow)
        assert all(isinstance(h, types.InputRequiredResult) for h in held), held
        over = await first_round(bob, *slow)  # one too many: the upstream is refused at once
        assert isinstance(over, types.CallToolResult) and over.is_error, over
        assert f"{HELD_PER_CLIENT} calls are waiting" in texts(over), texts(over)
        late = "did not answer"  # the gateway's log, once a call, shortly before its deadline
        await wait_until(lambda: gateway.errlog.read_text().count(late) == len(held), SLOW + 10)
        assert time.monotonic() - started >= SLOW / 2
        # the 2025-era upstream got the error in time, and ended its call itself
        await wait_until(lambda: len(gateway.refused("deadline")) == 1)
        [rec] = gateway.refused("deadline")
        assert (rec["tool"], rec["code"]) == ("elicit", types.METHOD_NOT_FOUND)
        [gone] = [h for h in held if "colour" in str(h.input_requests)]  # rec__elicit's
        cancel = {key: types.ElicitResult(action="cancel") for key in gone.input_requests}
        with pytest.raises(MCPError) as expired:  # its call has ended: its state with it
            await bob.session.call_tool(
                "rec__elicit",
                {},
                input_responses=cancel,
                request_state=gone.request_state,
                allow_input_required=True,
            )
        assert expired.value.error.code == types.INVALID_PARAMS
        # nothing is left held, and no breaker counted Bob's silence: he may be asked again
        again = await first_round(bob, *slow)
        assert isinstance(again, types.InputRequiredResult), again
    assert "closed → open" not in gateway.errlog.read_text()


async def test_a_2026_client_approves_a_risky_call_in_a_round(gateway: Gateway) -> None:
    asked: list[str] = []

    async def approve(
        context: ClientRequestContext, params: types.ElicitRequestParams
    ) -> types.ElicitResult:
        asked.append(params.message)
        return types.ElicitResult(action="accept" if len(asked) == 1 else "decline")

    async with client(gateway.url, ALICE, elicitation_callback=approve) as alice:
        approved = await alice.call_tool("new__test_simple_text", {})
        declined = await alice.call_tool("new__test_simple_text", {})
    assert texts(approved) == "This is a simple text response for testing."
    assert asked[0].startswith("Allow the write action 'new__test_simple_text'"), asked
    answer = json.loads(texts(declined))
    assert answer["error_type"] == "denied" and answer["message"].endswith("(declined)"), answer


async def test_a_2025_client_that_does_not_answer_is_cut_before_the_deadline_too(
    gateway: Gateway,
) -> None:
    """The same bound for a request on a 2025-era call's stream: the upstream gets its
    error before the call's deadline and answers the call itself (no timeout counted)."""

    async def silent(
        context: ClientRequestContext, params: types.ElicitRequestParams
    ) -> types.ElicitResult:
        await anyio.sleep_forever()
        raise AssertionError("unreachable")

    headers = {"Authorization": f"Bearer {ALICE}"}
    async with (
        httpx2.AsyncClient(headers=headers, timeout=httpx2.Timeout(30.0)) as http,
        streamable_http_client(gateway.url, http_client=http) as (read, write),
        ClientSession(read, write, elicitation_callback=silent) as session,
    ):
        await session.initialize()
        started = time.monotonic()
        answer = await session.call_tool("rec__elicit", {})
        took = time.monotonic() - started
    assert SLOW / 2 <= took < SLOW, took
    envelope = json.loads(texts(answer))
    assert envelope["error_type"] == "tool_error", envelope  # the upstream's, not a timeout
    assert "did not answer before the call's deadline" in envelope["message"]


async def test_calls_asked_together_are_held_at_most_the_bound(gateway: Gateway) -> None:
    """Calls whose upstreams ask at once count as waiting as soon as they ask (not only
    once their round is answered): past the bound the upstream is refused, however fast
    the requests came."""
    over_by = 6
    rounds: list[Any] = []
    async with client(gateway.url, ALICE, **Human().callbacks()) as alice:

        async def call() -> None:
            rounds.append(await first_round(alice, *SLOW_ASK))

        async with anyio.create_task_group() as tg:
            for _ in range(HELD_PER_CLIENT + over_by):
                tg.start_soon(call)
        held = [r for r in rounds if isinstance(r, types.InputRequiredResult)]

        async def end(held_call: types.InputRequiredResult) -> None:  # nothing left held
            assert held_call.input_requests is not None
            cancel = {key: types.ElicitResult(action="cancel") for key in held_call.input_requests}
            done = await alice.session.call_tool(
                *SLOW_ASK,
                input_responses=cancel,
                request_state=held_call.request_state,
                allow_input_required=True,
            )
            assert isinstance(done, types.CallToolResult), done

        async with anyio.create_task_group() as tg:
            for held_call in held:
                tg.start_soon(end, held_call)
    refused = [r for r in rounds if not isinstance(r, types.InputRequiredResult)]
    assert len(held) == HELD_PER_CLIENT, [texts(r) for r in refused]
    assert all(f"{HELD_PER_CLIENT} calls are waiting" in texts(r) for r in refused)


async def test_a_2026_client_that_cancels_its_call_cancels_it_upstream(gateway: Gateway) -> None:
    """The host cancels a call served in rounds while its request waits: the upstream's
    call is cancelled (not left to its deadline), and the gateway answers nothing for it."""
    async with client(gateway.url, ALICE, **Human().callbacks()) as alice:
        with anyio.CancelScope() as scope:

            async def cancel_once_upstream() -> None:
                await wait_until(lambda: any(e["tool"] == "hang" for e in gateway.events("call")))
                scope.cancel()

            async with anyio.create_task_group() as tg:
                tg.start_soon(cancel_once_upstream)
                await alice.call_tool("rec__hang", {})
                raise AssertionError("the call was answered")
        await wait_until(lambda: any(e["tool"] == "hang" for e in gateway.events("cancelled")), 5)
        assert texts(await alice.call_tool("rec__sample", {})) == "sampled: 4"  # still served
