"""The hedging and retry-budget experiments in their short form, each side by side with the
capability off (``examples/experiments/hedging.py``, ``retry_budget.py``); both sides print."""

from __future__ import annotations

import io

import anyio
import pytest

from conftest import need_binary
from helpers import load_experiment as load
from toolrelay.demo import DemoOptions, run_demo
from toolrelay.demo_view import print_summary


def test_hedging_cuts_the_slow_tail(capsys: pytest.CaptureFixture[str]) -> None:
    report = load("hedging").main(["--calls", "300", "--concurrency", "10"])
    with capsys.disabled():
        print("\n" + capsys.readouterr().out)
    off, on = report["off"], report["on"]
    assert off["answers"] == on["answers"] == 300
    assert off["outcomes"] == on["outcomes"] == {"ok": 300}
    assert off["p99_s"] >= 1.9  # the tail is there without hedging
    assert report["p99_ratio"] >= 5, report
    assert report["extra_requests"] <= 0.10, report
    assert on["hedges"]["won"] > 0 and off["hedges"] == {"won": 0, "lost": 0, "skipped": 0}


@pytest.mark.servers
def test_a_shared_retry_budget_caps_an_outage(capsys: pytest.CaptureFixture[str]) -> None:
    need_binary("redis-server")
    report = load("retry_budget").main(["--seconds", "2", "--concurrency", "6"])
    with capsys.disabled():
        print("\n" + capsys.readouterr().out)
    off, on = report["off"], report["on"]
    assert off["lost"] == on["lost"] == 0 and on["calls"] > 100
    assert off["requests_per_call"] >= 2.9  # ≈ max_attempts without the budget
    assert on["requests_per_call"] <= 1.25, report


def test_the_demo_shows_hedging() -> None:
    options = DemoOptions(duration_s=10, seed=3, metrics_port=0, live=False)
    report = anyio.run(run_demo, options, io.StringIO())
    assert report.hedges["won"] >= 1, dict(report.hedges)
    assert report.to_json()["hedges"] == dict(report.hedges)
    out = io.StringIO()
    print_summary(report, out)
    assert f"hedging: {report.hedges['won']} slow feed calls answered by a hedge" in out.getvalue()
    feeds = report.outcomes["feed_latest"]
    assert feeds.get("ok", 0) == sum(feeds.values())  # the slow tail costs no answer
