"""The config file: the annotated example works, every error names its key path."""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path
from typing import Any

import pytest

import isolated_tools
from toolrelay import (
    AuthContext,
    BreakerOptions,
    BudgetOptions,
    BulkheadOptions,
    Dispatcher,
    DispatcherOptions,
    ErrorType,
    HedgeOptions,
    KeyPolicy,
    Limits,
    RetryOptions,
    ToolRegistry,
)
from toolrelay.config import ConfigError, load_config, parse_config
from toolrelay.loading import PluginLoadError
from toolrelay.settings import MAX_FILE_BYTES

pytestmark = pytest.mark.anyio
EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "toolrelay.toml"


async def test_the_annotated_example_builds_a_dispatcher() -> None:
    config = load_config(EXAMPLE)
    assert config.keys["searxng"] == KeyPolicy(
        breaker=BreakerOptions(fail_max=3, reset_timeout_s=10, slow_call_s=3.0),
        bulkhead=BulkheadOptions(max_concurrent_per_tenant=4),
    )
    assert config.default_key.bulkhead.max_concurrent == 32
    dispatcher = Dispatcher.from_config(EXAMPLE)
    try:
        names = {spec["function"]["name"] for spec in dispatcher.specs("support")}
        assert names == {"weather_current", "weather_forecast", "web_search", "feed_latest"}
        tool = dispatcher.registry.resolve("web_search")
        assert tool is not None and tool.decl.timeout_s == 4.0 and tool.decl.max_attempts == 2
        assert dispatcher.policy("anything-else").breaker.fail_max == 5
        denied = await dispatcher.dispatch("web_search", '{"query": "x"}', profile="nobody")
        assert denied.error_type is ErrorType.TOOL_POLICY
    finally:
        await dispatcher.aclose()


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("colour = 'red'", "(top level): Additional properties are not allowed ('colour'"),
        (
            "[keys.x.breaker]\nfail_max = 0",
            "keys.x.breaker.fail_max: must be ≥ 1",
        ),
        (
            "[keys.x.breaker]\nfail_max = 'many'",
            "fail_max: must be of type 'integer', not a string",
        ),
        ("[keys.x.breaker]\nfailmax = 3", "keys.x.breaker: Additional properties are not allowed"),
        ("[keys.x.retry]\nmax_attempts = 0", "keys.x.retry.max_attempts: must be ≥ 1"),
        (
            "[keys.x.hedge]\nafter_s = 'fast'",
            "after_s: must be of type 'number', not a string or must be 'adaptive'",
        ),
        ("[profiles.p]\nmax_risk = 'extreme'", "profiles.p.max_risk:"),
        ("[[faults]]\nkind = 'hang'", "faults.0:"),
        ("[[faults]]\nkind = 'hang'\ntool = 'a'\nbreaker_key = 'b'", "faults.0:"),
        ("[telemetry]\nmetrics_port = 70000", "telemetry.metrics_port:"),
        ("[storage]\nurl = 'http://x'", "storage.url:"),
        ("[plugins.w]\nmodule = 'a'\nentry_point = 'b'", "plugins.w:"),
        ("[faults]", "faults:"),
    ],
)
def test_errors_name_the_key_path(tmp_path: Path, text: str, expected: str) -> None:
    path = tmp_path / "toolrelay.toml"
    path.write_text(text)
    with pytest.raises(ConfigError) as caught:
        load_config(path)
    message = str(caught.value)
    assert expected in message and str(path) in message
    assert "\n" not in message


def test_unreadable_and_invalid_toml(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="cannot read"):
        load_config(tmp_path / "missing.toml")
    bad = tmp_path / "bad.toml"
    bad.write_text("[breakers\nfail_max = 1")
    with pytest.raises(ConfigError, match="not valid TOML"):
        load_config(bad)
    bad.write_bytes(b"x = '\xff'")
    with pytest.raises(ConfigError, match="not UTF-8 text"):
        load_config(bad)


def test_a_fifo_a_directory_or_a_huge_file_is_refused_unread(tmp_path: Path) -> None:
    fifo = tmp_path / "fifo.toml"
    os.mkfifo(fifo)  # nobody writes to it: opening it to read would wait forever
    with pytest.raises(ConfigError, match=r"fifo\.toml: not a regular file"):
        load_config(fifo)
    with pytest.raises(ConfigError, match=r"not a regular file|cannot read"):
        load_config(tmp_path)
    huge = tmp_path / "huge.toml"
    huge.write_text("#" * MAX_FILE_BYTES + "\n")
    with pytest.raises(ConfigError, match="larger than 1048576 bytes"):
        load_config(huge)
    huge.write_text("#" * (MAX_FILE_BYTES - 1) + "\n")
    assert load_config(huge).plugins == {}


def test_values_checked_beyond_types() -> None:
    with pytest.raises(
        ConfigError, match=r"faults\.0\.error_type: must be one of 'invalid_arguments'"
    ):
        parse_config({"faults": [{"kind": "error", "tool": "t", "error_type": "oops"}]})


def test_plugin_and_tool_errors(tmp_path: Path) -> None:
    path = tmp_path / "toolrelay.toml"
    path.write_text("[plugins.nonexistent]\n")
    with pytest.raises(PluginLoadError, match="nonexistent"):
        Dispatcher.from_config(path)
    path.write_text("[tools.no_such_tool]\ntimeout_s = 1\n")
    with pytest.raises(ConfigError, match=r"tools\.no_such_tool: no tool named"):
        Dispatcher.from_config(path)


async def test_keyword_arguments_override_the_file(tmp_path: Path) -> None:
    path = tmp_path / "toolrelay.toml"
    path.write_text("[dispatcher]\nmax_argument_bytes = 10\n[telemetry]\nenabled = false\n")
    dispatcher = Dispatcher.from_config(path)
    assert dispatcher.telemetry is None
    registry = dispatcher.registry
    registry.tool(name="t", parameters={"type": "object"})(lambda a, c: "ok")
    assert (await dispatcher.dispatch("t", '{"aaaaaaaaaa": 1}')).error_type is (
        ErrorType.INVALID_ARGUMENTS
    )
    wider = Dispatcher.from_config(
        path, registry=registry, overrides={"limits": Limits(max_argument_bytes=1000)}
    )
    assert (await wider.dispatch("t", '{"aaaaaaaaaa": 1}')).ok


# -- [tools.NAME] isolation ---------------------------------------------------------------------
def _isolation_registry() -> ToolRegistry:
    """``describe`` (a module-level function: it can run in a worker process), and tools
    that cannot: a nested function and an async one."""

    def nested(args: dict[str, Any], ctx: AuthContext) -> str:
        return "nested"

    registry = ToolRegistry()
    describe = isolated_tools.describe
    registry.tool(name="describe", parameters={"type": "object"}, timeout_s=30)(describe)
    registry.tool(name="nested", parameters={"type": "object"})(nested)
    registry.tool(name="async_tool", parameters={"type": "object"})(isolated_tools.async_tool)
    return registry


async def test_an_isolation_override_runs_the_tool_in_a_worker_process(tmp_path: Path) -> None:
    registry = _isolation_registry()
    async with Dispatcher(
        registry, DispatcherOptions(telemetry=False)
    ) as plain:  # the tool's own mode: a thread
        assert (await plain.dispatch("describe", {})).data["pid"] == os.getpid()
    path = tmp_path / "toolrelay.toml"
    path.write_text('[tools.describe]\nisolation = "process"\n')
    assert load_config(path).tools["describe"].isolation == "process"
    async with Dispatcher.from_config(
        path, overrides={"telemetry": False}, registry=registry
    ) as dispatcher:
        result = await dispatcher.dispatch("describe", {"x": 1})
        assert result.ok, result.to_model()
        assert result.data["pid"] != os.getpid() and result.data["args"] == {"x": 1}
        assert dispatcher.processes.processes() == {"describe": 1}  # its own key
    path.write_text('[tools.describe]\nisolation = "thread"\n')  # and back
    async with Dispatcher.from_config(
        path, overrides={"telemetry": False}, registry=registry
    ) as dispatcher:
        assert (await dispatcher.dispatch("describe", {})).data["pid"] == os.getpid()
        assert dispatcher.processes.processes() == {}


@pytest.mark.parametrize(
    ("tool", "expected"),
    [
        ("nested", "tools.nested.isolation: isolation='process' needs a module-level function"),
        ("async_tool", "tools.async_tool.isolation: isolation='process' is for sync handlers"),
    ],
)
async def test_a_refused_isolation_override_is_a_config_error(
    tmp_path: Path, tool: str, expected: str
) -> None:
    registry = _isolation_registry()
    path = tmp_path / "toolrelay.toml"
    path.write_text(f'[tools.{tool}]\nisolation = "process"\ntimeout_s = 2\n')
    with pytest.raises(ConfigError) as caught:
        Dispatcher.from_config(path, registry=registry)
    message = str(caught.value)
    assert message.startswith(f"{path}: {expected}"), message
    assert "\n" not in message and "Traceback" not in message
    resolved = registry.resolve(tool)  # nothing of the table applied
    assert resolved is not None and resolved.process_target is None
    assert resolved.decl.timeout_s != 2
    async with Dispatcher(
        registry, DispatcherOptions(telemetry=False)
    ) as dispatcher:  # still in thread mode
        assert (await dispatcher.dispatch(tool, {})).ok
        assert dispatcher.processes.processes() == {}


def test_isolation_must_be_thread_or_process(tmp_path: Path) -> None:
    path = tmp_path / "toolrelay.toml"
    path.write_text('[tools.describe]\nisolation = "fork"\n')
    with pytest.raises(ConfigError, match=r"tools\.describe\.isolation: must be one of "):
        load_config(path)


# -- options on reload ------------------------------------------------------------------------
def test_a_policy_names_what_cannot_change_for_a_key_in_use() -> None:
    old = KeyPolicy(bulkhead=BulkheadOptions(max_concurrent=4))
    new = KeyPolicy(
        breaker=BreakerOptions(fail_max=9),
        bulkhead=BulkheadOptions(max_concurrent=8, wait_s=1.0),
        budget=BudgetOptions(share=0.1),
    )
    assert old.fixed_changes(new) == ["bulkhead.max_concurrent", "bulkhead.wait_s", "budget.share"]
    live = KeyPolicy(breaker=BreakerOptions(fail_max=9), retry=RetryOptions(max_attempts=1))
    assert old.fixed_changes(dataclasses.replace(live, bulkhead=old.bulkhead)) == []
    assert (BreakerOptions.RELOADABLE, RetryOptions.RELOADABLE, HedgeOptions.RELOADABLE) == (
        True,
        True,
        True,
    )
    assert (BulkheadOptions.RELOADABLE, BudgetOptions.RELOADABLE) == (False, False)


async def test_reconfigure_applies_the_live_options_only() -> None:
    registry = ToolRegistry()
    options = DispatcherOptions(telemetry=False, limits=Limits(max_argument_bytes=10))
    dispatcher = Dispatcher(registry, options)
    dispatcher.breakers.get("k")
    changed = dispatcher.reconfigure(
        DispatcherOptions(
            keys={"k": KeyPolicy(breaker=BreakerOptions(fail_max=9))},
            limits=Limits(max_argument_bytes=99),
        )
    )
    assert changed == ["k"] and dispatcher.breakers.get("k").options.fail_max == 9
    assert dispatcher.policy("k").breaker.fail_max == 9
    assert dispatcher.options.limits.max_argument_bytes == 10  # built once: not live
    assert dispatcher.options.telemetry is False
