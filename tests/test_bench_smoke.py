"""The benchmark harness (bench/run.py) runs and reports: its correctness, never its speed."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

from helpers import load_script

ROOT = Path(__file__).resolve().parents[1]
RUN = ROOT / "bench" / "run.py"


def load_harness() -> ModuleType:
    return load_script(RUN, "toolrelay_bench_run")


@pytest.fixture(scope="module")
def harness() -> ModuleType:
    return load_harness()


def test_quick_run_prints_one_table_and_writes_results(tmp_path: Path) -> None:
    results = tmp_path / "RESULTS.md"
    only = "overhead,fastfail,agents"
    proc = subprocess.run(
        [sys.executable, str(RUN), "--quick", "--only", only, "--results", str(results)],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    out = proc.stdout
    assert out.count("benchmark  ") == 1  # one table, one header
    for row in (
        "dispatch (metrics + tracing API) / bare call",
        "dispatch, telemetry off / bare call",
        "open-breaker answer / successful dispatch",
    ):
        assert row in out
    agents_measured = "toolrelay / Agents SDK invoke_function_tool (timeout enforced)" in out
    assert agents_measured or "skipped (pip install '.[bench]')" in out
    assert "ERROR" not in out
    assert "naive stack" not in out  # --only was honoured
    assert f"wrote {results}" in out

    text = results.read_text(encoding="utf-8")
    assert text.startswith("# toolrelay benchmark results")
    assert "--quick --only overhead,fastfail,agents" in text
    for heading in ("## Machine", "## Results", "## Method"):
        assert heading in text
    for fact in ("**CPU**", "**cores**", "**Python**", "anyio ", "pybreaker ", "tenacity "):
        assert fact in text
    for package in ("jsonschema-rs", "opentelemetry-sdk", "prometheus-client", "openai-agents"):
        assert package in text
    assert "| benchmark | result | target | status | context |" in text
    assert "| open-breaker answer / successful dispatch |" in text
    assert "≤ 0.5×" in text


def test_a_quick_run_writes_no_results_unless_told_where(
    tmp_path: Path, harness: ModuleType, monkeypatch: pytest.MonkeyPatch
) -> None:
    # the real script (and its suite), run from a copy: its default RESULTS.md is the
    # copy's, never the repository's (which a concurrent full run may be writing)
    bench = tmp_path / "bench"
    shutil.copytree(RUN.parent, bench, ignore=shutil.ignore_patterns("RESULTS.md", "__pycache__"))
    proc = subprocess.run(
        [sys.executable, str(bench / "run.py"), "--quick", "--only", "fastfail"],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "open-breaker answer / successful dispatch" in proc.stdout
    assert "wrote " not in proc.stdout
    assert not (bench / "RESULTS.md").exists()

    # a full run writes it by default; --results - and a quick run do not
    default = tmp_path / "RESULTS.md"
    monkeypatch.setattr(harness, "DEFAULT_RESULTS", default)
    rows = [harness.Row("fastfail", "met", 0.4, target="≤ 0.5×", passed=True)]
    monkeypatch.setattr(harness, "run_isolated", lambda name, quick: rows)
    assert harness.main(["--quick", "--only", "fastfail"]) == 0
    assert harness.main(["--only", "fastfail", "--results", "-"]) == 0
    assert not default.exists()
    assert harness.main(["--only", "fastfail"]) == 0
    assert default.read_text(encoding="utf-8").startswith("# toolrelay benchmark results")
    told = tmp_path / "quick.md"
    assert harness.main(["--quick", "--only", "fastfail", "--results", str(told)]) == 0
    assert "--quick --only fastfail" in told.read_text(encoding="utf-8")


def test_unknown_benchmark_is_refused() -> None:
    proc = subprocess.run(
        [sys.executable, str(RUN), "--only", "nope", "--results", "-"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 2
    assert "unknown benchmark" in proc.stderr


def test_check_fails_on_a_missed_target_or_an_error(
    harness: ModuleType, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    Row = harness.Row
    fake = {
        "overhead": [Row("overhead", "context only", 100.0)],
        "fastfail": [Row("fastfail", "met", 0.4, target="≤ 0.5×", passed=True)],
        "agents": [Row("agents", "not installed", status=harness.SKIP_BENCH)],
        "scale": [Row("scale", "missed", 1.3, target="≤ 1.1×", passed=False)],
        "memory": [Row("memory", "memory", status="ERROR", context="exit 1: boom")],
        "naive": [Row("naive", "noisy", 2.0, target="≤ 1.25×", passed=False, in_force=False)],
    }
    monkeypatch.setattr(harness, "run_isolated", lambda name, quick: fake[name])

    assert harness.main(["--only", "overhead,fastfail,agents", "--check", "--results", "-"]) == 0
    out = capsys.readouterr().out
    assert "info" in out and "ok" in out and "skipped (pip install '.[bench]')" in out

    assert harness.main(["--only", "overhead,scale", "--check", "--results", "-"]) == 1
    assert "1 target(s) missed" in capsys.readouterr().out
    assert harness.main(["--only", "memory", "--check", "--results", "-"]) == 1
    assert harness.main(["--only", "scale", "--results", "-"]) == 0  # no --check: report only

    # a target not in force is judged and shown, never failed on
    capsys.readouterr()
    assert harness.main(["--only", "naive,fastfail", "--check", "--results", "-"]) == 0
    out = capsys.readouterr().out
    assert "miss (not checked)" in out and "1 target(s) not in force in this run missed" in out
    assert "target(s) missed or failed" not in out


def test_rows_render_with_units_and_verdicts(harness: ModuleType) -> None:
    Row = harness.Row
    rows = [
        Row("a", "ratio", 1.234, target="≤ 2×", passed=True),
        Row("b", "latency", 4.5, unit="ms", target="≤ 5 ms", passed=True),
        Row("c", "rate", 12345.6, unit="calls/s"),
        Row("d", "growth", 11.0, unit="MB", target="≤ 10 MB", passed=False),
    ]
    assert [r.shown() for r in rows] == ["1.23×", "4.50 ms", "12,346 calls/s", "11.00 MB"]
    assert [r.verdict for r in rows] == ["ok", "ok", "info", "MISS"]
    assert [r.fails_check for r in rows] == [False, False, False, True]
    shown_only = Row("e", "noisy", 2.0, target="≤ 1.25×", passed=False, in_force=False)
    assert (shown_only.verdict, shown_only.fails_check) == ("miss (not checked)", False)
    assert Row("f", "broke", status="ERROR").fails_check
    table = harness.text_table(rows).splitlines()
    assert table[0].split()[:4] == ["benchmark", "result", "target", "status"]
    assert len(table) == 2 + len(rows)
    assert harness.percentile([5.0, 1.0, 3.0, 2.0, 4.0], 99) == 5.0
    assert harness.percentile(list(range(1, 101)), 50) == 50
    assert harness.paired_ratio([2.0, 4.0, 9.0], [1.0, 1.0, 1.0]) == 4.0


def test_quick_deadline_run_separates_checked_stress_and_diagnosis_rows() -> None:
    proc = subprocess.run(
        # normal priority: the test suite never runs a real-time event loop on the machine
        [
            sys.executable,
            str(RUN),
            "--quick",
            "--only",
            "deadline",
            "--results",
            "-",
            "--normal-priority",
        ],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=ROOT,
    )
    assert "Traceback" not in proc.stderr, proc.stderr
    lines = proc.stdout.splitlines()

    def row(start: str) -> str:
        found = [line for line in lines if line.startswith(start)]
        assert len(found) == 1, (start, proc.stdout)
        return found[0]

    checked = row("1000 hung async calls: healthy p99 / unloaded, toolrelay / bare anyio")
    # one flood beside the same flood on bare anyio: judged on toolrelay's share of the
    # ratio, shown, not in force in a quick run
    assert "≤ 1.3×" in checked and "(not checked)" in checked
    assert "unloaded just before" in checked and "for a CPU" in checked
    assert "toolrelay " in checked and "bare anyio " in checked and "fail_after" in checked
    assert "launching took" in row("1000 hung async calls: p99 answer − deadline")
    stress = row("stress: 1000 hung async calls in one loop iteration: healthy p99")
    assert " info " in stress and "≤" not in stress
    assert "full collection(s)" in stress
    paused = row("1000 hung async calls, collector paused: healthy p99")
    assert " info " in paused
    # the spread flood really arrived over ~100 ms; the burst in one iteration
    spread_launch = float(
        row("1000 hung async calls: p99 answer − deadline").split("launching took ")[1].split()[0]
    )
    assert spread_launch >= 90
    assert "0 slots" in row("sync worker slots still held")
    assert " ok " in row("sync worker slots still held")  # in force in any run
    # the neighbour rows: reported, beside the same flood without toolrelay
    neighbours = [line for line in lines if "a CPU-bound neighbour" in line]
    assert neighbours and all(
        " info " in line and "without toolrelay" in line for line in neighbours
    )


def test_gateway_rows_hold_the_json_variant_to_its_targets(harness: ModuleType) -> None:
    """In a full run the ratios of toolrelay with JSON answers are in force, whichever
    side of the ratio toolrelay is on; those of the default (SSE) configuration are shown."""
    gateway = load_script(ROOT / "bench" / "gateway.py", "toolrelay_bench_gateway")
    sample = gateway.Sample([0.001] * 10, 1.0, 0.5, 100)
    slow = gateway.Sample([0.002] * 10, 2.0, 0.5, 100)
    servers = ["upstream", "upstream[json]", "toolrelay", "toolrelay-plugin"]
    servers += ["toolrelay[json]", "toolrelay-plugin[json]"]
    results = {(name, c): [sample] for name in servers for c in gateway.CONCURRENCY}
    results["toolrelay-plugin", 1] = [slow]  # misses, but it is the default configuration
    comparison = gateway.Comparison(servers, ["", "json"], results, dict.fromkeys(servers, 1.0))
    rows = {row.name: row for row in harness.gateway_rows(comparison, quick=False)}
    shown = rows["calls/s upstream[json] / toolrelay-plugin, 1 client(s)"]
    assert shown.passed is False and not shown.in_force and not shown.fails_check
    checked = rows["calls/s upstream[json] / toolrelay-plugin[json], 1 client(s)"]
    assert checked.in_force and checked.passed
    assert rows["p50 toolrelay-plugin[json] / upstream, 1 client(s)"].in_force
    assert rows["toolrelay[json], 8 clients"].unit == "calls/s"
    results["toolrelay-plugin[json]", 1] = [slow]
    rows = {row.name: row for row in harness.gateway_rows(comparison, quick=False)}
    assert rows["calls/s upstream[json] / toolrelay-plugin[json], 1 client(s)"].fails_check
    quick = {row.name: row for row in harness.gateway_rows(comparison, quick=True)}
    assert not quick["calls/s upstream[json] / toolrelay-plugin[json], 1 client(s)"].fails_check
