"""Every example in README.md and docs/**/*.md runs, as a new user would run it.

The convention, in the Markdown just before a fence (blank lines may sit between):

* nothing: a ```python block is a whole program, run as it stands (top-level ``await`` is
  allowed: the block then runs in an event loop); a ```sh / ```bash block is a script, run
  by bash with ``toolrelay`` on the path, in a scratch directory that sees the repository's
  ``examples/`` and ``dashboards/``;
* ``<!-- run with: NAME -->``: the block is a fragment, run after the prelude ``NAME`` of
  :data:`PRELUDES` (the names it takes for granted: a registry, a dispatcher, a context…);
* ``<!-- norun: why -->``: the block is not run, for the reason given.

Shell blocks that talk to ``localhost:9465`` (the admin API of ``toolrelay serve`` in
docs/serve.md) run against a real ``toolrelay serve`` this module starts on free ports, and
every ``curl`` in them must get a 2xx.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from conftest import need_binary

ROOT = Path(__file__).resolve().parents[1]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
FENCE = re.compile(r"^(?P<indent>[ \t]*)```(?P<lang>[a-z]*)[ \t]*$")
RUNNABLE = {"python": "python", "sh": "sh", "bash": "sh"}
COMMENT = re.compile(r"<!--\s*(?P<kind>norun|run with):\s*(?P<value>.*?)\s*-->\s*$", re.S)
ADMIN = "localhost:9465"
TOKEN = "docs-admin-token-0123456789abcdef"
TIMEOUT_S = 60
MAX_NOT_RUN = 12

# The names fragments take for granted. Each prelude is a small program of its own.
_WEATHER = """
import anyio
from typing import Annotated, Any
from pydantic import BaseModel, Field
from toolrelay import (
    AuthContext, BreakerOptions, BudgetOptions, BulkheadOptions, CallContext, Dispatcher,
    DispatcherOptions, HedgeOptions, KeyPolicy, Profile, RetryOptions, SyncDispatcher,
    ToolCall, ToolError, ToolRegistry,
)

registry = ToolRegistry()

@registry.tool(name="get_weather", description="Current weather for a city.",
               parameters={"type": "object", "properties": {"city": {"type": "string"}},
                           "required": ["city"], "additionalProperties": False},
               breaker_key="open-meteo")
async def get_weather(args: dict, ctx: AuthContext) -> dict:
    return {"city": args["city"], "temperature_c": 4.5}

@registry.tool(name="search", description="Search the web.",
               parameters={"type": "object", "properties": {"q": {"type": "string"}}},
               breaker_key="searxng")
async def search(args: dict, ctx: AuthContext) -> list:
    return ["result"]

keys = {"open-meteo": KeyPolicy(retry=RetryOptions(max_attempts=3))}
dispatcher = Dispatcher(registry, DispatcherOptions(
    profiles={"support": Profile(allow={"get_weather", "search"})}, keys=keys))
ctx = AuthContext(user_id="u1", tenant_id="t1")
args = '{"q": "toolrelay"}'

class Forecast(BaseModel):
    city: str
    highs_c: list[float]

async def fetch(city: str, days: int, *, timeout: float) -> Forecast:
    return Forecast(city=city, highs_c=[4.5] * days)
"""

_SYNC = """
import types
relay = SyncDispatcher(Dispatcher(registry))
call = types.SimpleNamespace(id="call_1")  # the model's tool call
calls = [ToolCall("get_weather", '{"city": "Oslo"}', call_id="call_1"),
         ToolCall("search", '{"q": "toolrelay"}', call_id="call_2")]
"""

# A web framework's names, for a view that is defined (not served).
_FLASK = """
import atexit, types
app = types.SimpleNamespace(post=lambda rule: lambda view: view)
request = types.SimpleNamespace(get_data=lambda: b'{"city": "Oslo"}')
current_user = types.SimpleNamespace(id="u1")
"""

# A chat model that answers "done" without calling a tool.
_LANGCHAIN = """
from langchain_core.language_models.fake_chat_models import FakeMessagesListChatModel
from langchain_core.messages import AIMessage
from langchain.agents import create_agent
from toolrelay.integrations.langchain import langchain_tools

class FakeChat(FakeMessagesListChatModel):
    def bind_tools(self, tools, **kwargs):
        return self

chat_model = FakeChat(responses=[AIMessage("done")] * 10)
"""

# A scripted model that calls delete_files (dangerous: it waits for a human's approval).
_PYDANTIC_AI = """
from dataclasses import dataclass
from pydantic_ai import Agent, DeferredToolRequests, DeferredToolResults
from pydantic_ai.models.test import TestModel
from toolrelay.integrations.pydantic_ai import ToolrelayToolset, deferred_approver

@dataclass
class Session:
    auth: AuthContext

@registry.tool(name="delete_files", description="Delete old files.",
               parameters={"type": "object"}, risk="dangerous")
async def delete_files(args: dict, ctx: AuthContext) -> dict:
    return {"deleted": 3}

model = TestModel(call_tools=["delete_files"])
session = Session(auth=ctx)
agent = Agent(model, deps_type=Session, output_type=[str, DeferredToolRequests],
              toolsets=[ToolrelayToolset(Dispatcher(registry, approver=deferred_approver()),
                                         auth=lambda c: c.deps.auth)])
ask_a_human = lambda call: True
"""

_OPENAI_AGENTS = """
from toolrelay.integrations.openai_agents import function_tools
"""

_CONFIG = """
import shutil
shutil.copy("examples/toolrelay.toml", "toolrelay.toml")
"""

PRELUDES: dict[str, str] = {
    # README's and the docs' running example: a registry with get_weather (breaker key
    # open-meteo) and search (searxng), a dispatcher with the "support" profile, a context,
    # key policies, and the typed example's Forecast and fetch.
    "weather": _WEATHER,
    "sync": _WEATHER + _SYNC,  # docs/sync.md: a SyncDispatcher, a call and calls
    "flask": _WEATHER + _FLASK,
    "langchain": _WEATHER + _LANGCHAIN,
    "pydantic-ai": _WEATHER + _PYDANTIC_AI,
    "openai-agents": _WEATHER + _OPENAI_AGENTS,
    "config": _CONFIG,  # examples/toolrelay.toml in the working directory
}


@dataclass(frozen=True)
class Example:
    path: Path
    line: int
    lang: str  # "python" or "sh"
    code: str
    prelude: str | None  # a PRELUDES name
    not_run: str | None  # why not

    @property
    def id(self) -> str:
        return f"{self.path.relative_to(ROOT)}:{self.line}"


def _examples(path: Path) -> Iterator[Example]:
    lines = path.read_text(encoding="utf-8").splitlines()
    i = 0
    while i < len(lines):
        match = FENCE.match(lines[i])
        if not match or not match.group("lang"):
            if match:  # an untagged fence: skip to its end
                i += 1
                while i < len(lines) and not lines[i].strip().startswith("```"):
                    i += 1
            i += 1
            continue
        start, indent = i, len(match.group("indent"))
        i += 1
        body: list[str] = []
        while not lines[i].strip().startswith("```"):
            body.append(lines[i][indent:])
            i += 1
        i += 1
        lang = RUNNABLE.get(match.group("lang"))
        if lang is None:
            continue
        before = "\n".join(lines[:start]).rstrip()
        comment = COMMENT.search(before[before.rfind("<!--") :]) if before.endswith("-->") else None
        kind = comment.group("kind") if comment else None
        value = comment.group("value") if comment else None
        yield Example(
            path=path,
            line=start + 1,
            lang=lang,
            code="\n".join(body) + "\n",
            prelude=value if kind == "run with" else None,
            not_run=value if kind == "norun" else None,
        )


EXAMPLES = [example for path in DOCS for example in _examples(path)]
PYTHON = [e for e in EXAMPLES if e.lang == "python" and e.not_run is None]
SHELL = [e for e in EXAMPLES if e.lang == "sh" and e.not_run is None]


def test_every_example_runs_or_says_why_not() -> None:
    assert len(EXAMPLES) > 30
    for example in EXAMPLES:
        assert example.prelude is None or example.prelude in PRELUDES, example.id
        assert example.not_run is None or example.not_run, f"{example.id}: norun without a why"
    not_run = [f"{e.id}: {e.not_run}" for e in EXAMPLES if e.not_run is not None]
    assert len(not_run) <= MAX_NOT_RUN, "\n".join(not_run)


# -- Python -------------------------------------------------------------------------------
# Each example runs in a process of its own, forked from a zygote that has imported toolrelay
# (an interpreter's start and that import were most of an example's cost): a fresh
# namespace, the example's own cwd, stdin, stdout and stderr; at its end, as at an
# interpreter's, non-daemon threads are joined and atexit handlers run (then os._exit: the
# zygote's modules are not torn down again in every child). A missing import in an example
# still fails: its namespace starts empty.
ZYGOTE = """
import ast, asyncio, atexit, gc, inspect, os, sys, threading, traceback
import anyio, pydantic, toolrelay
assert threading.active_count() == 1, "a thread would not survive fork"
gc.freeze()  # the zygote's objects: never collected, so their pages stay shared
for line in sys.stdin:
    path, cwd, out, err = line.rstrip("\\n").split("\\t")
    pid = os.fork()
    if pid == 0:
        break
    print(pid, flush=True)
    print(os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]), flush=True)
else:
    sys.exit(0)
# the child: the example, in the place of a fresh interpreter's `python -c RUNNER path`
os.chdir(cwd)
written = os.O_WRONLY | os.O_CREAT | os.O_TRUNC
for fd, name, flags in ((0, os.devnull, os.O_RDONLY), (1, out, written), (2, err, written)):
    os.dup2(os.open(name, flags), fd)
sys.stdin = open(0, closefd=False)
sys.argv = ["-c", path]
status = 0
try:
    code = compile(open(path, encoding="utf-8").read(), path, "exec",
                   flags=ast.PyCF_ALLOW_TOP_LEVEL_AWAIT)
    namespace = {"__name__": "__main__", "__file__": path}
    if code.co_flags & inspect.CO_COROUTINE:
        asyncio.run(eval(code, namespace))
    else:
        exec(code, namespace)
except SystemExit as exc:  # as the interpreter reads it
    status = exc.code if isinstance(exc.code, int) else exc.code is not None
    if not isinstance(exc.code, int) and exc.code is not None:
        print(exc.code, file=sys.stderr)
except BaseException:
    traceback.print_exc()
    status = 1
for thread in threading.enumerate():
    if thread is not threading.main_thread() and not thread.daemon:
        thread.join()
atexit._run_exitfuncs()  # CPython's own exit runs these: no public name for it
sys.stdout.flush()
sys.stderr.flush()
os._exit(status)
"""


class Zygote:
    """The process examples are forked from: :meth:`run` one at a time."""

    def __init__(self) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-c", ZYGOTE],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            bufsize=1,
        )

    def run(self, script: Path, cwd: Path) -> tuple[int, str]:
        """Run ``script`` in ``cwd``: its exit status and stderr (-9 if killed at TIMEOUT_S)."""
        assert self.proc.stdin is not None and self.proc.stdout is not None
        out, err = cwd / ".stdout", cwd / ".stderr"
        self.proc.stdin.write(f"{script}\t{cwd}\t{out}\t{err}\n")
        pid = int(self.proc.stdout.readline())
        timer = threading.Timer(TIMEOUT_S, os.kill, (pid, signal.SIGKILL))
        timer.start()
        try:
            status = int(self.proc.stdout.readline())
        finally:
            timer.cancel()
        return status, err.read_text(errors="replace")

    def close(self) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.close()
        self.proc.wait(10)


@pytest.fixture(scope="module")
def zygote() -> Iterator[Zygote]:
    forker = Zygote()
    yield forker
    forker.close()


@pytest.mark.parametrize("example", PYTHON, ids=[e.id for e in PYTHON])
def test_python_example(example: Example, tmp_path: Path, zygote: Zygote) -> None:
    prelude = PRELUDES[example.prelude] if example.prelude else ""
    (tmp_path / "examples").symlink_to(ROOT / "examples")
    script = tmp_path / "example.py"
    script.write_text(prelude + "\n# -- the example --\n" + example.code, encoding="utf-8")
    status, stderr = zygote.run(script, tmp_path)
    assert status == 0, f"{example.id} failed ({status}):\n{example.code}\n{stderr[-3000:]}"


# -- shell --------------------------------------------------------------------------------
SHELL_PRELUDE = """
set -euo pipefail
curl() { command curl --fail-with-body --max-time 10 "$@"; echo; }
"""


@pytest.fixture(scope="module")
def bin_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A directory with a ``toolrelay`` command that runs this checkout's code."""
    path = tmp_path_factory.mktemp("bin")
    command = path / "toolrelay"
    command.write_text(f'#!/bin/sh\nexec "{sys.executable}" -m toolrelay "$@"\n')
    command.chmod(0o755)
    return path


@pytest.fixture(scope="module")
def gateway(tmp_path_factory: pytest.TempPathFactory, bin_dir: Path) -> Iterator[str]:
    """A running ``toolrelay serve --transport http`` (docs/serve.md's command, on free
    ports): its admin API's ``host:port``."""
    tmp = tmp_path_factory.mktemp("serve")
    config = tmp / "toolrelay.toml"
    config.write_text(
        textwrap.dedent(
            """
            [plugins.weather]
            base_url = "http://127.0.0.1:9"
            geocoding_url = "http://127.0.0.1:9"
            [plugins.websearch]
            base_url = "http://127.0.0.1:9"
            [profiles.support]
            allow = ["weather_current", "weather_forecast", "web_search"]
            [telemetry]
            metrics_port = 0
            """
        )
    )
    errlog = tmp / "serve.err"
    env = {**os.environ, "TOOLRELAY_ADMIN_TOKEN": TOKEN}
    with errlog.open("w") as err:
        proc = subprocess.Popen(
            [str(bin_dir / "toolrelay"), "serve", "--config", str(config),
             "--transport", "http", "--port", "0", "--admin-port", "0"],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=err, env=env,
        )  # fmt: skip
    try:
        admin = _announced_admin(errlog, proc)
        yield admin
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)


def _announced_admin(errlog: Path, proc: subprocess.Popen[bytes]) -> str:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        found = re.search(r"admin API on http://([0-9.]+:[0-9]+)", errlog.read_text())
        if found:
            return found.group(1)
        if proc.poll() is not None:
            break
        time.sleep(0.05)
    raise AssertionError(f"toolrelay serve did not announce its admin API:\n{errlog.read_text()}")


SERVER_BINARIES = ("promtool",)  # run by `make test` (.ci/install-servers), skipped elsewhere


def _shell_param(example: Example) -> object:
    needs = [name for name in SERVER_BINARIES if name in example.code]
    marks = [pytest.mark.servers] if needs else []
    return pytest.param(example, needs, marks=marks, id=example.id)


@pytest.mark.parametrize(("example", "binaries"), [_shell_param(e) for e in SHELL])
def test_shell_example(
    example: Example,
    binaries: list[str],
    tmp_path: Path,
    bin_dir: Path,
    request: pytest.FixtureRequest,
) -> None:
    for name in binaries:
        need_binary(name)
    code = example.code
    env = {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}"}
    if ADMIN in code:
        admin: str = request.getfixturevalue("gateway")
        code = code.replace(ADMIN, admin)
        env["TOOLRELAY_ADMIN_TOKEN"] = TOKEN
    for name in ("examples", "dashboards"):
        (tmp_path / name).symlink_to(ROOT / name)
    done = subprocess.run(
        ["bash", "-c", SHELL_PRELUDE + code],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=TIMEOUT_S,
        check=False,
    )
    assert done.returncode == 0, (
        f"{example.id} failed:\n{example.code}\n{done.stdout[-2000:]}\n{done.stderr[-2000:]}"
    )
