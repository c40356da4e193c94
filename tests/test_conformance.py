"""The official MCP conformance suite against toolrelay serve (issue 30).

``@modelcontextprotocol/conformance`` (pinned in tests/node/package.json) is run as an
operator would run it, ``conformance server --url URL --suite active`` (and the pending
json-schema-2020-12), once per target, and its results (``-o DIR``: one
``server-<scenario>-<time>/checks.json`` per scenario) are parsed, so a failure names the
scenario, the check and the suite's message:

- **direct**: ``servers/everything_server.py``, our upstream with every feature the suite's
  server scenarios exercise, over streamable HTTP. It must pass everything: that proves the
  server.
- **through the gateway**: ``toolrelay serve`` (HTTP) in front of that server, reached over
  stdio and over streamable HTTP: exactly the scenarios that pass directly must pass.
- **plugins only**: ``toolrelay serve`` with a plugin and no upstream passes every
  protocol-level scenario (initialize, ping, tools, errors, DNS rebinding, concurrent
  streams).

The suite's expected-failures file (tests/node/conformance-expected-failures.yml) stays
empty: nothing is excused. One suite run takes ~3 s; the servers start, and the four runs go, side
by side in one module fixture.
"""

from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

import node_packages

pytestmark = pytest.mark.servers

SERVER = Path(__file__).parent / "servers" / "everything_server.py"
EXPECTED_FAILURES = Path(__file__).parent / "node" / "conformance-expected-failures.yml"
MCP_URL = re.compile(r"MCP on (http://[0-9.:]+/mcp)")
RESULT_DIR = re.compile(r"^server-(?P<scenario>.+)-\d{4}-\d{2}-\d{2}T[0-9-]+Z$")
# The active suite, and the one pending scenario every server can pass: json-schema-2020-12
# (the other, server-sse-polling, warns against any MCP Python SDK server — the suite sends
# MCP-Protocol-Version 2025-03-26, to which the SDK sends no SSE priming event — and a
# warning fails a run with an expected-failures file).
SELECTIONS = [["--suite", "active"], ["--scenario", "json-schema-2020-12"]]
# What a gateway with no upstream (tools from plugins only) must pass.
PROTOCOL_SCENARIOS = {
    "server-initialize",
    "ping",
    "tools-list",
    "tools-call-error",  # an unknown tool: the answer envelope, isError with its message
    "dns-rebinding-protection",
    "server-sse-multiple-streams",
}


@dataclass
class Run:
    """One run of the suite: every scenario's checks, and the suite's own summary."""

    target: str
    checks: dict[str, list[dict[str, Any]]]  # scenario -> its checks
    exit_code: int
    output: str

    def failures(self, scenario: str) -> list[str]:
        return [
            f"{check['id']}: {check.get('errorMessage') or check.get('description')}"
            for check in self.checks[scenario]
            if check.get("status") == "FAILURE"
        ]

    def passed(self) -> set[str]:
        return {scenario for scenario in self.checks if not self.failures(scenario)}

    def report(self, scenarios: set[str]) -> str:
        """The failing scenarios among ``scenarios``, each with its failed checks."""
        lines = [f"{self.target}: {len(scenarios - self.passed())} scenario(s) failed"]
        for scenario in sorted(scenarios):
            if scenario not in self.checks:
                lines.append(f"  {scenario}: not run")
            elif self.failures(scenario):
                lines.append(f"  {scenario}: " + "; ".join(self.failures(scenario)))
        return "\n".join(lines)


def run_suite(url: str, out: Path, target: str) -> Run:
    packages = node_packages.installed()
    out.mkdir(parents=True)
    exit_code, output = 0, ""
    for selection in SELECTIONS:
        command = [packages.node, packages.bin("conformance"), "server", "--url", url]
        command += [*selection, "--expected-failures", str(EXPECTED_FAILURES), "-o", str(out)]
        proc = subprocess.run(command, cwd=out, capture_output=True, text=True, timeout=300)
        exit_code, output = max(exit_code, proc.returncode), output + proc.stdout + proc.stderr
    checks: dict[str, list[dict[str, Any]]] = {}
    for entry in out.iterdir():
        found = RESULT_DIR.match(entry.name)
        if found is not None and (entry / "checks.json").exists():
            checks[found["scenario"]] = json.loads((entry / "checks.json").read_text())
    assert checks, f"the suite wrote no results:\n{output}"
    return Run(target, checks, exit_code, output)


def scenarios() -> set[str]:
    """Every server scenario of the pinned suite (``conformance list``) but the pending
    server-sse-polling."""
    packages = node_packages.installed()
    listing = subprocess.run(
        [packages.node, packages.bin("conformance"), "list"],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    ).stdout
    server_part = listing.split("Client scenarios", 1)[0]
    return set(re.findall(r"^\s+- (\S+) \[", server_part, re.MULTILINE)) - {"server-sse-polling"}


def stop(proc: subprocess.Popen[str]) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:  # pragma: no cover - a hung process
            proc.kill()
            proc.wait(5)


def start_upstream(tmp: Path) -> tuple[subprocess.Popen[str], str]:
    """The everything server over streamable HTTP, on a port the system chose."""
    with (tmp / "everything.err").open("w") as errlog:
        command = [sys.executable, str(SERVER), "--http", "0"]
        proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=errlog, text=True)
    assert proc.stdout is not None
    line = proc.stdout.readline()  # "PORT <n>", once it listens
    assert line.startswith("PORT "), f"the everything server did not start: {line!r}"
    return proc, f"http://127.0.0.1:{int(line.split()[1])}/mcp"


def start_gateway(tmp: Path, upstream: str) -> subprocess.Popen[str]:
    """``toolrelay serve`` over HTTP with ``upstream`` (a config section, or a plugin)."""
    tmp.mkdir()
    config = tmp / "toolrelay.toml"
    # The suite's tools are unannotated (writes, per the spec); its tool calls must reach
    # the upstream, so this profile asks no approval (approvals are tested elsewhere).
    config.write_text(
        f"""
[profiles.conformance]
require_approval = []
[serve]
transport = "http"
profile = "conformance"
[serve.http]
port = 0
{upstream}
"""
    )
    with (tmp / "serve.err").open("w") as err:
        return subprocess.Popen(
            [sys.executable, "-m", "toolrelay", "serve", "--config", str(config)],
            stdin=subprocess.DEVNULL,
            stderr=err,
            text=True,
        )


def gateway_url(tmp: Path, proc: subprocess.Popen[str]) -> str:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and proc.poll() is None:
        found = MCP_URL.search((tmp / "serve.err").read_text())
        if found:
            return found.group(1)
        time.sleep(0.05)
    raise AssertionError(f"toolrelay serve did not start:\n{(tmp / 'serve.err').read_text()}")


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Run | str]]:
    """One run of the suite per target (or why a gateway did not start); the servers
    start, and the runs go, side by side."""
    tmp = tmp_path_factory.mktemp("conformance")
    procs: list[subprocess.Popen[str]] = []
    try:
        upstream, upstream_url = start_upstream(tmp)
        procs.append(upstream)
        command = json.dumps([sys.executable, str(SERVER)])
        sections = {
            "via the gateway, stdio upstream": f"command = {command}",
            "via the gateway, http upstream": f'url = "{upstream_url}"',
        }
        configs = {
            target: f'[serve.upstreams.everything]\n{where}\nbreaker_key = "everything"\n'
            for target, where in sections.items()
        }
        configs["plugins only"] = "[plugins.weather]\n"
        folders = {target: tmp / f"gateway{n}" for n, target in enumerate(configs)}
        gateways = {t: start_gateway(folders[t], configs[t]) for t in configs}
        procs.extend(gateways.values())
        urls, failed = {"direct": upstream_url}, {}
        for target, proc in gateways.items():
            try:
                urls[target] = gateway_url(folders[target], proc)
            except AssertionError as exc:  # reported by that target's test alone
                failed[target] = str(exc)
        with ThreadPoolExecutor(len(urls)) as pool:
            futures = {
                t: pool.submit(run_suite, url, tmp / f"results{n}", t)
                for n, (t, url) in enumerate(urls.items())
            }
            yield {**failed, **{target: future.result() for target, future in futures.items()}}
    finally:
        for proc in procs:
            stop(proc)
    for folder in folders.values():
        log = (folder / "serve.err").read_text()
        assert "Traceback" not in log, log


def taken(runs: dict[str, Run | str], target: str) -> Run:
    run = runs[target]
    if isinstance(run, str):
        pytest.fail(f"{target}: {run}")
    return run


def test_the_expected_failures_file_is_empty() -> None:
    assert EXPECTED_FAILURES.read_text().split("\n#", 1)[0].strip() == "server: []"


def test_the_everything_server_passes_every_scenario_directly(runs: dict[str, Run | str]) -> None:
    every, direct = scenarios(), taken(runs, "direct")
    assert len(every) >= 31, every
    assert set(direct.checks) == every, direct.output
    assert direct.passed() == every, direct.report(every)
    assert direct.exit_code == 0, direct.output


@pytest.mark.parametrize("upstream", ["stdio", "http"])
def test_the_gateway_passes_what_the_upstream_passes(
    upstream: str, runs: dict[str, Run | str]
) -> None:
    direct, run = taken(runs, "direct"), taken(runs, f"via the gateway, {upstream} upstream")
    assert set(run.checks) == set(direct.checks), run.output
    assert run.passed() == direct.passed(), run.report(direct.passed())
    assert run.exit_code == 0, run.output


def test_the_gateway_with_plugins_only_passes_every_protocol_scenario(
    runs: dict[str, Run | str],
) -> None:
    run = taken(runs, "plugins only")
    assert run.passed() >= PROTOCOL_SCENARIOS, run.report(PROTOCOL_SCENARIOS)
    (listing,) = run.checks["tools-list"]
    assert listing["details"]["toolCount"] == 2, listing  # the weather plugin's tools
