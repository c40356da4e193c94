"""Promises the docs make that no other test asserted, through the public API.

One section per document (README.md, docs/pipeline.md, docs/deadlines.md, docs/chaos.md,
docs/architecture.md); each test's docstring names the document and the promise. Tests of
tables parse the document itself, so a table and the code cannot drift apart unnoticed.
"""

from __future__ import annotations

import ast
import dataclasses
import inspect
import io
import json
import re
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import anyio
import pytest
from prometheus_client import CollectorRegistry

from helpers import OBJ, wait_until
from toolrelay import (
    AuthContext,
    BreakerOptions,
    BudgetOptions,
    BulkheadOptions,
    Dispatcher,
    DispatcherOptions,
    ErrorType,
    Fault,
    HedgeOptions,
    KeyPolicy,
    Limits,
    ModelSlot,
    Profile,
    RegistrationError,
    RetryOptions,
    StorageOptions,
    ToolDeclaration,
    ToolError,
    ToolRegistry,
    ToolResult,
)
from toolrelay.config import CONFIG_SCHEMA, parse_config
from toolrelay.events import Event, RetryScheduled
from toolrelay.pipeline import Invocation

pytestmark = pytest.mark.anyio

ROOT = Path(__file__).resolve().parent.parent
README = (ROOT / "README.md").read_text(encoding="utf-8")
ANY = {"type": "object"}


def toolrelay(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "toolrelay", *args],
        capture_output=True,
        text=True,
        cwd=cwd,
        timeout=120,
    )


def readme_row(first_cell: str) -> str:
    """The cells after ``first_cell`` of the README table row starting with it."""
    for line in README.splitlines():
        if line.startswith(f"| {first_cell} |"):
            return line[len(first_cell) + 4 :]
    raise AssertionError(f"README has no table row for {first_cell}")


def quoted_names(text: str) -> set[str]:
    """Lower-case names in backticks; one backtick span may list several, comma-separated."""
    found: set[str] = set()
    for span in re.findall(r"`([^`]*)`", text):
        if re.fullmatch(r"[a-z_]+(, *[a-z_]+)*", span):
            found.update(re.split(r", *", span))
    return found


class Recorder:
    def __init__(self) -> None:
        self.events: list[Event] = []

    def __call__(self, inv: Invocation, event: Event) -> None:
        self.events.append(event)

    def delays(self) -> list[float]:
        return [e.delay_s for e in self.events if isinstance(e, RetryScheduled)]


class Flaky:
    """Fails with a retryable ToolError ``failures`` times, then answers."""

    def __init__(self, failures: int = 0) -> None:
        self.failures = failures
        self.calls = 0

    async def __call__(self, args: dict[str, Any], ctx: AuthContext) -> Any:
        self.calls += 1
        if self.calls <= self.failures:
            raise ToolError("upstream 503", retryable=True)
        return {"n": self.calls}


class Gate:
    """An async handler that holds its bulkhead place until ``release`` is set."""

    def __init__(self) -> None:
        self.inside = 0
        self.release = anyio.Event()

    async def __call__(self, args: dict[str, Any], ctx: AuthContext) -> Any:
        self.inside += 1
        try:
            await self.release.wait()
        finally:
            self.inside -= 1
        return "done"


async def while_busy(dispatcher: Dispatcher, gate: Gate, busy: str, then: str) -> ToolResult:
    """Call ``then`` while one call to ``busy`` holds its key's only place."""
    async with anyio.create_task_group() as tg:
        tg.start_soon(dispatcher.dispatch, busy, "{}")
        await wait_until(lambda: gate.inside == 1)
        with anyio.fail_after(10):  # a safety net, not a speed check
            result = await dispatcher.dispatch(then, "{}")
        gate.release.set()
    return result


# == README.md ================================================================================
def test_readme_embedding_example_prints_what_its_comment_says(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """README, Embedding: the example runs as printed and prints the answer its comment shows."""
    block = re.findall(r"```python\n(.*?)```", README, re.S)[0]
    exec(compile(block, "README.md", "exec"), {"__name__": "readme_example"})
    (comment,) = re.findall(r"print\(result\.to_model\(\)\)\s+# (.*)", block)
    assert capsys.readouterr().out.strip() == repr(ast.literal_eval(comment))


def test_readme_snippets_compile_and_name_real_things() -> None:
    """README: every other Python snippet is valid Python, and every name it imports from
    toolrelay exists (the snippets are fragments of a host, so they are not run)."""
    import importlib

    blocks = re.findall(r"```python\n(.*?)```", README, re.S)[1:]
    assert len(blocks) >= 5  # typed tools, sync hosts and the three framework adapters
    for block in blocks:
        compile(block, "README.md", "exec", flags=ast.PyCF_ALLOW_TOP_LEVEL_AWAIT)
        for module, names in re.findall(r"^from (toolrelay[\w.]*) import (.+)$", block, re.M):
            imported = importlib.import_module(module)
            for name in names.split(","):
                assert hasattr(imported, name.strip()), f"{module}.{name.strip()}"


def test_readme_quickstart_is_the_session_it_describes() -> None:
    """README, Embedding: examples/quickstart.py shows a hanging search service, its breaker
    opening and closing, validation, approval and unknown tools."""
    result = subprocess.run(
        [sys.executable, str(ROOT / "examples" / "quickstart.py")],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    out = result.stdout
    assert '"error_type": "timeout"' in out and '"error_type": "circuit_open"' in out
    assert "breaker searxng: open" in out and out.rstrip().splitlines()[-2].endswith("closed")
    for error_type in ("validation_error", "needs_approval", "unknown_tool"):
        assert f'"error_type": "{error_type}"' in out


def test_readme_call_and_specs_read_toolrelay_toml_in_the_working_directory(
    tmp_path: Path,
) -> None:
    """README, The command line: `call` and `specs` read --config, else ./toolrelay.toml."""
    (tmp_path / "toolrelay.toml").write_text(
        '[plugins.weather]\n[profiles.p]\nallow = ["weather_forecast"]\n'
    )
    result = toolrelay("specs", "--profile", "p", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert [t["function"]["name"] for t in json.loads(result.stdout)] == ["weather_forecast"]
    # without the file, profile p is unknown: the embedded defaults offer it nothing
    (tmp_path / "toolrelay.toml").unlink()
    assert json.loads(toolrelay("specs", "--profile", "p", cwd=tmp_path).stdout) == []


def test_readme_demo_exits_1_when_an_invariant_fails(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """README, The demo: the exit status is 1 if an invariant fails. The command refuses a
    run shorter than the scenario needs; with that floor lowered, in 1 s the search breaker
    cannot close after its outage (its break alone is 1.5 s)."""
    from toolrelay import demo
    from toolrelay.cli import main

    monkeypatch.setattr(demo, "MIN_DURATION_S", 1.0)
    assert main(["demo", "--duration", "1", "--metrics-port", "0", "--plain"]) == 1
    out = capsys.readouterr().out
    assert "FAIL  the search breaker opened" in out
    assert out.rstrip().endswith("an invariant failed")


def test_readme_demo_prints_plain_lines_when_stdout_is_not_a_terminal() -> None:
    """README, The demo: a live view (rich) on a terminal, plain lines when stdout is not one."""
    from toolrelay.demo_view import PlainView, pick_view

    assert isinstance(pick_view(None, 30, out=io.StringIO()), PlainView)


def answers_registry() -> ToolRegistry:
    registry = ToolRegistry()

    @registry.tool(name="ok", parameters={"type": "object", "required": ["n"]})
    async def ok(args: dict[str, Any], ctx: AuthContext) -> Any:
        return "fine"

    @registry.tool(name="edit", parameters=ANY, risk="write")
    async def edit(args: dict[str, Any], ctx: AuthContext) -> Any:
        return "edited"

    @registry.tool(name="hang", parameters=ANY, timeout_s=0.05)
    async def hang(args: dict[str, Any], ctx: AuthContext) -> Any:
        await anyio.sleep_forever()

    @registry.tool(name="crash", parameters=ANY)
    async def crash(args: dict[str, Any], ctx: AuthContext) -> Any:
        raise KeyError("bug")

    @registry.tool(name="busy", parameters=ANY)
    async def busy(args: dict[str, Any], ctx: AuthContext) -> Any:
        raise ToolError("try later", retryable=True)

    @registry.tool(name="nan", parameters=ANY)
    async def nan(args: dict[str, Any], ctx: AuthContext) -> Any:
        return float("nan")

    @registry.tool(name="paused", parameters=ANY)
    async def paused(args: dict[str, Any], ctx: AuthContext) -> Any:
        return "never"

    return registry


RETRYABLE = [  # README, The answer envelope: the table's "retryable" column
    ("[]", "ok", "invalid_arguments", False),
    ("{}", "nope", "unknown_tool", False),
    ("{}", "edit@readonly", "tool_policy", False),
    ("{}", "ok", "validation_error", False),
    ("{}", "edit", "needs_approval", False),
    ("{}", "edit@denied", "denied", False),
    ("{}", "paused", "circuit_open", True),
    ("{}", "hang", "timeout", True),
    ("{}", "crash", "tool_error", False),
    ("{}", "busy", "tool_error", True),
    ("{}", "nan", "invalid_output", False),
]


@pytest.mark.parametrize(("raw", "target", "error_type", "retryable"), RETRYABLE)
async def test_readme_every_error_type_is_as_retryable_as_the_table_says(
    raw: str, target: str, error_type: str, retryable: bool
) -> None:
    """README, The answer envelope: each error_type's `retryable` is the table's (tool_error
    "as raised"; `overloaded` and `internal_error` have tests of their own below)."""
    name, _, how = target.partition("@")
    dispatcher = Dispatcher(
        answers_registry(),
        DispatcherOptions(
            profiles={"readonly": Profile(max_risk="read")},
            default_key=KeyPolicy(retry=RetryOptions(max_attempts=1)),
        ),
        approver=(lambda *a: False) if how == "denied" else None,
    )
    dispatcher.breakers.force_open("paused")
    result = await dispatcher.dispatch(name, raw, profile=how if how == "readonly" else None)
    assert (str(result.error_type), result.retryable) == (error_type, retryable)
    assert (result.retry_after_s is not None) is (error_type == "circuit_open")


async def test_readme_internal_error_is_logged_and_not_retryable(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """README, The answer envelope: `internal_error` — a plugin's declaration gone bad —
    is logged, is not retryable and carries no traceback."""
    registry = ToolRegistry()

    class Plugin:
        decl = ToolDeclaration("t", "", OBJ)

        def describe(self) -> list[ToolDeclaration]:
            return [self.decl]

        async def execute(self, name: str, args: dict[str, Any], ctx: AuthContext) -> Any:
            return None

    plugin = Plugin()
    registry.register(plugin)
    plugin.decl = ToolDeclaration("t", "", {"type": "object", "properties": 1})
    result = await Dispatcher(registry).dispatch("t", "{}")
    assert (result.error_type, result.retryable) == (ErrorType.INTERNAL_ERROR, False)
    assert "Traceback" not in result.message
    assert any("not a valid JSON Schema" in r.getMessage() for r in caplog.records)


async def test_readme_circuit_open_message_reads_like_the_example() -> None:
    """README, The answer envelope: "web_search is paused because searxng is failing; try
    again in 28 s" with `retry_after_s`."""
    registry = ToolRegistry()
    registry.tool(name="web_search", parameters=ANY, breaker_key="searxng")(Flaky(5))
    config = KeyPolicy(
        breaker=BreakerOptions(fail_max=1, reset_timeout_s=30), retry=RetryOptions(max_attempts=1)
    )
    dispatcher = Dispatcher(registry, DispatcherOptions(keys={"searxng": config}))
    await dispatcher.dispatch("web_search", "{}")
    answer = (await dispatcher.dispatch("web_search", "{}")).to_model()
    assert re.fullmatch(
        r"web_search is paused because searxng is failing; try again in \d+ s", answer["message"]
    )
    assert answer["retryable"] is True and 25 < answer["retry_after_s"] <= 30


def _fields(cls: Any) -> set[str]:
    return {f.name for f in dataclasses.fields(cls)}


def _parameters(fn: Any) -> set[str]:
    return {
        name
        for name, p in inspect.signature(fn).parameters.items()
        if p.kind is not p.VAR_KEYWORD and name not in ("self", "message", "registry")
    }


@pytest.mark.parametrize(
    ("row", "expected"),
    [
        ("`ToolDeclaration`", lambda: _fields(ToolDeclaration)),
        ("`ToolError`", lambda: _parameters(ToolError.__init__)),
        ("`AuthContext`", lambda: _fields(AuthContext)),
        ("`Profile`", lambda: _parameters(Profile.__init__)),
        ("`BreakerOptions`", lambda: _fields(BreakerOptions)),
        ("`RetryOptions`", lambda: _fields(RetryOptions)),
        ("`HedgeOptions`", lambda: _fields(HedgeOptions)),
        ("`BulkheadOptions`", lambda: _fields(BulkheadOptions)),
        ("`BudgetOptions`", lambda: _fields(BudgetOptions)),
        ("`KeyPolicy`", lambda: _fields(KeyPolicy)),
        ("`DispatcherOptions`", lambda: set(DispatcherOptions.model_fields)),
        ("`StorageOptions`", lambda: _fields(StorageOptions)),
        ("`Limits`", lambda: _fields(Limits)),
    ],
)
def test_readme_public_api_rows_name_every_field(row: str, expected: Any) -> None:
    """README, Public API: the fields each row lists are the class's, all of them."""
    listed = quoted_names(readme_row(row))
    if row == "`ToolError`":  # written as a call: ToolError(message, error_type=, ...)
        listed = set(re.findall(r"(\w+)=", readme_row(row)))
    assert listed == expected()


def test_readme_dispatcher_keyword_arguments_are_the_signature() -> None:
    """README, Public API: "`Dispatcher` keyword arguments: ..." lists every one of them."""
    (text,) = re.findall(r"`Dispatcher` keyword arguments:(.*?); also", README, re.S)
    assert quoted_names(text) == _parameters(Dispatcher.__init__)


def test_readme_other_public_names_exist() -> None:
    """README, Public API: the other public names can be imported where it says."""
    import toolrelay
    from toolrelay import events
    from toolrelay.config import load_config
    from toolrelay.loading import load_entry_points, load_plugins
    from toolrelay.sources.mcp import McpSource
    from toolrelay.telemetry import serve_metrics

    assert all(map(inspect.isclass, (toolrelay.Fault, toolrelay.FaultInjector, McpSource)))
    assert all(map(callable, (load_config, load_entry_points, load_plugins, serve_metrics)))
    assert "Event" in dir(events)


def _table_sections() -> dict[str, str]:
    """The README's configuration table: section name → its "keys" cell."""
    start = README.index("| table | keys |")
    rows = README[start:].split("\n\n")[0].splitlines()[2:]
    sections = {}
    for row in rows:
        first, keys = row.split(" | ", 1)
        sections[re.findall(r"`\[\[?([a-z_]+)", first)[0]] = keys
    return sections


def _schema_keys(section: str) -> set[str]:
    def follow(schema: dict[str, Any]) -> dict[str, Any]:  # the schema is generated: $refs
        ref = schema.get("$ref")
        return schema if ref is None else CONFIG_SCHEMA["$defs"][ref.rsplit("/", 1)[1]]

    schema = follow(CONFIG_SCHEMA["properties"][section])
    inner = schema.get("additionalProperties")
    schema = follow(inner if isinstance(inner, dict) else schema.get("items", schema))
    return set(schema["properties"])


def test_readme_configuration_table_has_every_section() -> None:
    """README, Configuration: one row per table of the config schema."""
    assert set(_table_sections()) == set(CONFIG_SCHEMA["properties"])


@pytest.mark.parametrize(
    "section",
    ["plugins", "tools", "storage", "profiles", "faults", "dispatcher", "telemetry"],
)
def test_readme_configuration_table_lists_the_schema_keys(section: str) -> None:
    """README, Configuration: each row's keys are exactly the schema's (unknown keys are
    errors, so a key missing here is one an operator cannot find)."""
    assert quoted_names(_table_sections()[section]) == _schema_keys(section)


def test_readme_keys_table_takes_one_table_per_strategy() -> None:
    """README, Configuration: `[keys.KEY]` takes one table per strategy, each with the
    fields of its options class."""
    listed = _table_sections()["keys"]
    assert quoted_names(listed.split(":")[0]) == _fields(KeyPolicy)
    policy = _schema_keys("keys")
    assert policy == _fields(KeyPolicy)
    for part, cls in (("breaker", BreakerOptions), ("retry", RetryOptions)):
        ref = CONFIG_SCHEMA["$defs"]["KeyPolicy"]["properties"][part]["$ref"]
        assert set(CONFIG_SCHEMA["$defs"][ref.rsplit("/", 1)[1]]["properties"]) == _fields(cls)


async def test_readme_telemetry_section_is_read_by_from_config() -> None:
    """README, Configuration: `[telemetry]` `enabled` and `capture_content` reach
    `Dispatcher.from_config`."""
    on = parse_config({"telemetry": {"capture_content": True}})
    dispatcher = Dispatcher.from_config(on, registry=ToolRegistry())
    assert dispatcher.telemetry is not None and dispatcher.telemetry.capture_content is True
    off = parse_config({"telemetry": {"enabled": False}})
    assert Dispatcher.from_config(off, registry=ToolRegistry()).telemetry is None


async def test_readme_tools_on_one_breaker_key_share_one_concurrency_limit() -> None:
    """README, Breakers: every tool naming the same breaker_key shares one concurrency
    limit, and nothing else is touched."""
    registry = ToolRegistry()
    gate = Gate()
    registry.tool(name="first", parameters=ANY, breaker_key="crm")(gate)
    registry.tool(name="second", parameters=ANY, breaker_key="crm")(Flaky())
    registry.tool(name="elsewhere", parameters=ANY, breaker_key="other")(Flaky())
    dispatcher = Dispatcher(
        registry,
        DispatcherOptions(default_key=KeyPolicy(bulkhead=BulkheadOptions(max_concurrent=1))),
    )
    shed = await while_busy(dispatcher, gate, "first", "second")
    assert shed.error_type is ErrorType.OVERLOADED
    gate.release = anyio.Event()
    assert (await while_busy(dispatcher, gate, "first", "elsewhere")).ok


def retry_dispatcher(
    flaky: Flaky, config: KeyPolicy, *, risk: str = "read", **tool: Any
) -> tuple[Dispatcher, Recorder]:
    registry = ToolRegistry()
    registry.tool(name="t", parameters=ANY, breaker_key="k", risk=risk, **tool)(flaky)  # type: ignore[arg-type]
    recorder = Recorder()
    dispatcher = Dispatcher(
        registry,
        DispatcherOptions(keys={"k": config}),
        observers=[recorder],
        approver=lambda *a: True,
    )
    return dispatcher, recorder


async def test_readme_default_backoff_starts_near_50_ms_and_doubles() -> None:
    """README, Breakers: retries wait with exponential backoff and jitter, ≈50 ms, doubling
    (the planned waits, not measured time)."""
    dispatcher, recorder = retry_dispatcher(Flaky(2), KeyPolicy())
    result = await dispatcher.dispatch("t", "{}")
    assert result.ok and result.attempts == 3
    first, second = recorder.delays()
    assert 0.05 <= first <= 0.075 and 0.1 <= second <= 0.125


async def test_readme_backoff_is_capped() -> None:
    """README, Breakers: backoff capped at 2 s by default (`backoff_max_s`)."""
    assert (RetryOptions().backoff_initial_s, RetryOptions().backoff_max_s) == (0.05, 2.0)
    config = KeyPolicy(
        retry=RetryOptions(max_attempts=5, backoff_initial_s=0.004, backoff_max_s=0.008)
    )
    dispatcher, recorder = retry_dispatcher(Flaky(4), config)
    assert (await dispatcher.dispatch("t", "{}")).attempts == 5
    assert max(recorder.delays()) <= 0.008 + 0.002  # the cap, plus at most half a base of jitter


@pytest.mark.parametrize(
    ("risk", "idempotent", "attempts"), [("write", True, 3), ("read", False, 1)]
)
async def test_readme_idempotent_overrides_the_risk_default(
    risk: str, idempotent: bool, attempts: int
) -> None:
    """README, Breakers: retries for idempotent tools only (default: risk="read");
    `idempotent=` decides when given."""
    config = KeyPolicy(retry=RetryOptions(backoff_initial_s=0.001))
    dispatcher, _ = retry_dispatcher(Flaky(5), config, risk=risk, idempotent=idempotent)
    assert (await dispatcher.dispatch("t", "{}")).attempts == attempts


async def test_readme_a_timeout_is_never_retried() -> None:
    """README, Breakers (retries: not a `timeout`) and architecture.md (a timeout is
    retryable for the model but never retried inside the call)."""
    registry = ToolRegistry()
    calls: list[int] = []

    @registry.tool(name="hang", parameters=ANY, timeout_s=0.05)
    async def hang(args: dict[str, Any], ctx: AuthContext) -> Any:
        calls.append(1)
        await anyio.sleep_forever()

    dispatcher = Dispatcher(
        registry,
        DispatcherOptions(default_key=KeyPolicy(retry=RetryOptions(backoff_initial_s=0.001))),
    )
    result = await dispatcher.dispatch("hang", "{}")
    assert (result.error_type, result.retryable, result.attempts) == (ErrorType.TIMEOUT, True, 1)
    assert calls == [1]


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


async def test_readme_unreachable_redis_shows_as_storage_up_0() -> None:
    """README, Breakers (shared state): if Redis is unreachable the breakers keep working on
    local counts and `toolrelay_breaker_storage_up` says 0."""
    registry = ToolRegistry()
    registry.tool(name="t", parameters=ANY, breaker_key="k")(Flaky(10))
    metrics = CollectorRegistry()
    dispatcher = Dispatcher(
        registry,
        DispatcherOptions(
            keys={
                "k": KeyPolicy(
                    breaker=BreakerOptions(fail_max=2), retry=RetryOptions(max_attempts=1)
                )
            },
            storage=StorageOptions(url=f"redis://127.0.0.1:{_free_port()}/0"),
        ),
        metrics_registry=metrics,
    )
    try:
        kinds = [(await dispatcher.dispatch("t", "{}")).error_type for _ in range(3)]
        assert kinds == [ErrorType.TOOL_ERROR] * 2 + [ErrorType.CIRCUIT_OPEN]
        await wait_until(lambda: not dispatcher.storage_up)
        assert metrics.get_sample_value("toolrelay_breaker_storage_up") == 0
    finally:
        await dispatcher.aclose()


async def test_readme_async_with_dispatcher_closes_what_it_holds() -> None:
    """README, Embedding and Public API: `await dispatcher.aclose()` (or `async with
    dispatcher:`) closes what the dispatcher holds, the plugins' `aclose()` included."""
    closed: list[str] = []

    class Plugin:
        def describe(self) -> list[ToolDeclaration]:
            return [ToolDeclaration("t", "", OBJ)]

        async def execute(self, name: str, args: dict[str, Any], ctx: AuthContext) -> Any:
            return None

        async def aclose(self) -> None:
            closed.append("closed")

    registry = ToolRegistry()
    registry.register(Plugin())
    async with Dispatcher(registry) as dispatcher:
        assert (await dispatcher.dispatch("t", "{}")).ok
        assert closed == []
    assert closed == ["closed"]


async def test_readme_audit_none_writes_no_audit_line(caplog: pytest.LogCaptureFixture) -> None:
    """README, Embedding: `audit=` is a sink (default: the `toolrelay.audit` logger), or
    `None` for no audit line at all."""
    caplog.set_level("INFO", logger="toolrelay.audit")
    registry = answers_registry()
    await Dispatcher(registry, approver=lambda *a: True).dispatch("edit", "{}")
    assert [r.name for r in caplog.records] == ["toolrelay.audit"]
    caplog.clear()
    await Dispatcher(registry, approver=lambda *a: True, audit=None).dispatch("edit", "{}")
    assert caplog.records == []


def _imports(path: Path) -> set[str]:
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.add(node.module)
    return found


def test_readme_bundled_plugins_import_only_the_contract_of_toolrelay() -> None:
    """README, Plugins: "of toolrelay they import only `toolrelay.contract` and
    `toolrelay.jsonlimits`, and `toolrelay._compat.httpcore` to pin DNS"; HTTP through httpx."""
    plugins = sorted((ROOT / "plugins" / "toolrelay_plugins").glob("*.py"))
    used = set().union(*map(_imports, plugins))
    assert {m for m in used if m.split(".")[0] == "toolrelay"} == {
        "toolrelay.contract",
        "toolrelay.jsonlimits",
        "toolrelay._compat.httpcore",
    }
    assert "httpx" in used and not {"requests", "urllib3", "aiohttp"} & used


# == docs/pipeline.md =========================================================================
async def test_pipeline_default_output_cap_is_256_kib() -> None:
    """pipeline.md, Defaults: "Output: JSON-safe, 256 KiB" — refused beyond by default."""
    registry = ToolRegistry()

    @registry.tool(name="big", parameters=ANY)
    async def big(args: dict[str, Any], ctx: AuthContext) -> Any:
        return "x" * (args["n"] - 2)  # a JSON string of exactly n bytes

    dispatcher = Dispatcher(registry)
    assert (await dispatcher.dispatch("big", {"n": 256 * 1024})).ok
    over = await dispatcher.dispatch("big", {"n": 256 * 1024 + 1})
    assert over.error_type is ErrorType.INVALID_OUTPUT and "262144-byte cap" in over.message


async def test_pipeline_default_tool_timeout_is_10_s() -> None:
    """pipeline.md and deadlines.md, Defaults: "Tool timeout: 10 s" (the deadline a handler
    sees without a slot)."""
    registry = ToolRegistry()
    seen: list[float] = []

    @registry.tool(name="look", parameters=OBJ)
    async def look(args: dict[str, Any], ctx: AuthContext) -> Any:
        seen.append(anyio.current_effective_deadline())

    before = anyio.current_time()
    assert (await Dispatcher(registry).dispatch("look", "{}")).ok
    assert before + 10 <= seen[0] <= anyio.current_time() + 10
    assert ToolDeclaration("d", "").timeout_s == 10


async def test_pipeline_stage_order_is_visible_in_the_answers() -> None:
    """pipeline.md, About: resolve + policy before decode, decode before validate, validate
    before approve (the first failing stage answers)."""
    dispatcher = Dispatcher(
        answers_registry(), DispatcherOptions(profiles={"readonly": Profile(max_risk="read")})
    )
    forbidden = await dispatcher.dispatch("edit", "{not json", profile="readonly")
    assert forbidden.error_type is ErrorType.TOOL_POLICY
    assert (await dispatcher.dispatch("edit", "{not json")).error_type is (
        ErrorType.INVALID_ARGUMENTS
    )
    write = ToolRegistry()
    write.tool(name="edit", parameters={"type": "object", "required": ["id"]}, risk="write")(
        Flaky()
    )
    no_approver = Dispatcher(write)
    assert (await no_approver.dispatch("edit", "{}")).error_type is ErrorType.VALIDATION_ERROR
    assert (await no_approver.dispatch("edit", {"id": 1})).error_type is ErrorType.NEEDS_APPROVAL


# == docs/deadlines.md ========================================================================
async def test_deadlines_a_spent_slot_answers_timeout_without_running() -> None:
    """deadlines.md, Defaults: a call made with a spent slot answers `timeout` ("not started:
    the model's time budget is spent") without running; retryable, not counted."""
    registry = ToolRegistry()
    flaky = Flaky()
    registry.tool(name="t", parameters=ANY, breaker_key="k")(flaky)
    dispatcher = Dispatcher(
        registry, DispatcherOptions(keys={"k": KeyPolicy(breaker=BreakerOptions(fail_max=1))})
    )
    async with ModelSlot(budget_s=0.01).hold() as lease:
        await anyio.sleep(0.05)
        result = await dispatcher.dispatch("t", "{}", slot=lease)
    assert (result.error_type, result.retryable) == (ErrorType.TIMEOUT, True)
    assert "not started: the model's time budget is spent" in result.message
    assert flaky.calls == 0 and dispatcher.breakers.state("k") == "closed"


async def test_deadlines_a_slot_bound_timeout_is_retryable_and_not_counted() -> None:
    """deadlines.md, Defaults: a timeout caused by the slot's budget is `retryable` for the
    model but not counted by the breaker."""
    registry = ToolRegistry()

    @registry.tool(name="hang", parameters=ANY, breaker_key="k", timeout_s=30)
    async def hang(args: dict[str, Any], ctx: AuthContext) -> Any:
        await anyio.sleep_forever()

    dispatcher = Dispatcher(
        registry, DispatcherOptions(keys={"k": KeyPolicy(breaker=BreakerOptions(fail_max=1))})
    )
    async with ModelSlot(budget_s=0.05).hold() as lease:
        result = await dispatcher.dispatch("hang", "{}", slot=lease)
    assert (result.error_type, result.retryable) == (ErrorType.TIMEOUT, True)
    assert "time budget" in result.message and dispatcher.breakers.state("k") == "closed"


@pytest.mark.parametrize(
    ("wait_s", "timeout_s"), [(0.05, 30.0), (30.0, 0.2)], ids=["bulkhead_wait_s", "deadline"]
)
async def test_deadlines_the_bulkhead_waits_at_most_bulkhead_wait_s_and_never_past_the_deadline(
    wait_s: float, timeout_s: float
) -> None:
    """README, Breakers (`overloaded` after `bulkhead_wait_s`) and deadlines.md (the bulkhead
    never waits past the deadline): a call waiting for a place is answered `overloaded`."""
    registry = ToolRegistry()
    gate = Gate()
    registry.tool(name="holder", parameters=ANY, breaker_key="k", timeout_s=30)(gate)
    registry.tool(name="waiter", parameters=ANY, breaker_key="k", timeout_s=timeout_s)(Flaky())
    config = KeyPolicy(bulkhead=BulkheadOptions(max_concurrent=1, wait_s=wait_s))
    dispatcher = Dispatcher(registry, DispatcherOptions(keys={"k": config}))
    result = await while_busy(dispatcher, gate, "holder", "waiter")
    assert (result.error_type, result.retryable) == (ErrorType.OVERLOADED, True)


async def test_deadlines_model_slot_listeners_see_every_hold() -> None:
    """deadlines.md, Usage: a plain `ModelSlot(listeners=[...])` lets you observe holds;
    `lease.remaining()` and `lease.elapsed()`."""
    held: list[Any] = []
    slot = ModelSlot(5, listeners=[held.append])
    async with slot.hold() as lease:
        assert 0 < lease.remaining() <= 5 and lease.elapsed() >= 0
        assert held == []
    assert held == [lease]
    assert lease.elapsed() == lease.elapsed()  # frozen once released


# == docs/chaos.md ============================================================================
def chaos_dispatcher(*faults: Fault, **options: Any) -> tuple[Dispatcher, Flaky]:
    registry = ToolRegistry()
    flaky = Flaky()
    registry.tool(name="search", parameters=ANY, breaker_key="searxng")(flaky)
    config = KeyPolicy(
        breaker=BreakerOptions(fail_max=100), retry=RetryOptions(backoff_initial_s=0.001)
    )
    options = DispatcherOptions(keys={"searxng": config}, faults=faults, **options)
    return Dispatcher(registry, options), flaky


async def test_chaos_faults_seed_restarts_the_dice() -> None:
    """chaos.md, Usage: `dispatcher.faults.seed(7)`: the same seed and calls give the same
    injections."""
    fault = Fault(kind="error", tool="search", rate=0.5, retryable=False)
    dispatcher, _ = chaos_dispatcher(fault)

    async def pattern() -> list[bool]:
        dispatcher.faults.seed(7)
        return [(await dispatcher.dispatch("search", "{}")).ok for _ in range(30)]

    first = await pattern()
    assert await pattern() == first and 0 < sum(first) < 30


async def test_chaos_bad_output_returns_the_given_output() -> None:
    """chaos.md, Usage: `bad_output` returns `output` instead of calling the handler."""
    fault = Fault(kind="bad_output", tool="search", output={"hits": "not a list"})
    dispatcher, flaky = chaos_dispatcher(fault)
    result = await dispatcher.dispatch("search", "{}")
    assert result.data == {"hits": "not a list"} and flaky.calls == 0


async def test_chaos_a_retryable_error_fault_is_retried_as_a_plugin_error_would_be() -> None:
    """chaos.md, About: faults are injected inside the breaker, so retries and breakers react
    as in production (here: a retryable `error` on a read tool is retried)."""
    fault = Fault(kind="error", breaker_key="searxng", message="503 (injected)")
    dispatcher, flaky = chaos_dispatcher(fault)
    result = await dispatcher.dispatch("search", "{}")
    assert (result.error_type, result.message, result.attempts) == (
        ErrorType.TOOL_ERROR,
        "503 (injected)",
        3,
    )
    assert flaky.calls == 0


async def test_chaos_faults_can_be_listed_in_toolrelay_toml() -> None:
    """chaos.md, Usage: the same faults can be listed as `[[faults]]` in toolrelay.toml."""
    config = parse_config({"faults": [{"kind": "error", "tool": "search", "retryable": False}]})
    registry = ToolRegistry()
    registry.tool(name="search", parameters=ANY)(Flaky())
    dispatcher = Dispatcher.from_config(config, registry=registry)
    result = await dispatcher.dispatch("search", "{}")
    assert (result.error_type, result.message) == (ErrorType.TOOL_ERROR, "injected fault")


EXPERIMENT = """
name = "nothing opens"
description = "a breaker named in the invariants that cannot open"
seed = 3
duration_s = 0.3
settle_s = 0
upstream = false
config = {}

[workload]
agents = 1
slot_budget_s = 1
calls = [{ tool = "nope", weight = 1 }]
calls_per_turn = [1, 1]
think_s = [0.01, 0.02]

[steady_state]
max_error_ratio = 0.0
min_calls = 1

[invariants]
breakers = ["nope"]
no_leaks = true
"""


def test_chaos_run_exits_1_when_an_invariant_is_violated(tmp_path: Path) -> None:
    """chaos.md, Defaults: exit status 1 when an invariant is violated; every documented
    experiment key is accepted; the deadline slack defaults to 50 ms."""
    from toolrelay.cli import main

    experiment = tmp_path / "experiment.toml"
    experiment.write_text(EXPERIMENT)
    report = tmp_path / "report.json"
    assert main(["chaos", "run", str(experiment), "--json", str(report)]) == 1
    verdicts = {v["name"]: v["ok"] for v in json.loads(report.read_text())["invariants"]}
    assert verdicts["nope: breaker opened within fail_max failures of the outage"] is False
    assert verdicts["every call answered"] and verdicts["every answer within its deadline + 50 ms"]


def test_chaos_run_prints_to_stdout_as_it_is_when_called(tmp_path: Path) -> None:
    """The report goes to ``sys.stdout`` as it is at the call, not as it was when the module
    was first imported (a host, or a test, that redirects stdout later still gets it; a stream
    closed since must not be written to)."""
    import contextlib
    import io

    from toolrelay.cli import main

    experiment = tmp_path / "experiment.toml"
    experiment.write_text(EXPERIMENT)
    for _ in range(2):  # two different streams, one after the other
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            assert main(["chaos", "run", str(experiment)]) == 1
        assert "nothing opens" in out.getvalue()


# == docs/architecture.md =====================================================================
async def test_architecture_invalid_output_is_never_counted_by_the_breaker() -> None:
    """architecture.md, Departures: `invalid_output` is a contract failure of the plugin, not
    a service failure: the breaker never counts it."""
    dispatcher = Dispatcher(
        answers_registry(),
        DispatcherOptions(keys={"nan": KeyPolicy(breaker=BreakerOptions(fail_max=1))}),
    )
    for _ in range(3):
        assert (await dispatcher.dispatch("nan", "{}")).error_type is ErrorType.INVALID_OUTPUT
    assert dispatcher.breakers.state("nan") == "closed"


async def test_architecture_overloaded_is_never_retried_and_has_no_retry_after() -> None:
    """architecture.md, Decisions: `overloaded` is never retried inside one call; the model
    is told `retryable: true` (only `circuit_open` comes with `retry_after_s`)."""
    registry = ToolRegistry()
    gate, flaky = Gate(), Flaky()
    registry.tool(name="holder", parameters=ANY, breaker_key="k")(gate)
    registry.tool(name="read", parameters=ANY, breaker_key="k")(flaky)
    config = KeyPolicy(
        retry=RetryOptions(max_attempts=3, backoff_initial_s=0.001),
        bulkhead=BulkheadOptions(max_concurrent=1),
    )
    dispatcher = Dispatcher(registry, DispatcherOptions(keys={"k": config}))
    shed = await while_busy(dispatcher, gate, "holder", "read")
    assert (shed.error_type, shed.retryable, shed.attempts) == (ErrorType.OVERLOADED, True, 1)
    assert shed.retry_after_s is None and "retry_after_s" not in shed.to_model()
    assert flaky.calls == 0


def test_architecture_layer_table_is_the_import_linter_layers() -> None:
    """architecture.md, Layers: the table's rows are pyproject's `layers` contract, in order,
    and the page explains each of its contracts."""
    import tomllib

    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    contracts = pyproject["tool"]["importlinter"]["contracts"]
    (layers,) = [c["layers"] for c in contracts if c["id"] == "layers"]
    page = (ROOT / "docs" / "architecture.md").read_text(encoding="utf-8")
    section = page.split("## Layers", 1)[1].split("\n## ", 1)[0]
    rows = re.findall(r"^\| \d+ \| (.+?) \|", section, re.M)
    assert [row.replace("`", "").replace("\\|", "|") for row in rows] == layers
    assert {c["id"] for c in contracts} == set(re.findall(r"^- \*\*(\w+)\*\*", section, re.M))


@pytest.mark.parametrize(("name", "ok"), [("a" * 64, True), ("a" * 65, False), ("", False)])
def test_architecture_tool_names_are_1_to_64_safe_characters(name: str, ok: bool) -> None:
    """architecture.md, Decisions: tool names must match ^[A-Za-z0-9_-]{1,64}$."""
    registry = ToolRegistry()
    plugin_decls = [ToolDeclaration(name, "", OBJ)]

    class Plugin:
        def describe(self) -> list[ToolDeclaration]:
            return plugin_decls

        def execute(self, name: str, args: dict[str, Any], ctx: AuthContext) -> Any:
            return None

    if ok:
        registry.register(Plugin())
    else:
        with pytest.raises(RegistrationError, match="must match"):
            registry.register(Plugin())


@pytest.mark.parametrize("offers_lookup", [True, False])
async def test_architecture_declaration_lookup_spares_describe(offers_lookup: bool) -> None:
    """architecture.md, Decisions: plugins may offer `declaration(name)` for O(1) lookups;
    otherwise `describe()` is scanned."""
    described: list[int] = []
    decl = ToolDeclaration("t", "", OBJ)

    class Plugin:
        def describe(self) -> list[ToolDeclaration]:
            described.append(1)
            return [decl]

        async def execute(self, name: str, args: dict[str, Any], ctx: AuthContext) -> Any:
            return "ok"

    class WithLookup(Plugin):
        def declaration(self, name: str) -> ToolDeclaration | None:
            return decl if name == "t" else None

    registry = ToolRegistry()
    registry.register(WithLookup() if offers_lookup else Plugin())
    described.clear()
    assert (await Dispatcher(registry).dispatch("t", "{}")).ok
    assert bool(described) is not offers_lookup


async def test_architecture_validation_is_json_schema_2020_12() -> None:
    """architecture.md, The pipeline: validate uses a JSON Schema 2020-12 validator
    (`prefixItems` is a 2020-12 keyword)."""
    registry = ToolRegistry()
    pair = {"type": "array", "prefixItems": [{"type": "string"}, {"type": "integer"}]}
    registry.tool(name="t", parameters={"type": "object", "properties": {"pair": pair}})(Flaky())
    dispatcher = Dispatcher(registry)
    assert (await dispatcher.dispatch("t", {"pair": ["a", 1]})).ok
    bad = await dispatcher.dispatch("t", {"pair": ["a", "b"]})
    assert bad.error_type is ErrorType.VALIDATION_ERROR and "/pair/1" in bad.message


def test_architecture_only_main_imports_the_cli() -> None:
    """architecture.md, Dependencies: nothing but `__main__` imports the CLI; plugins never
    import the dispatcher."""
    package = ROOT / "src" / "toolrelay"
    importers = {
        str(path.relative_to(package))
        for path in package.rglob("*.py")
        if "toolrelay.cli" in _imports(path)
        or re.search(r"^\s*from \.+ import cli\b|^\s*from \.+cli import", path.read_text(), re.M)
    }
    assert importers == {"__main__.py"}
    for path in (ROOT / "plugins" / "toolrelay_plugins").glob("*.py"):
        assert not any("dispatcher" in m for m in _imports(path)), path


async def test_typed_tools_schema_first_then_lax_conversion() -> None:
    """docs/typed-tools.md, Defaults: the schema refuses "3" for an int before conversion
    could turn it into 3; the 3.0 the schema counts as an integer is converted to 3."""
    registry = ToolRegistry()

    @registry.tool()
    def add(a: int, b: int = 1) -> int:
        """Add two integers."""
        return a + b

    d = Dispatcher(registry, audit=None)
    refused = await d.dispatch("add", '{"a": "3"}')
    assert refused.error_type == "validation_error"
    assert refused.message.endswith('/a: <value> is not of type "integer"')
    converted = await d.dispatch("add", '{"a": 3.0}')
    assert converted.ok and converted.data == 4 and type(converted.data) is int
