"""The hedging and retry-budget experiments in their short form, each side by side with the
capability off (``examples/experiments/hedging.py``, ``retry_budget.py``); both sides print.

The demo's hedging (a hedge answers the slow feed, no answer lost) is checked on the one
demo run of test_cli.py::test_short_demo_report."""

from __future__ import annotations

import pytest

from conftest import need_binary
from helpers import load_experiment as load


@pytest.mark.serial  # a p99 ratio
def test_hedging_cuts_the_slow_tail(capsys: pytest.CaptureFixture[str]) -> None:
    # 200 calls, ~10 of them in the 2 s tail: the p99 is the third slowest (300 took 2 s more)
    report = load("hedging").main(["--calls", "200", "--concurrency", "10"])
    with capsys.disabled():
        print("\n" + capsys.readouterr().out)
    off, on = report["off"], report["on"]
    assert off["answers"] == on["answers"] == 200
    assert off["outcomes"] == on["outcomes"] == {"ok": 200}
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
