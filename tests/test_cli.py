"""The toolrelay command: every command, bad input, and a short demo run."""

from __future__ import annotations

import json
import subprocess
import sys
import warnings
from collections.abc import Iterator
from pathlib import Path

import pytest

from toolrelay import DispatcherOptions, demo
from toolrelay.chaos.upstream import StandInUpstream
from toolrelay.cli import main

ROOT = Path(__file__).resolve().parent.parent


def toolrelay(
    *args: str, cwd: Path | None = None, timeout: float = 60
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "toolrelay", *args],
        capture_output=True,
        text=True,
        cwd=cwd,
        timeout=timeout,
    )


def in_process(capfd: pytest.CaptureFixture[str], *args: str) -> subprocess.CompletedProcess[str]:
    """``toolrelay ARGS`` run by the command's entry point in this process (what ``python -m
    toolrelay`` runs, without starting an interpreter): its exit status, and everything
    written to file descriptors 1 and 2 meanwhile. The tests of the process itself (usage,
    exit statuses, one-line errors, the demo) run ``toolrelay`` above. Warnings are shown
    on stderr as an interpreter started without ``-W`` shows them (pytest's filters off)."""
    capfd.readouterr()
    with warnings.catch_warnings(record=True) as caught:
        warnings.resetwarnings()
        for hidden in (
            DeprecationWarning,
            PendingDeprecationWarning,
            ImportWarning,
            ResourceWarning,
        ):
            warnings.simplefilter("ignore", hidden)
        try:
            code = main(list(args))
        except SystemExit as exc:  # argparse's usage errors
            code = int(exc.code or 0)
    out, err = capfd.readouterr()
    err += "".join(
        warnings.formatwarning(w.message, w.category, w.filename, w.lineno) for w in caught
    )
    return subprocess.CompletedProcess(["toolrelay", *args], code, out, err)


def one_clear_line(result: subprocess.CompletedProcess[str]) -> str:
    assert "Traceback" not in result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    return lines[0]


@pytest.fixture(scope="module")
def config(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    upstream = StandInUpstream()
    with upstream.run_in_thread() as up:
        path = tmp_path_factory.mktemp("cli") / "toolrelay.toml"
        path.write_text(
            f'[plugins.weather]\nbase_url = "{up.url}"\ngeocoding_url = "{up.url}"\n'
            f'[plugins.websearch]\nbase_url = "{up.url}"\n'
            '[profiles.support]\nallow = ["weather_current"]\n'
        )
        yield path


def test_call_prints_the_model_answer(config: Path, capfd: pytest.CaptureFixture[str]) -> None:
    result = in_process(
        capfd, "call", "weather_current", '{"city": "Oslo"}', "--config", str(config)
    )
    assert result.returncode == 0, result.stderr
    answer = json.loads(result.stdout)
    assert answer["ok"] is True and "temperature_c" in json.dumps(answer["data"])


@pytest.mark.parametrize(
    ("args", "error_type"),
    [
        (["weather_current", '{"city": 7}'], "validation_error"),
        (["weather_current", "{not json"], "invalid_arguments"),
        (["no_such_tool", "{}"], "unknown_tool"),
        (["web_search", '{"query": "x"}', "--profile", "support"], "tool_policy"),
    ],
)
def test_call_failures_are_answers_with_exit_status_1(
    config: Path, args: list[str], error_type: str, capfd: pytest.CaptureFixture[str]
) -> None:
    result = in_process(capfd, "call", *args, "--config", str(config))
    assert result.returncode == 1
    assert json.loads(result.stdout)["error_type"] == error_type
    assert result.stderr == ""


def test_specs_in_every_format(config: Path, capfd: pytest.CaptureFixture[str]) -> None:
    result = in_process(capfd, "specs", "--format", "mcp", "--config", str(config))
    assert result.returncode == 0, result.stderr
    names = {tool["name"] for tool in json.loads(result.stdout)}
    assert {"weather_current", "weather_forecast", "web_search"} <= names
    support = in_process(capfd, "specs", "--profile", "support", "--config", str(config))
    assert [t["function"]["name"] for t in json.loads(support.stdout)] == ["weather_current"]
    anthropic = in_process(capfd, "specs", "--format", "anthropic", "--config", str(config))
    assert all("input_schema" in t for t in json.loads(anthropic.stdout))


def test_specs_without_a_config_uses_embedded_defaults(tmp_path: Path) -> None:
    result = toolrelay("specs", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert {t["function"]["name"] for t in json.loads(result.stdout)} == {
        "weather_current",
        "weather_forecast",
    }


def test_check(tmp_path: Path) -> None:
    good = toolrelay("check", str(ROOT / "examples" / "toolrelay.toml"))
    assert good.returncode == 0 and "ok (3 plugins" in good.stdout
    bad = tmp_path / "bad.toml"
    bad.write_text("[keys.x.breaker]\nfail_max = -1\n")
    result = toolrelay("check", str(bad))
    assert result.returncode == 2
    assert "keys.x.breaker.fail_max: must be ≥ 1" in one_clear_line(result)


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["check", "/nonexistent/toolrelay.toml"], "cannot read"),
        (["call", "x", "{}", "--config", "/nonexistent.toml"], "cannot read"),
        (["demo", "--duration", "0"], "--duration must be at least 10 s"),
        # a 5 s run cannot fit the outage, the breaker's break and the recovery: it exited 1
        (["demo", "--duration", "5"], "--duration must be at least 10 s"),
    ],
)
def test_errors_are_one_line(args: list[str], needle: str) -> None:
    result = toolrelay(*args)
    assert result.returncode == 2
    assert needle in one_clear_line(result)


def test_plugin_errors_are_one_line(tmp_path: Path, capfd: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "toolrelay.toml"
    path.write_text("[plugins.nope]\n")
    result = in_process(capfd, "specs", "--config", str(path))
    assert result.returncode == 2 and "'toolrelay_plugins.nope'" in one_clear_line(result)


def test_usage_errors() -> None:
    result = toolrelay()
    assert result.returncode == 2 and "usage: toolrelay" in result.stderr
    assert "Traceback" not in result.stderr


def test_short_demo_report(tmp_path: Path) -> None:
    """One demo run (10 s, seed 3: long enough for a hedge to win) for what the demo
    promises: its invariants, the JSON and HTML reports (the same timeline), and hedging on
    the slow feed. (The last two were demo runs of their own, in test_experiments.py and
    test_resilience_experiments.py.)"""
    report_path, page = tmp_path / "report.json", tmp_path / "report.html"
    result = toolrelay(
        "demo", "--duration", "10", "--seed", "3", "--json", str(report_path),
        "--html", str(page), "--metrics-port", "0", "--plain", timeout=120,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr
    assert "Traceback" not in result.stderr
    report = json.loads(report_path.read_text())
    assert report["ok"] is True
    assert report["calls"] == report["answered"] > 10
    assert report["exceptions_escaped"] == []
    names = [i["name"] for i in report["invariants"]]
    assert names == [
        "every call answered",
        "no slot held beyond its budget",
        "every timeout answered within its deadline + 50 ms",
        "the search breaker opened during the outage and closed after it",
        "web_search_backup answered web_search calls while search was down",
        "no exception escaped",
    ]
    assert all(i["ok"] for i in report["invariants"])
    moves = [(t["breaker_key"], t["to"]) for t in report["breaker_transitions"]]
    assert ("searxng", "open") in moves and moves.index(("searxng", "open")) < len(moves) - 1
    assert report["tools"]["web_search"]["outcomes"].get("timeout", 0) >= 1
    assert report["served_by_fallback"]["web_search_backup"] >= 1
    assert report["slot"]["max_hold_s"] <= 3.05
    assert "all invariants hold" in result.stdout

    # The JSON's timeline holds every answer, its fault windows and tools; the HTML has a
    # chart per tool.
    timeline = report["timeline"]
    assert timeline["calls"]["answers"] == report["answered"]
    assert {w["fault"] for w in timeline["fault_windows"]} == {
        w["fault"] for w in report["fault_windows"]
    }
    assert report["fault_windows"], "the demo injected no fault"
    assert set(timeline["tools"]) == set(report["tools"])
    html = page.read_text()
    assert html.count("<section class='chart tool'") == len(report["tools"])
    assert "toolrelay demo" in html

    # Hedging: the slow feed's tail is answered by hedges, and costs no answer.
    won = report["hedges"]["won"]
    assert won >= 1, report["hedges"]
    assert f"hedging: {won} slow feed calls answered by a hedge" in result.stdout
    feeds = report["tools"]["feed_latest"]["outcomes"]
    assert feeds.get("ok", 0) == sum(feeds.values()) > 0, feeds


def test_demo_sends_spans_to_an_otlp_endpoint(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
    from threading import Thread

    received: list[tuple[str, str, int]] = []

    class Collector(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            length = int(self.headers.get("Content-Length", 0))
            self.rfile.read(length)
            received.append((self.path, self.headers.get("Content-Type", ""), length))
            self.send_response(200)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Collector)
    Thread(target=server.serve_forever, daemon=True).start()
    try:
        endpoint = f"http://127.0.0.1:{server.server_address[1]}/v1/traces"
        # in-process, with the demo's floor lowered: a 3 s run sends spans as a 30 s one does
        monkeypatch.setattr(demo, "MIN_DURATION_S", 3.0)
        main(["demo", "--duration", "3", "--metrics-port", "0", "--plain",
              "--otlp-endpoint", endpoint])  # fmt: skip
        assert received, capsys.readouterr().out[-1000:]
        path, content_type, length = received[0]
        assert path == "/v1/traces" and content_type == "application/x-protobuf" and length > 100
    finally:
        server.shutdown()
        server.server_close()


def test_live_view_renders_tools_breakers_and_slot() -> None:
    from rich.console import Console

    from toolrelay import Dispatcher, ErrorType, ToolRegistry
    from toolrelay.chaos.record import Record
    from toolrelay.chaos.timeline import Window
    from toolrelay.demo import DemoReport
    from toolrelay.demo_view import RichView
    from toolrelay.result import ToolResult

    answers = [ToolResult(True, "web_search", None, duration_s=s) for s in (0.01, 0.02, 0.03)]
    answers.append(
        ToolResult(False, "web_search", None, error_type=ErrorType.TIMEOUT, duration_s=1.0)
    )
    record = Record(0.0, windows=[Window("search upstream hangs", 8.0, 18.0)])
    record.answers = [(0.0, "web_search", result, 1.0) for result in answers]
    record.holds = [(0.4, 3.0), (1.2, 3.0)]
    record.transitions = [(9.2, "searxng", "closed", "open", 0, 0, 0)]
    report = DemoReport(duration_s=30, seed=1, record=record)
    dispatcher = Dispatcher(ToolRegistry(), DispatcherOptions(telemetry=False))
    dispatcher.breakers.force_open("searxng")
    console = Console(record=True, width=140)
    console.print(RichView(30).render(report, dispatcher, elapsed=10.0))
    text = console.export_text()
    assert "web_search" in text and "ok=3 timeout=1" in text and "1000 ms" in text
    assert "searxng" in text and "open" in text and "closed → open at 9.2 s" in text
    assert "max 1.20 s of a 3.0 s budget" in text
    assert "faults now: search upstream hangs" in text


def test_check_validates_the_serve_section(
    tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    good = tmp_path / "good.toml"
    good.write_text('[serve]\ntransport = "http"\n[serve.http]\nport = 8000\n')
    assert in_process(capfd, "check", str(good)).returncode == 0
    bad = tmp_path / "bad.toml"
    bad.write_text("[serve]\ncolour = 1\n")
    result = in_process(capfd, "check", str(bad))
    assert result.returncode == 2
    assert "serve: Additional properties are not allowed ('colour'" in one_clear_line(result)


def test_chaos_upstream_takes_its_options() -> None:
    """The README's `toolrelay chaos upstream --port 8765` form (options after the tool)."""
    import socket
    import urllib.request

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "toolrelay",
            "chaos",
            "upstream",
            "--port",
            str(port),
            "--seed",
            "3",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        assert f"stand-in upstream on http://127.0.0.1:{port}" in line, proc.stderr
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/_admin/faults", timeout=5) as resp:
            assert resp.status == 200
    finally:
        proc.terminate()
        proc.wait(10)
    bad = toolrelay("chaos", "upstream", "--port", "not-a-number")
    assert bad.returncode == 2 and "invalid int value" in bad.stderr


SERVE_FILE = """
[plugins.weather]
base_url = "http://127.0.0.1:9"
[serve]
transport = "stdio"
watch_interval_s = 0.5
"""


def test_one_config_file_works_for_every_command(
    tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    """check, call, specs, serve and Dispatcher.from_config take the same file, [serve]
    section included, and refuse a bad [serve] section with the same one line."""
    from toolrelay import Dispatcher
    from toolrelay.config import ConfigError

    good = tmp_path / "toolrelay.toml"
    good.write_text(SERVE_FILE)
    assert in_process(capfd, "check", str(good)).returncode == 0
    specs = in_process(capfd, "specs", "--config", str(good))
    assert specs.returncode == 0 and "weather_current" in specs.stdout
    called = in_process(capfd, "call", "weather_current", '{"city": ""}', "--config", str(good))
    assert called.returncode == 1 and '"error_type": "validation_error"' in called.stdout
    Dispatcher.from_config(good).close()

    bad = tmp_path / "bad.toml"
    bad.write_text(SERVE_FILE + "colour = 1\n")
    expected = "serve: Additional properties are not allowed ('colour'"
    for args in (
        ["check", str(bad)],
        ["specs", "--config", str(bad)],
        ["call", "weather_current", "{}", "--config", str(bad)],
        ["serve", "--config", str(bad)],
    ):
        result = in_process(capfd, *args)
        assert result.returncode == 2, args
        assert expected in one_clear_line(result), args
    with pytest.raises(ConfigError, match=r"serve: Additional properties are not allowed"):
        Dispatcher.from_config(bad)


def test_a_bad_count_errors_pattern_is_a_config_error(
    tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    bad = tmp_path / "bad.toml"
    bad.write_text(
        '[serve.upstreams.docs]\ncommand = ["x"]\nbreaker_key = "docs"\ncount_errors = "(x"\n'
    )
    result = in_process(capfd, "check", str(bad))
    assert result.returncode == 2
    assert "serve.upstreams.docs.count_errors: not a valid regular expression" in one_clear_line(
        result
    )
