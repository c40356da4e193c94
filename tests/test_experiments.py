"""Chaos experiments: the examples pass, broken configurations fail the right invariant."""

from __future__ import annotations

import copy
import json
import subprocess
import sys
from pathlib import Path

import anyio
import pytest

from toolrelay.chaos.experiment import Experiment, ExperimentReport, run_experiment
from toolrelay.config import ConfigError

EXAMPLES = Path(__file__).resolve().parent.parent / "examples" / "experiments"


def run(experiment: Experiment) -> ExperimentReport:
    return anyio.run(run_experiment, experiment)


def verdict(report: ExperimentReport, prefix: str) -> tuple[bool, str]:
    (found,) = [v for v in report.verdicts if v.name.startswith(prefix)]
    return found.ok, found.figure


@pytest.mark.parametrize("name", ["error_burst", "slow_degradation"])
def test_example_experiment_passes(name: str) -> None:
    report = run(Experiment.load(EXAMPLES / f"{name}.toml"))
    assert report.ok, [(v.name, v.figure) for v in report.verdicts if not v.ok]
    assert report.calls == report.answers > 50
    assert len(report.verdicts) == 8  # 5 general + 3 for the breaker named


def test_dependency_hang_through_the_cli(tmp_path: Path) -> None:
    out = tmp_path / "report.json"
    result = subprocess.run(
        [sys.executable, "-m", "toolrelay", "chaos", "run",
         str(EXAMPLES / "dependency_hang.toml"), "--json", str(out)],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr
    report = json.loads(out.read_text())
    assert report["ok"] is True and report["outcomes"]["circuit_open"] > 0
    assert "PASS  searxng: breaker opened within fail_max failures" in result.stdout
    assert "all invariants hold" in result.stdout


def broken(change: str) -> Experiment:
    base = Experiment.load(EXAMPLES / "dependency_hang.toml")
    data = copy.deepcopy(base.data)
    data["duration_s"] = 6
    if change == "breaker disabled":
        data["config"]["breakers"]["searxng"]["fail_max"] = 1_000_000
    else:  # a huge timeout: the model slot's budget cuts calls, which never counts
        data["config"]["tools"]["web_search"]["timeout_s"] = 300
    return Experiment.parse(data)


@pytest.mark.parametrize("change", ["breaker disabled", "huge timeout"])
def test_broken_configuration_fails_the_matching_invariant(change: str) -> None:
    report = run(broken(change))
    assert not report.ok
    ok, figure = verdict(report, "searxng: breaker opened")
    assert not ok and figure.startswith("never opened")
    assert not verdict(report, "searxng: breaker closed after recovery")[0]
    assert verdict(report, "every call answered")[0]  # nothing else is blamed
    assert verdict(report, "every answer within its deadline")[0]


@pytest.mark.parametrize(
    ("data", "needle"),
    [
        ({"name": "x"}, "(top level): \"config\" is a required property"),
        ({"name": "x", "config": {}, "workload": {"calls": []}}, "workload.calls: []"),
        (
            {"name": "x", "config": {}, "workload": {"calls": [{"tool": "t"}]},
             "faults": [{"from_s": 1, "until_s": 2, "kind": "explode", "tool": "t"}]},
            "faults: fault kind must be one of",
        ),
    ],
)  # fmt: skip
def test_bad_experiments_are_refused(data: dict[str, object], needle: str) -> None:
    with pytest.raises(ConfigError) as caught:
        Experiment.parse(data)  # type: ignore[arg-type]
    assert needle in str(caught.value)
