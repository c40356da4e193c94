"""Chaos Toolkit activities against a running ``toolrelay serve``, and the example experiment
run by the real ``chaos run`` while an MCP client keeps calling tools."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio
import pytest
from mcp import ClientSession
from mcp.client.streamable_http import streamable_http_client

from toolrelay.chaos import chaostoolkit
from toolrelay.chaos.chaostoolkit import ToolrelayAdminError
from toolrelay.chaos.upstream import StandInUpstream

ROOT = Path(__file__).resolve().parent.parent
EXPERIMENT = ROOT / "examples" / "chaostoolkit-experiment.json"
TOKEN = "chaos-admin-token-0123456789abcdef"
URL_LINE = re.compile(r"(admin API on|MCP on) (http://[0-9.:]+(?:/mcp)?)")
CONFIG = """
[plugins.weather]
base_url = "{url}"
geocoding_url = "{url}"
[plugins.websearch]
base_url = "{url}"
[breakers.open-meteo]
fail_max = 3
reset_timeout_s = 1.0
[serve]
transport = "http"
watch_interval_s = 0.2
[serve.http]
port = 0
[serve.admin]
port = 0
"""


@dataclass
class Gateway:
    proc: subprocess.Popen[bytes]
    admin_url: str
    mcp_url: str
    errlog: Path

    @property
    def configuration(self) -> dict[str, Any]:
        return {"toolrelay_admin_url": self.admin_url}


@pytest.fixture(scope="module")
def gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Gateway]:
    tmp = tmp_path_factory.mktemp("chaos")
    with StandInUpstream().run_in_thread() as upstream:
        config = tmp / "toolrelay.toml"
        config.write_text(CONFIG.format(url=upstream.url))
        errlog = tmp / "serve.err"
        with errlog.open("w") as err:
            proc = subprocess.Popen(
                [sys.executable, "-m", "toolrelay", "serve", "--config", str(config)],
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=err,
                env={**os.environ, "TOOLRELAY_ADMIN_TOKEN": TOKEN},
            )
        try:
            deadline = time.monotonic() + 20
            urls: dict[str, str] = {}
            while len(urls) < 2 and time.monotonic() < deadline and proc.poll() is None:
                time.sleep(0.05)
                urls = dict(URL_LINE.findall(errlog.read_text()))
            assert len(urls) == 2, errlog.read_text()
            yield Gateway(proc, urls["admin API on"], urls["MCP on"], errlog)
        finally:
            proc.send_signal(signal.SIGTERM)
            assert proc.wait(timeout=15) == 0, errlog.read_text()


SECRETS = {"admin_token": TOKEN}


# -- discovery -------------------------------------------------------------------------------
def test_discover_lists_the_activities() -> None:
    document = chaostoolkit.discover(discover_system=False)
    assert document["extension"]["name"] == "toolrelay"
    kinds = {a["name"]: a["type"] for a in document["activities"]}
    assert kinds == {
        "inject_fault": "action", "clear_faults": "action", "force_open_breaker": "action",
        "reset_breaker": "action", "breaker_state": "probe", "answered_ratio": "probe",
    }  # fmt: skip
    ratio = next(a for a in document["activities"] if a["name"] == "answered_ratio")
    assert ratio["mod"] == "toolrelay.chaos.chaostoolkit"
    assert [a["name"] for a in ratio["arguments"]] == [
        "tool", "window_s", "ok_only", "configuration", "secrets",
    ]  # fmt: skip
    assert ratio["return_type"] == "number" and "fraction" in ratio["doc"]
    assert document["system"] is None


def test_discovery_without_chaoslib_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "chaoslib.discovery.discover", None)
    with pytest.raises(ImportError, match=r"toolrelay\[chaos\]"):
        chaostoolkit.discover(discover_system=False)


def test_discover_system_reads_the_gateway(
    gateway: Gateway, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TOOLRELAY_ADMIN_URL", gateway.admin_url)
    monkeypatch.setenv("TOOLRELAY_ADMIN_TOKEN", TOKEN)
    system = chaostoolkit.discover()["system"]
    assert {t["name"] for t in system["tools"]} >= {"weather_current", "web_search"}
    assert "open-meteo" in system["breakers"]


# -- the activities ----------------------------------------------------------------------------
def test_actions_and_probes(gateway: Gateway) -> None:
    config = gateway.configuration
    added = chaostoolkit.inject_fault(
        {"kind": "latency", "tool": "weather_current", "latency_s": 0.01},
        seed=3, configuration=config, secrets=SECRETS,
    )  # fmt: skip
    assert len(added["added"]) == 1 and added["faults"][0]["kind"] == "latency"
    again = chaostoolkit.inject_fault(
        {"kind": "hang", "tool": "web_search"}, replace=True, configuration=config, secrets=SECRETS
    )
    assert [f["kind"] for f in again["faults"]] == ["hang"]
    assert chaostoolkit.clear_faults(configuration=config, secrets=SECRETS) == {"removed": 1}

    opened = chaostoolkit.force_open_breaker("searxng", configuration=config, secrets=SECRETS)
    assert opened["state"] == "open" and opened["pinned_open"] is True
    assert chaostoolkit.breaker_state("searxng", configuration=config, secrets=SECRETS) == "open"
    reset = chaostoolkit.reset_breaker("searxng", configuration=config, secrets=SECRETS)
    assert reset["state"] == "closed"
    ratio = chaostoolkit.answered_ratio(configuration=config, secrets=SECRETS)
    assert 0.0 <= ratio <= 1.0


@pytest.mark.parametrize(
    ("call", "needle"),
    [
        (lambda c, s: chaostoolkit.breaker_state("nope", c, s), "404 unknown_breaker"),
        (lambda c, s: chaostoolkit.inject_fault({"kind": "boom"}, None, False, c, s), "422"),
        (lambda c, s: chaostoolkit.clear_faults(c, {"admin_token": "wrong"}), "401 unauthorized"),
        (lambda c, s: chaostoolkit.clear_faults({}, s), "no admin API URL"),
        (
            lambda c, s: chaostoolkit.clear_faults(
                {"toolrelay_admin_url": "http://127.0.0.1:9"}, s
            ),
            "ConnectError",
        ),
    ],
)
def test_refusals_are_clear(
    gateway: Gateway, monkeypatch: pytest.MonkeyPatch, call: Any, needle: str
) -> None:
    monkeypatch.delenv("TOOLRELAY_ADMIN_URL", raising=False)
    with pytest.raises(ToolrelayAdminError, match=re.escape(needle)):
        call(gateway.configuration, SECRETS)


# -- the example experiment, under the real `chaos run` -----------------------------------------
class Agent(threading.Thread):
    """An MCP client calling weather_current every 50 ms until told to stop."""

    def __init__(self, url: str) -> None:
        super().__init__(daemon=True)
        self.url = url
        self.stopping = threading.Event()
        self.outcomes: Counter[str] = Counter()
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            anyio.run(self._calls)
        except BaseException as exc:  # reported by the test
            self.error = exc

    async def _calls(self) -> None:
        async with (
            streamable_http_client(self.url) as (read, write),
            ClientSession(read, write) as session,
        ):
            await session.initialize()
            while not self.stopping.is_set():
                result = await session.call_tool("weather_current", {"city": "Oslo"})
                envelope = result.structured_content or {}
                self.outcomes["ok" if not result.is_error else envelope["error_type"]] += 1
                await anyio.sleep(0.05)


def test_example_experiment_under_chaos_run(gateway: Gateway, tmp_path: Path) -> None:
    chaostoolkit.clear_faults(configuration=gateway.configuration, secrets=SECRETS)
    agent = Agent(gateway.mcp_url)
    agent.start()
    try:
        deadline = time.monotonic() + 10
        while agent.outcomes["ok"] < 3 and time.monotonic() < deadline and agent.is_alive():
            time.sleep(0.05)
        assert agent.outcomes["ok"] >= 3, (agent.outcomes, agent.error)
        journal = tmp_path / "journal.json"
        result = subprocess.run(
            [
                sys.executable, "-m", "chaostoolkit", "--no-version-check",
                "--log-file", str(tmp_path / "chaostoolkit.log"),
                "--settings", str(tmp_path / "settings.yaml"),
                "run", "--journal-path", str(journal), str(EXPERIMENT),
            ],
            capture_output=True, text=True, timeout=120, cwd=tmp_path,
            env={**os.environ, "TOOLRELAY_ADMIN_URL": gateway.admin_url,
                 "TOOLRELAY_ADMIN_TOKEN": TOKEN},
        )  # fmt: skip
    finally:
        agent.stopping.set()
        agent.join(timeout=10)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert agent.error is None, agent.error
    report = json.loads(journal.read_text())
    assert report["status"] == "completed" and report["deviated"] is False
    assert report["steady_states"]["before"]["steady_state_met"] is True
    assert report["steady_states"]["after"]["steady_state_met"] is True
    runs = {run["activity"]["name"]: run for run in report["run"]}
    assert all(run["status"] == "succeeded" for run in runs.values()), runs
    assert runs["weather-breaker-during-the-outage"]["output"] == "open"
    assert runs["answered-during-the-outage"]["output"] == 1.0
    assert runs["operator-pauses-web-search"]["output"]["pinned_open"] is True
    assert [r["activity"]["name"] for r in report["rollbacks"]] == [
        "clear-every-fault", "resume-web-search",
    ]  # fmt: skip
    # the agent was answered throughout: fenced off during the outage, served after it
    assert agent.outcomes["circuit_open"] > 0 and agent.outcomes["ok"] > 3
    assert set(agent.outcomes) <= {"ok", "tool_error", "circuit_open"}
    config = gateway.configuration
    assert chaostoolkit.breaker_state("searxng", configuration=config, secrets=SECRETS) == "closed"
    assert chaostoolkit.breaker_state("open-meteo", configuration=config, secrets=SECRETS) == (
        "closed"
    )
