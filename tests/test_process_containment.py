"""``isolation="process"``: killed means gone (issue 28, item 5).

What a handler starts (a forked child, a ``sleep`` subprocess) dies with its worker at the
deadline and at ``aclose()``; a worker gets an allow-listed environment, not the host's;
and a result frame is capped by its header, before anything is allocated for it.
"""

from __future__ import annotations

import os
import time
import tracemalloc
from pathlib import Path
from typing import Any

import pytest

import isolated_tools as tools
from helpers import wait_until
from test_process_isolation import alive, pid_from, registry_with
from toolrelay import Dispatcher, DispatcherOptions, Limits
from toolrelay.config import parse_config

pytestmark = pytest.mark.anyio

OPTIONS = DispatcherOptions(telemetry=False)
STARTERS = [tools.fork_then_hang, tools.spawn_sleep]


@pytest.mark.parametrize("starter", STARTERS, ids=lambda fn: fn.__name__)
async def test_what_a_handler_started_is_gone_after_its_timeout(
    tmp_path: Path, starter: Any
) -> None:
    registry = registry_with(
        start=(starter, {"timeout_s": 1, "breaker_key": "k"}),
        warm=(tools.describe, {"breaker_key": "k"}),
    )
    async with Dispatcher(registry, OPTIONS) as dispatcher:
        await dispatcher.dispatch("warm", {})  # the deadline is the handler's alone
        pidfile = tmp_path / "child"
        answer = await dispatcher.dispatch("start", {"pidfile": str(pidfile)})
        assert answer.error_type == "timeout"
        child = pid_from(pidfile)
        await wait_until(lambda: not alive(child), 2.0)  # (reparented: reaped by whoever)


@pytest.mark.parametrize("starter", STARTERS, ids=lambda fn: fn.__name__)
async def test_what_a_handler_started_is_gone_after_aclose(tmp_path: Path, starter: Any) -> None:
    registry = registry_with(start=(starter, {"timeout_s": 30}))
    dispatcher = Dispatcher(registry, OPTIONS)
    pidfile = tmp_path / "child"
    answer = await dispatcher.dispatch("start", {"pidfile": str(pidfile), "hang": False})
    assert answer.ok  # the handler answered; what it started runs on beside the idle worker
    child = pid_from(pidfile)
    assert alive(child)
    await dispatcher.aclose()
    await wait_until(lambda: not alive(child), 2.0)


# -- the environment -----------------------------------------------------------------------------
async def test_a_worker_gets_an_allow_listed_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TOOLRELAY_ADMIN_TOKEN", "admin-secret-0123456789")
    monkeypatch.setenv("DB_PASSWORD", "hunter2")
    monkeypatch.setenv("TOOL_REGION", "eu-west-1")
    registry = registry_with(env=(tools.environment, {}))
    options = DispatcherOptions(telemetry=False, isolation_env=frozenset({"TOOL_REGION"}))
    async with Dispatcher(registry, options) as dispatcher:
        answer = await dispatcher.dispatch("env", {"names": ["TOOL_REGION", "PATH"]})
    assert answer.ok, answer.message
    seen = answer.data
    for names in (seen["names"], seen["subprocess"]):
        assert "TOOLRELAY_ADMIN_TOKEN" not in names and "DB_PASSWORD" not in names
        assert "TOOL_REGION" in names and "PATH" in names
    assert seen["values"] == {"TOOL_REGION": "eu-west-1", "PATH": os.environ["PATH"]}
    assert set(seen["names"]) <= {"TOOL_REGION", "PATH", "HOME", "LANG", "LC_ALL", "LC_CTYPE",
                                  "TZ", "TMPDIR", "USER", "LOGNAME"}  # fmt: skip


async def test_without_isolation_env_only_the_minimal_names_pass(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("TOOL_REGION", "eu-west-1")
    registry = registry_with(env=(tools.environment, {}))
    async with Dispatcher(registry, OPTIONS) as dispatcher:
        answer = await dispatcher.dispatch("env", {})
    assert answer.ok and "TOOL_REGION" not in answer.data["names"]


def test_isolation_env_is_read_from_the_config_file() -> None:
    options = parse_config({"dispatcher": {"isolation_env": ["TOOL_REGION"]}}).dispatcher_options()
    assert options.isolation_env == frozenset({"TOOL_REGION"})


# -- the result frame ------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("tool", "size"),
    [(tools.big_result, 200_000_000), (tools.forged_header, 2**40)],
    ids=["200 MB result", "forged 1 TiB header"],
)
async def test_a_result_frame_over_the_cap_is_refused_by_its_header(tool: Any, size: int) -> None:
    registry = registry_with(big=(tool, {"timeout_s": 20}))
    options = DispatcherOptions(telemetry=False, limits=Limits(max_output_bytes=1024))
    async with Dispatcher(registry, options) as dispatcher:
        tracemalloc.start()
        try:
            started = time.perf_counter()
            answer = await dispatcher.dispatch("big", {"size": size})
            took = time.perf_counter() - started
            _, peak = tracemalloc.get_traced_memory()
        finally:
            tracemalloc.stop()
    assert answer.error_type == "invalid_output", answer.message
    assert "over the output cap" in answer.message
    # the size the header announced: exactly, or pickled (a little over 200 MB)
    assert ("1,099,511,627,776 bytes" if size == 2**40 else "is 200,0") in answer.message
    assert peak < 5_000_000  # the host read the header only
    assert took < 10
