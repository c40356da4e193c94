"""Poisoned shared breaker state stays contained (issue 28, item 4).

Values in the ``toolrelay:<key>`` hashes written by something else (a bad deploy, an old
version, an attacker with Redis access) must not turn calls into ``internal_error`` or admin
requests into 500s, nor stop the other keys from syncing: the poisoned key decides alone,
the rejection is logged once and counted. Everything runs against a real redis-server.
"""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator, Iterator
from typing import Any

import httpx
import hypothesis
import pytest
import redis as redis_py
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry

from helpers import wait_until
from redis_server import RedisServer
from toolrelay import (
    AuthContext,
    BreakerOptions,
    BudgetOptions,
    Dispatcher,
    DispatcherOptions,
    ErrorType,
    KeyPolicy,
    RetryOptions,
    StorageOptions,
    ToolError,
    ToolRegistry,
)
from toolrelay.serve.admin import AdminState, admin_app
from toolrelay.storage import CHANNEL

pytestmark = [pytest.mark.anyio, pytest.mark.servers]

POLICY = KeyPolicy(
    breaker=BreakerOptions(fail_max=3, reset_timeout_s=60),
    retry=RetryOptions(max_attempts=1),
    budget=BudgetOptions(share=0.2),  # shared through the same hash as the counts
)
TOKEN = "admin-token-0123456789abcdef"


async def failing(args: dict[str, Any], ctx: AuthContext) -> Any:
    raise ToolError("upstream 503", retryable=True)


def replica(url: str) -> tuple[Dispatcher, CollectorRegistry]:
    """A replica with two keys, ``crm`` (poisoned by the tests) and ``docs``."""
    registry = ToolRegistry()
    for name, key in (("lookup", "crm"), ("search", "docs")):
        registry.tool(name=name, parameters={"type": "object"}, breaker_key=key)(failing)
    metrics = CollectorRegistry()
    options = DispatcherOptions(
        keys={"crm": POLICY, "docs": POLICY},
        storage=StorageOptions(url=url, sync_interval_s=0.02),
    )
    return Dispatcher(registry, options, audit=None, metrics_registry=metrics), metrics


async def synced(dispatcher: Dispatcher) -> None:
    dispatcher.breakers.get("crm")
    dispatcher.breakers.get("docs")
    link = dispatcher.storage_link
    assert link is not None
    await wait_until(lambda: link.commands > 1 and link.listening.is_set())


async def sync_passes(dispatcher: Dispatcher, passes: int = 3) -> None:
    link = dispatcher.storage_link
    assert link is not None
    target = link.commands + passes
    await wait_until(lambda: link.commands >= target)


def rejected(metrics: CollectorRegistry, key: str, field: str) -> float:
    labels = {"breaker_key": key, "field": field}
    return metrics.get_sample_value("toolrelay_breaker_storage_rejected_total", labels) or 0.0


@pytest.fixture
def redis() -> Iterator[RedisServer]:
    with RedisServer() as server:
        yield server


@pytest.fixture
def raw(redis: RedisServer) -> Iterator[redis_py.Redis]:
    client = redis_py.Redis.from_url(redis.url)
    yield client
    client.close()


async def admin_requests(dispatcher: Dispatcher, metrics: CollectorRegistry) -> list[int]:
    """Every breaker endpoint of the admin API, as statuses."""
    state = AdminState(dispatcher, metrics, TOKEN)
    state.set_ready(True)
    auth = {"Authorization": f"Bearer {TOKEN}"}
    transport = httpx.ASGITransport(app=admin_app(state))
    statuses = []
    async with httpx.AsyncClient(transport=transport, base_url="http://admin") as api:
        for method, path in [
            ("GET", "/breakers"),
            ("GET", "/breakers/crm"),
            ("POST", "/breakers/crm/open"),
            ("POST", "/breakers/crm/close"),
            ("POST", "/breakers/crm/reset"),
            ("GET", "/breakers"),
            ("GET", "/tools"),
            ("GET", "/metrics"),
        ]:
            response = await api.request(method, path, headers=auth)
            statuses.append(response.status_code)
    return statuses


NOW = f"{time.time() + 3600:.3f}"  # fresh for the whole run
POISONS: list[tuple[str, dict[str, str], dict[str, str]]] = [
    ("state", {"gen": "1", "state": "exploded"}, {}),
    ("gen", {"gen": "abc", "state": "closed"}, {}),
    ("gen", {"gen": "-4", "state": "open"}, {}),
    ("gen", {"gen": "1" * 40, "state": "open"}, {}),
    ("opened_ms", {"gen": "1", "state": "open", "opened_ms": "soon"}, {}),
    ("break_ms", {"gen": "1", "state": "open", "break_ms": "9" * 400}, {}),
    ("break_ms", {"gen": "1", "state": "open", "break_ms": "-60000"}, {}),
    ("pinned", {"gen": "1", "state": "open", "pinned": "maybe"}, {}),
    ("counts", {}, {"evil": f"0,-1000,-1000,0,-1000,{NOW}"}),
    ("counts", {}, {"evil": f"0,x,1,1,1,{NOW}"}),
    ("counts", {}, {"evil": "0,1,1,1,1,nan"}),
    ("budget", {}, {"evil|budget": f"-5,-5,{NOW}"}),
]


# ids without the timestamp: each xdist worker collects the same test names
@pytest.mark.parametrize(
    ("field", "state", "counts"), POISONS, ids=lambda v: str(v).replace(NOW, "NOW")[:40]
)
async def test_a_poisoned_key_decides_alone_and_the_rest_syncs(
    redis: RedisServer,
    raw: redis_py.Redis,
    caplog: pytest.LogCaptureFixture,
    field: str,
    state: dict[str, str],
    counts: dict[str, str],
) -> None:
    here, metrics = replica(redis.url)
    there, _ = replica(redis.url)
    await synced(here)
    await synced(there)
    first = await here.dispatch("lookup", {})  # one failure; the key's retry budget is made
    if state:
        raw.hset("toolrelay:crm", mapping=state)
    if counts:
        raw.hset("toolrelay:crm:counts", mapping=counts)
    await sync_passes(here)
    assert rejected(metrics, "crm", field) >= 1
    # calls on the poisoned key are answered, and its breaker still opens on its own count
    answers = [first] + [await here.dispatch("lookup", {}) for _ in range(2)]
    assert [a.error_type for a in answers] == [ErrorType.TOOL_ERROR] * 3, answers[-1].message
    assert here.breakers.state("crm") == "open"
    assert (await here.dispatch("lookup", {})).error_type is ErrorType.CIRCUIT_OPEN
    # the admin API answers every breaker request
    statuses = await admin_requests(here, metrics)
    assert all(s < 500 for s in statuses), statuses
    # another key still syncs both ways, through the same link
    for _ in range(3):
        await there.dispatch("search", {})
    await wait_until(lambda: here.breakers.state("docs") == "open")
    here.breakers.force_close("docs")
    await wait_until(lambda: there.breakers.state("docs") == "closed")
    link = here.storage_link
    assert link is not None and link.up
    said = [r.getMessage() for r in caplog.records if "breaker storage" in r.getMessage()]
    # logged once for the key by each replica (both log here), not on every sync pass
    assert 1 <= len([m for m in said if "'crm'" in m]) <= 2, said
    assert not [r for r in caplog.records if r.exc_info], "no traceback logged"
    await here.aclose()
    await there.aclose()


@pytest.mark.parametrize(
    ("message", "field"),
    [
        ("garbage", None),
        ("1|exploded|0|0|0|0|crm", "state"),
        ("x|open|0|0|0|0|crm", "gen"),
        ("1|open|0|0|1|0|nobody", None),  # not a key of ours
        ("||||||", None),
    ],
)
async def test_a_poisoned_announcement_is_ignored_and_the_listener_goes_on(
    redis: RedisServer,
    raw: redis_py.Redis,
    caplog: pytest.LogCaptureFixture,
    message: str,
    field: str | None,
) -> None:
    here, metrics = replica(redis.url)
    there, _ = replica(redis.url)
    await synced(here)
    await synced(there)
    raw.publish(CHANNEL, message)
    assert (await here.dispatch("lookup", {})).error_type is ErrorType.TOOL_ERROR
    for _ in range(3):
        await there.dispatch("search", {})
    await wait_until(lambda: here.breakers.state("docs") == "open")
    assert here.breakers.state("crm") == "closed"
    if field is not None:  # heard before the announcement of docs: one connection, in order
        assert rejected(metrics, "crm", field) == 1
    assert not [r for r in caplog.records if r.exc_info], "no traceback logged"
    await here.aclose()
    await there.aclose()


# -- fuzzing the stored values -------------------------------------------------------------------
VALUES = st.one_of(
    st.sampled_from(
        ["0", "1", "-1", "open", "closed", "half_open", "nan", "inf", "1e3", " 7", "1_0", "0x10"]
    ),
    st.just("9" * 30),
    st.integers(-(10**20), 10**20).map(str),
    st.text(max_size=6),
    st.binary(max_size=6),
)
STATE_FIELDS = st.dictionaries(
    st.sampled_from(["gen", "state", "opened_ms", "break_ms", "pinned", "succ"]), VALUES
)
COUNT_VALUES = st.one_of(
    VALUES,
    st.lists(VALUES, min_size=3, max_size=7).map(lambda parts: ",".join(map(str, parts))),
)


@pytest.fixture
async def fuzzed(redis: RedisServer) -> AsyncIterator[Dispatcher]:
    here, _ = replica(redis.url)
    await synced(here)
    yield here
    await here.aclose()


@hypothesis.settings(
    max_examples=20,
    deadline=None,
    suppress_health_check=list(hypothesis.HealthCheck),
    phases=[hypothesis.Phase.explicit, hypothesis.Phase.reuse, hypothesis.Phase.generate],
)
@hypothesis.given(
    state=STATE_FIELDS,
    counts=st.dictionaries(st.sampled_from(["a", "b|budget", "c"]), COUNT_VALUES, max_size=3),
)
async def test_fuzzed_stored_values_never_break_a_call_or_the_sync(
    fuzzed: Dispatcher, raw: redis_py.Redis, state: dict[str, Any], counts: dict[str, Any]
) -> None:
    here = fuzzed
    raw.delete("toolrelay:crm", "toolrelay:crm:counts")
    if state:
        raw.hset("toolrelay:crm", mapping=state)
    if counts:
        raw.hset("toolrelay:crm:counts", mapping=counts)
    await sync_passes(here, 2)
    answer = await here.dispatch("lookup", {})
    assert answer.error_type in {ErrorType.TOOL_ERROR, ErrorType.CIRCUIT_OPEN}, answer.message
    json.dumps(here.breakers.snapshot())
    here.breakers.force_open("crm")
    here.breakers.force_close("crm")
    # the other key adopts what Redis says of it
    docs = here.breakers.get("docs")
    want = "closed" if docs.known == "open" else "open"
    raw.hset("toolrelay:docs", mapping={"gen": docs.period + 1, "state": want, "pinned": 0})
    await wait_until(lambda: here.breakers.state("docs") == want)
    link = here.storage_link
    assert link is not None and link.up
