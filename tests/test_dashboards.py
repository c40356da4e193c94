"""The Grafana dashboard, the Prometheus alert rules and the metric contract agree.

The dashboard is linted against the conventions of ``docs/telemetry.md`` (variables,
``$job``/``$instance`` on every selector, ``rate(…[$__rate_interval])`` around every counter,
title/description/unit on every panel, only contract metrics and labels); the alert rules and
their unit tests run through ``promtool``; every PromQL expression we ship (dashboard, alerts,
runbook, recording-rule example) must parse.
"""

from __future__ import annotations

import json
import re
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import pytest
from prometheus_client import CollectorRegistry, generate_latest

from conftest import need_binary
from toolrelay import (
    BreakerOptions,
    BudgetOptions,
    BulkheadOptions,
    DispatcherOptions,
    HedgeOptions,
    KeyPolicy,
    RetryOptions,
)

ROOT = Path(__file__).resolve().parents[1]
DASHBOARD = ROOT / "dashboards" / "toolrelay.json"
ALERTS = ROOT / "dashboards" / "alerts.yml"
ALERT_TESTS = ROOT / "dashboards" / "alerts.test.yml"
RUNBOOK = ROOT / "docs" / "runbook.md"
TELEMETRY_DOC = ROOT / "docs" / "telemetry.md"

# -- the metric contract (docs/telemetry.md) ------------------------------------------------

OUTCOMES = frozenset(
    {
        "ok",
        "invalid_arguments",
        "unknown_tool",
        "tool_policy",
        "validation_error",
        "needs_approval",
        "denied",
        "circuit_open",
        "overloaded",
        "timeout",
        "tool_error",
        "invalid_output",
        "internal_error",
    }
)
STATES = frozenset({"closed", "open", "half_open"})
SCRAPE_LABELS = frozenset({"job", "instance"})
DURATION_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
OVERRUN_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0)
SLOT_BUCKETS = (0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 20.0, 30.0, 60.0, 120.0, 300.0)


@dataclass(frozen=True, slots=True)
class Metric:
    kind: Literal["counter", "gauge", "histogram"]
    labels: tuple[str, ...] = ()
    buckets: tuple[float, ...] = ()


CONTRACT: dict[str, Metric] = {
    "toolrelay_tool_calls_total": Metric("counter", ("tool", "outcome")),
    "toolrelay_tool_call_duration_seconds": Metric(
        "histogram", ("tool", "outcome"), DURATION_BUCKETS
    ),
    "toolrelay_tool_attempts_total": Metric("counter", ("tool", "result")),
    "toolrelay_tool_retries_total": Metric("counter", ("tool",)),
    "toolrelay_tool_inflight": Metric("gauge", ("tool",)),
    "toolrelay_breaker_state": Metric("gauge", ("breaker_key", "state")),
    "toolrelay_breaker_transitions_total": Metric(
        "counter", ("breaker_key", "from_state", "to_state")
    ),
    "toolrelay_breaker_rejected_total": Metric("counter", ("breaker_key",)),
    "toolrelay_bulkhead_rejected_total": Metric("counter", ("breaker_key",)),
    "toolrelay_abandoned_workers": Metric("gauge", ("breaker_key",)),
    "toolrelay_worker_processes_killed_total": Metric("counter", ("breaker_key",)),
    "toolrelay_loop_blocked_seconds_total": Metric("counter", ("tool",)),
    "toolrelay_deadline_overrun_seconds": Metric("histogram", (), OVERRUN_BUCKETS),
    "toolrelay_slot_hold_seconds": Metric("histogram", (), SLOT_BUCKETS),
    "toolrelay_slot_budget_seconds": Metric("gauge"),
    "toolrelay_faults_injected_total": Metric("counter", ("tool", "fault")),
    "toolrelay_fallbacks_total": Metric("counter", ("tool", "fallback", "result")),
    "toolrelay_breaker_storage_up": Metric("gauge"),
    "toolrelay_breaker_storage_rejected_total": Metric("counter", ("breaker_key", "field")),
    "toolrelay_hedges_total": Metric("counter", ("breaker_key", "hedge")),
    "toolrelay_retry_budget_exhausted_total": Metric("counter", ("breaker_key", "kind")),
    "toolrelay_concurrency_limit": Metric("gauge", ("breaker_key",)),
    "toolrelay_concurrency_in_flight": Metric("gauge", ("breaker_key",)),
    "toolrelay_concurrency_limit_min": Metric("gauge", ("breaker_key",)),
    # computed at scrape time from the breakers (rates: count and time windows only)
    "toolrelay_breaker_failure_rate": Metric("gauge", ("breaker_key",)),
    "toolrelay_breaker_slow_call_rate": Metric("gauge", ("breaker_key",)),
    "toolrelay_breaker_break_duration_seconds": Metric("gauge", ("breaker_key",)),
    "toolrelay_breaker_failure_rate_threshold": Metric("gauge", ("breaker_key",)),
    "toolrelay_breaker_slow_call_rate_threshold": Metric("gauge", ("breaker_key",)),
    "toolrelay_breaker_break_duration_max_seconds": Metric("gauge", ("breaker_key",)),
}

# The gateway's own metrics (toolrelay serve): alerts and the dashboard's "MCP gateway
# sessions" row use them; the dispatcher's exposition tests cover CONTRACT only.
GATEWAY_CONTRACT: dict[str, Metric] = {
    "toolrelay_mcp_sessions_open": Metric("gauge", ()),
    "toolrelay_mcp_sessions_refused_total": Metric("counter", ("reason",)),
    "toolrelay_mcp_sessions_reaped_total": Metric("counter", ()),
    "toolrelay_mcp_client_rejected_total": Metric("counter", ("client", "reason")),
    "toolrelay_mcp_client_inflight": Metric("gauge", ("client",)),
    "toolrelay_mcp_upstream_up": Metric("gauge", ("upstream",)),
    "toolrelay_mcp_upstream_connection_failures_total": Metric("counter", ("upstream",)),
    "toolrelay_mcp_upstream_new_tools_total": Metric("counter", ("upstream",)),
    "toolrelay_tool_drift_total": Metric("counter", ("tool", "kind")),
    "toolrelay_tool_descriptions_flagged_total": Metric("counter", ("tool", "rule")),
    "toolrelay_deprecated_calls_total": Metric("counter", ("tool", "caller")),
    "toolrelay_config_info": Metric("gauge", ("hash",)),
}

# Label values a selector may name, where the contract fixes them.
LABEL_VALUES: dict[str, frozenset[str]] = {
    "outcome": OUTCOMES,
    "result": OUTCOMES,
    "state": STATES,
    "from_state": STATES,
    "to_state": STATES,
    "reason": frozenset({"client_limit", "full", "rate", "concurrency"}),
    "hedge": frozenset({"won", "lost", "skipped"}),
    "kind": frozenset({"retry", "hedge"}),
}


@dataclass(frozen=True, slots=True)
class Series:
    """One series name as PromQL sees it (a histogram is three of them)."""

    metric: str
    labels: frozenset[str]
    monotonic: bool  # a counter, or a histogram's _bucket/_sum/_count


def series_names() -> dict[str, Series]:
    out: dict[str, Series] = {}
    for name, metric in {**CONTRACT, **GATEWAY_CONTRACT}.items():
        labels = frozenset(metric.labels) | SCRAPE_LABELS
        if metric.kind == "histogram":
            out[f"{name}_bucket"] = Series(name, labels | {"le"}, True)
            out[f"{name}_sum"] = Series(name, labels, True)
            out[f"{name}_count"] = Series(name, labels, True)
        else:
            out[name] = Series(name, labels, metric.kind == "counter")
    return out


SERIES = series_names()

# -- a small PromQL scanner -----------------------------------------------------------------

KEYWORDS = frozenset(
    {"and", "or", "unless", "bool", "offset", "by", "without", "on", "ignoring"}
    | {"group_left", "group_right", "inf", "nan", "atan2"}
)
GROUPING = re.compile(
    r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\(([^)]*)\)", re.IGNORECASE
)
SELECTOR = re.compile(
    r"(?<![\w.$:])(?P<name>[A-Za-z_:][\w:]*)\s*(?P<matchers>\{[^}]*\})?\s*(?P<range>\[[^\]]*\])?"
)
MATCHER = re.compile(r'(?P<label>[A-Za-z_]\w*)\s*(?P<op>=~|!~|!=|=)\s*"(?P<value>(?:[^"\\]|\\.)*)"')
RATED = re.compile(r"(?<![\w:])(?:rate|increase)\s*\(\s*$")
LEGEND_LABEL = re.compile(r"\{\{\s*(\w+)\s*\}\}")


@dataclass(frozen=True, slots=True)
class Selector:
    name: str
    matchers: list[tuple[str, str, str]]
    range: str | None
    rated: bool


def selectors(expr: str) -> tuple[list[Selector], set[str]]:
    """Metric selectors in ``expr``, and the labels named in by/on/… clauses."""
    grouping: set[str] = set()
    for clause in GROUPING.finditer(expr):
        grouping.update(label.strip() for label in clause.group(1).split(",") if label.strip())
    text = GROUPING.sub(lambda m: " " * len(m.group(0)), expr)
    found: list[Selector] = []
    for m in SELECTOR.finditer(text):
        name = m.group("name")
        after = text[m.end() :].lstrip()
        if m.group("matchers") is None and m.group("range") is None and after.startswith("("):
            continue  # a function or an aggregation
        if name.lower() in KEYWORDS:
            continue
        matchers = [
            (mm.group("label"), mm.group("op"), mm.group("value"))
            for mm in MATCHER.finditer(m.group("matchers") or "")
        ]
        rng = m.group("range")
        found.append(
            Selector(
                name,
                matchers,
                rng[1:-1].strip() if rng else None,
                RATED.search(text[: m.start()]) is not None,
            )
        )
    return found, grouping


def lint_expr(expr: str, *, dashboard: bool, legend: str = "") -> list[str]:
    """Problems with one PromQL expression (empty when it follows the conventions)."""
    problems: list[str] = []
    found, grouping = selectors(expr)
    if not found:
        problems.append("no metric selector")
    known_labels: set[str] = set()
    for sel in found:
        series = SERIES.get(sel.name)
        if series is None:
            problems.append(f"{sel.name}: not a metric of the contract")
            continue
        known_labels |= series.labels
        names = [label for label, _, _ in sel.matchers]
        for label, _op, value in sel.matchers:
            if label not in series.labels:
                problems.append(f"{sel.name}: has no label {label!r}")
            allowed = LABEL_VALUES.get(label)
            if allowed is not None and not value.startswith("$"):
                unknown = set(value.split("|")) - allowed
                if unknown:
                    problems.append(f"{sel.name}: {label} values {sorted(unknown)} do not exist")
        if dashboard:
            for label in ("job", "instance"):
                if (label, "=~", f"${label}") not in sel.matchers or names.count(label) != 1:
                    problems.append(f'{sel.name}: needs exactly {label}=~"${label}"')
            if series.monotonic:
                if not sel.rated or sel.range != "$__rate_interval":
                    problems.append(
                        f"{sel.name}: counters must be read as "
                        "rate(…[$__rate_interval]) or increase(…[$__rate_interval])"
                    )
            elif sel.range is not None or sel.rated:
                problems.append(f"{sel.name}: a gauge is not rated and takes no range")
        elif series.monotonic and not sel.rated and sel.range is None:
            problems.append(f"{sel.name}: a raw counter value means nothing; use rate/increase")
    for label in sorted(grouping - known_labels):
        problems.append(f"grouping by {label!r}, which no metric here has")
    for label in sorted(set(LEGEND_LABEL.findall(legend)) - known_labels):
        problems.append(f"legend uses {{{{{label}}}}}, which no metric here has")
    return problems


# -- reading the files ------------------------------------------------------------------------


def load_dashboard() -> dict[str, Any]:
    data: dict[str, Any] = json.loads(DASHBOARD.read_text(encoding="utf-8"))
    return data


def all_panels(dashboard: dict[str, Any]) -> Iterator[dict[str, Any]]:
    for panel in dashboard["panels"]:
        yield panel
        yield from panel.get("panels", [])  # collapsed rows keep their panels inside


def query_panels(dashboard: dict[str, Any]) -> list[dict[str, Any]]:
    return [p for p in all_panels(dashboard) if p.get("type") != "row"]


def dashboard_targets() -> list[tuple[str, dict[str, Any]]]:
    return [
        (str(panel["title"]), target)
        for panel in query_panels(load_dashboard())
        for target in panel.get("targets", [])
    ]


def grafana_to_promql(expr: str) -> str:
    out = (
        expr.replace("$__rate_interval", "1m")
        .replace("${job}", ".*")
        .replace("$job", ".*")
        .replace("${instance}", ".*")
        .replace("$instance", ".*")
    )
    assert "$" not in out, f"unsubstituted Grafana variable in {expr!r}"
    return out


@dataclass(frozen=True, slots=True)
class AlertRule:
    name: str
    text: str
    expr: str


def alert_rules() -> list[AlertRule]:
    """The alerting rules of alerts.yml (a line-based reader: the file's layout is fixed)."""
    text = ALERTS.read_text(encoding="utf-8")
    starts = [m.start() for m in re.finditer(r"^\s*- alert:", text, re.MULTILINE)]
    rules = []
    for start, end in zip(starts, [*starts[1:], len(text)], strict=True):
        block = text[start:end]
        name = re.search(r"- alert:\s*(\S+)", block)
        assert name is not None
        expr = re.search(r"^(\s*)expr: \|\n((?:\1\s+.*\n|\s*\n)+)", block, re.MULTILINE)
        assert expr is not None, f"{name.group(1)}: write expr as a `|` block"
        rules.append(AlertRule(name.group(1), block, expr.group(2)))
    return rules


def markdown_anchors(text: str) -> set[str]:
    """GitHub's heading anchors: lower case, punctuation dropped, spaces to hyphens."""
    anchors = set()
    for heading in re.findall(r"^#{1,6}\s+(.+?)\s*$", text, re.MULTILINE):
        slug = re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")
        anchors.add(slug)
    return anchors


def fenced(text: str, language: str) -> list[str]:
    return re.findall(rf"^```{language}\n(.*?)^```", text, re.MULTILINE | re.DOTALL)


def promtool(*args: str, stdin: bytes | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [need_binary("promtool"), *args],
        input=None if stdin is None else stdin.decode(),
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )


# -- the linter itself ------------------------------------------------------------------------

SEL = '{job=~"$job", instance=~"$instance"}'
GOOD = f"sum by (tool) (rate(toolrelay_tool_calls_total{SEL}[$__rate_interval]))"


@pytest.mark.parametrize(
    ("expr", "problem"),
    [
        ("sum(rate(toolrelay_tool_calls_total[5m]))", 'needs exactly job=~"$job"'),
        ("sum(rate(toolrelay_tool_calls_total[5m]))", "rate(…[$__rate_interval])"),
        (f"toolrelay_tool_calls_total{SEL}", "counters must"),
        (f"irate(toolrelay_tool_retries_total{SEL}[$__rate_interval])", "counters must"),
        (f"rate(toolrelay_nope_total{SEL}[$__rate_interval])", "not a metric of the contract"),
        (GOOD.replace("by (tool)", "by (breaker_key)"), "grouping by 'breaker_key'"),
        (GOOD.replace('"$job"', '"$job", outcome="oops"'), "values ['oops'] do not exist"),
        (GOOD.replace('"$job"', '"$job", state="open"'), "has no label 'state'"),
        ("sum(toolrelay_breaker_storage_up)", 'needs exactly instance=~"$instance"'),
        (f"rate(toolrelay_breaker_state{SEL}[$__rate_interval])", "a gauge is not rated"),
        (
            f"histogram_quantile(0.9, sum by (le) (toolrelay_slot_hold_seconds_bucket{SEL}))",
            "counters must",
        ),
    ],
)
def test_the_linter_catches(expr: str, problem: str) -> None:
    problems = lint_expr(expr, dashboard=True)
    assert any(problem in p for p in problems), problems


def test_the_linter_passes_a_good_expression() -> None:
    assert lint_expr(GOOD, dashboard=True, legend="{{tool}}") == []
    assert lint_expr(GOOD, dashboard=True, legend="{{breaker_key}}") != []


# -- the dashboard ----------------------------------------------------------------------------


def test_dashboard_identity_and_schema() -> None:
    dashboard = load_dashboard()
    assert dashboard["uid"] == "toolrelay-overview"
    assert dashboard["schemaVersion"] >= 39
    assert dashboard.get("id") is None  # importable into any Grafana
    assert dashboard["title"] and dashboard["description"]


def test_dashboard_variables() -> None:
    variables = {v["name"]: v for v in load_dashboard()["templating"]["list"]}
    source = variables["datasource"]
    assert (source["type"], source["query"]) == ("datasource", "prometheus")
    for name in ("job", "instance"):
        var = variables[name]
        assert var["type"] == "query"
        assert var["datasource"] == {"type": "prometheus", "uid": "${datasource}"}
        query = var["query"]["query"] if isinstance(var["query"], dict) else var["query"]
        match = re.fullmatch(r"label_values\((.+),\s*(\w+)\)", query)
        assert match is not None and match.group(2) == name, query
        assert var["definition"] == query
        assert var["includeAll"] and var["multi"] and var["allValue"] == ".*"
        if name == "instance":
            assert 'job=~"$job"' in match.group(1)


def test_every_panel_has_title_description_unit_and_datasource() -> None:
    for panel in query_panels(load_dashboard()):
        where = panel.get("title") or f"panel {panel.get('id')}"
        assert panel.get("title"), where
        assert panel.get("description", "").strip(), f"{where}: no description"
        unit = panel.get("fieldConfig", {}).get("defaults", {}).get("unit")
        assert isinstance(unit, str) and unit, f"{where}: no unit"
        assert panel.get("datasource") == {"type": "prometheus", "uid": "${datasource}"}, where
        targets = panel.get("targets")
        assert targets, f"{where}: no query"
        ref_ids = [t["refId"] for t in targets]
        assert len(ref_ids) == len(set(ref_ids)), f"{where}: duplicate refId"
        for target in targets:
            assert target.get("datasource") == panel["datasource"], where
            assert target.get("expr", "").strip(), where


def test_panels_are_grouped_in_rows_without_overlap() -> None:
    dashboard = load_dashboard()
    panels = dashboard["panels"]
    assert panels[0]["type"] == "row"
    rows = [p for p in panels if p["type"] == "row"]
    assert len(rows) >= 5
    assert all(row.get("title") for row in rows)
    ids = [p["id"] for p in all_panels(dashboard)]
    assert len(ids) == len(set(ids)), "panel ids must be unique"
    cells: dict[tuple[int, int], str] = {}
    for panel in panels:
        pos = panel["gridPos"]
        assert pos["x"] >= 0 and pos["x"] + pos["w"] <= 24, panel["title"]
        for x in range(pos["x"], pos["x"] + pos["w"]):
            for y in range(pos["y"], pos["y"] + pos["h"]):
                assert (x, y) not in cells, f"{panel['title']} overlaps {cells[(x, y)]}"
                cells[(x, y)] = panel["title"]


@pytest.mark.parametrize(
    ("title", "target"),
    [pytest.param(title, t, id=f"{title} {t['refId']}") for title, t in dashboard_targets()],
)
def test_dashboard_query_conventions(title: str, target: dict[str, Any]) -> None:
    problems = lint_expr(target["expr"], dashboard=True, legend=target.get("legendFormat", ""))
    assert problems == [], f"{title}: {problems}"


def test_dashboard_covers_the_contract() -> None:
    exprs = [target["expr"] for _, target in dashboard_targets()]
    used = {SERIES[s.name].metric for expr in exprs for s in selectors(expr)[0]}
    wanted = set(CONTRACT) | set(GATEWAY_CONTRACT)
    assert used == wanted, f"not on the dashboard: {sorted(wanted - used)}"
    for quantile in ("0.5", "0.95", "0.99"):
        assert any(
            e.startswith(f"histogram_quantile({quantile}, sum by (le, tool) (rate(")
            and "toolrelay_tool_call_duration_seconds_bucket" in e
            for e in exprs
        ), f"no p{quantile} latency per tool"
    timelines = [p for p in query_panels(load_dashboard()) if p["type"] == "state-timeline"]
    assert any("toolrelay_breaker_state" in t["expr"] for p in timelines for t in p["targets"])


@pytest.mark.parametrize(
    ("value", "limit", "unit"),
    [
        ("failure_rate", "failure_rate_threshold", "percentunit"),
        ("slow_call_rate", "slow_call_rate_threshold", "percentunit"),
        ("break_duration_seconds", "break_duration_max_seconds", "s"),
    ],
)
def test_breaker_gauges_are_drawn_against_their_limits(value: str, limit: str, unit: str) -> None:
    """Each breaker reading shares a panel with the setting it is compared with, drawn dashed."""
    value, limit = f"toolrelay_breaker_{value}", f"toolrelay_breaker_{limit}"
    for panel in query_panels(load_dashboard()):
        names = [{s.name for s in selectors(t["expr"])[0]} for t in panel["targets"]]
        if {value} in names and {limit} in names:
            break
    else:
        pytest.fail(f"no panel shows {value} with {limit}")
    assert panel["fieldConfig"]["defaults"]["unit"] == unit
    legend = next(t["legendFormat"] for t in panel["targets"] if limit in t["expr"])
    dashed = [
        o["matcher"]["options"]
        for o in panel["fieldConfig"]["overrides"]
        if any(p["id"] == "custom.lineStyle" for p in o["properties"])
    ]
    assert any(re.search(rx.strip("/"), legend) for rx in dashed), (legend, dashed)


# -- alert rules ------------------------------------------------------------------------------

REQUIRED_ALERTS = {
    "ToolrelayBreakerOpenTooLong",
    "ToolrelayHighTimeoutRatio",
    "ToolrelayAbandonedWorkersGrowing",
    "ToolrelaySlotHoldNearBudget",
    "ToolrelayErrorBudgetBurn",
    "ToolrelayBreakerStorageDown",
    "ToolrelayBreakerBreakAtMaximum",
    "ToolrelayMcpSessionsRefused",
    "ToolrelayToolDrift",
}

RUNBOOKS = {"docs/runbook.md": RUNBOOK}


@pytest.mark.servers
def test_promtool_check_rules() -> None:
    result = promtool("check", "rules", str(ALERTS))
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS" in result.stdout


@pytest.mark.servers
def test_promtool_test_rules() -> None:
    result = promtool("test", "rules", str(ALERT_TESTS))
    assert result.returncode == 0, result.stdout + result.stderr


def test_alerts_have_labels_annotations_and_runbook_sections() -> None:
    rules = alert_rules()
    assert {r.name for r in rules} >= REQUIRED_ALERTS
    anchors = {
        path: markdown_anchors(doc.read_text(encoding="utf-8")) for path, doc in RUNBOOKS.items()
    }
    for rule in rules:
        assert re.search(r"^\s*for:\s*\d+[smh]\s*$", rule.text, re.MULTILINE), rule.name
        severity = re.search(r"^\s*severity:\s*(\S+)\s*$", rule.text, re.MULTILINE)
        assert severity is not None and severity.group(1) in {"critical", "warning", "info"}
        for annotation in ("summary", "description"):
            assert re.search(rf"^\s*{annotation}:\s*\S", rule.text, re.MULTILINE), (
                f"{rule.name}: no {annotation}"
            )
        runbook = re.search(r"^\s*runbook_url:\s*(\S+)\s*$", rule.text, re.MULTILINE)
        assert runbook is not None, f"{rule.name}: no runbook_url"
        path, _, anchor = runbook.group(1).partition("#")
        assert path in RUNBOOKS, rule.name
        assert anchor == rule.name.lower() and anchor in anchors[path], f"{rule.name}: {anchor}"


def test_alert_expressions_use_contract_metrics() -> None:
    for rule in alert_rules():
        assert lint_expr(rule.expr, dashboard=False) == [], rule.name


def test_every_alert_has_a_firing_and_a_quiet_unit_test() -> None:
    text = ALERT_TESTS.read_text(encoding="utf-8")
    firing: set[str] = set()
    quiet: set[str] = set()
    for chunk in re.split(r"^\s*- eval_time:", text, flags=re.MULTILINE)[1:]:
        name = re.search(r"alertname:\s*(\S+)", chunk)
        assert name is not None
        expected = re.search(r"exp_alerts:(.*)", chunk)
        assert expected is not None
        (quiet if expected.group(1).strip() == "[]" else firing).add(name.group(1))
    names = {r.name for r in alert_rules()}
    assert names - firing == set(), "no firing test"
    assert names - quiet == set(), "no exp_alerts: [] test"


# -- every expression we ship parses ----------------------------------------------------------


@pytest.mark.servers
def test_all_expressions_parse(tmp_path: Path) -> None:
    exprs = [grafana_to_promql(target["expr"]) for _, target in dashboard_targets()]
    for var in load_dashboard()["templating"]["list"]:
        if var["type"] == "query":
            match = re.fullmatch(r"label_values\((.+),\s*\w+\)", var["definition"])
            assert match is not None
            exprs.append(grafana_to_promql(match.group(1)))
    exprs += [rule.expr for rule in alert_rules()]
    exprs += fenced(RUNBOOK.read_text(encoding="utf-8"), "promql")
    exprs += fenced(TELEMETRY_DOC.read_text(encoding="utf-8"), "promql")
    rules = [{"record": f"toolrelay_lint:expr_{i}", "expr": e} for i, e in enumerate(exprs)]
    path = tmp_path / "exprs.yml"
    path.write_text(json.dumps({"groups": [{"name": "lint", "rules": rules}]}))  # JSON is YAML
    result = promtool("check", "rules", str(path))
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"{len(exprs)} rules found" in result.stdout


@pytest.mark.servers
def test_recording_rule_example_in_the_docs_is_valid(tmp_path: Path) -> None:
    (example,) = fenced(TELEMETRY_DOC.read_text(encoding="utf-8"), "yaml")
    path = tmp_path / "recording.yml"
    path.write_text(example)
    result = promtool("check", "rules", str(path))
    assert result.returncode == 0, result.stdout + result.stderr


# -- the exposition ---------------------------------------------------------------------------


def sample_exposition() -> bytes:
    """The /metrics page of the library's own exporter after calls that touch every metric."""
    import threading

    import anyio

    import isolated_tools
    from helpers import wait_until
    from toolrelay import Dispatcher, Fault, ToolError, ToolRegistry

    registry = ToolRegistry()
    # isolation="process": a call warms the key's worker, the next is killed at its deadline
    for name, fn, timeout_s in (
        ("describe", isolated_tools.describe, 30),
        ("hung", isolated_tools.hang, 0.3),
    ):
        registry.tool(name=name, parameters={"type": "object"}, isolation="process",
                      breaker_key="isolated", timeout_s=timeout_s)(fn)  # fmt: skip
    release = threading.Event()

    @registry.tool(name="get_weather", parameters={"type": "object"}, breaker_key="open-meteo",
                   timeout_s=0.05)  # fmt: skip
    async def get_weather(args: dict[str, Any], ctx: Any) -> Any:
        if args.get("fail"):
            raise ToolError("upstream 503", retryable=True)
        if args.get("hang"):
            await anyio.sleep(1)
        return {"ok": True}

    # The deadline must leave the worker thread time to start on a loaded machine: a job
    # whose thread has not started at its deadline is skipped, not abandoned.
    @registry.tool(name="legacy", parameters={"type": "object"}, timeout_s=0.5)
    def legacy(args: dict[str, Any], ctx: Any) -> Any:
        release.wait(5)

    @registry.tool(name="search", parameters={"type": "object"}, breaker_key="search-api")
    async def search(args: dict[str, Any], ctx: Any) -> Any:
        if args.get("fail"):
            raise ToolError("upstream 503", retryable=True)
        return {"hits": []}

    @registry.tool(name="slow", parameters={"type": "object"}, breaker_key="hedged")
    async def slow(args: dict[str, Any], ctx: Any) -> Any:
        # answers once its hedge (due after 0.01 s) was skipped: there is no budget for it
        # (a fixed sleep could end first on a loaded machine, and no hedge would be due)
        skipped = {"breaker_key": "hedged", "hedge": "skipped"}
        await wait_until(lambda: bool(metrics.get_sample_value("toolrelay_hedges_total", skipped)))

    @registry.tool(name="adaptive", parameters={"type": "object"}, breaker_key="adaptive-svc")
    async def adaptive(args: dict[str, Any], ctx: Any) -> Any:
        await anyio.sleep(0.006)  # 10 answers outlast the first window (50 ms)

    @registry.tool(name="primary", parameters={"type": "object"}, breaker_key="primary-svc",
                   fallback=["backup"])  # fmt: skip
    async def primary(args: dict[str, Any], ctx: Any) -> Any:
        return "primary"  # never runs: its breaker is pinned open, so the fallback answers

    @registry.tool(name="backup", parameters={"type": "object"}, breaker_key="backup-svc")
    async def backup(args: dict[str, Any], ctx: Any) -> Any:
        return "backup"

    @registry.tool(name="stalls", parameters={"type": "object"})
    async def stalls(args: dict[str, Any], ctx: Any) -> Any:
        time.sleep(0.025)  # noqa: ASYNC251 - holds the loop: loop_blocked_seconds_total

    metrics = CollectorRegistry()
    dispatcher = Dispatcher(
        registry,
        DispatcherOptions(
            keys={
                "open-meteo": KeyPolicy(
                    breaker=BreakerOptions(fail_max=5),
                    retry=RetryOptions(max_attempts=2, backoff_initial_s=0.001),
                    bulkhead=BulkheadOptions(max_concurrent=1),
                ),
                "search-api": KeyPolicy(
                    breaker=BreakerOptions(
                        window="count",
                        window_size=10,
                        minimum_calls=5,
                        slow_call_s=1.0,
                        slow_call_rate=0.8,
                        reset_timeout_max_s=300,
                    ),
                    retry=RetryOptions(max_attempts=1),
                ),
                "hedged": KeyPolicy(
                    hedge=HedgeOptions(after_s=0.01), budget=BudgetOptions(share=0.5, min_per_s=0.0)
                ),
                "adaptive-svc": KeyPolicy(bulkhead=BulkheadOptions(max_concurrent="adaptive")),
            },
            faults=[Fault(kind="latency", tool="get_weather", latency_s=0.001)],
        ),
        metrics_registry=metrics,
    )

    async def calls() -> None:
        async with dispatcher.model_slot(5).hold() as slot:
            await dispatcher.dispatch("get_weather", "{}", slot=slot)
        await dispatcher.dispatch("get_weather", '{"hang": true}')
        await dispatcher.dispatch("nope", "{}")
        await dispatcher.dispatch("legacy", "{}")
        async with anyio.create_task_group() as tg:  # the second is shed by the bulkhead
            tg.start_soon(dispatcher.dispatch, "get_weather", '{"hang": true}')
            tg.start_soon(dispatcher.dispatch, "get_weather", '{"hang": true}')
        for _ in range(2):
            await dispatcher.dispatch("get_weather", '{"fail": true}')
        await dispatcher.dispatch("get_weather", "{}")  # rejected: the breaker is open
        await dispatcher.dispatch("search", '{"fail": true}')
        await dispatcher.dispatch("search", "{}")  # failure rate 0.5 (window not full)
        await dispatcher.dispatch("slow", "{}")  # its hedge skipped: the budget is spent
        for _ in range(10):  # the adaptive limit's first window ends
            await dispatcher.dispatch("adaptive", "{}")
        await dispatcher.dispatch("stalls", "{}")
        dispatcher.breakers.force_open("primary-svc")
        await dispatcher.dispatch("primary", "{}")  # served by its fallback
        await dispatcher.dispatch("describe", "{}")
        await dispatcher.dispatch("hung", "{}")  # its worker process killed
        assert dispatcher.telemetry is not None  # what a link refusing a value in Redis says
        dispatcher.telemetry.storage_rejected("open-meteo", "state")
        await dispatcher.aclose()  # and the warm one's

    anyio.run(calls)
    release.set()
    return generate_latest(metrics)


@pytest.mark.servers
def test_exposition_passes_promtool_check_metrics() -> None:
    exposition = sample_exposition()
    result = promtool("check", "metrics", stdin=exposition)
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.strip() == "" and result.stderr.strip() == ""


def test_exposition_matches_the_contract() -> None:
    text = sample_exposition().decode()
    families = dict(re.findall(r"^# TYPE (\S+) (\S+)$", text, re.MULTILINE))
    families = {name: kind for name, kind in families.items() if not name.endswith("_created")}
    assert families == {name: metric.kind for name, metric in CONTRACT.items()}
    for name, metric in CONTRACT.items():
        sample = re.search(rf"^{name}(?:_bucket)?(?:\{{([^}}]*)\}})? ", text, re.MULTILINE)
        assert sample is not None, name
        labels = set(re.findall(r"(\w+)=", sample.group(1) or "")) - {"le"}
        assert labels == set(metric.labels), name
        if metric.buckets:
            bounds = re.findall(rf'^{name}_bucket\{{.*le="([^"]+)"', text, re.MULTILINE)
            first = bounds[: bounds.index("+Inf") + 1]
            assert [float(b) for b in first] == [*metric.buckets, float("inf")], name


# Panels about one replica's own plumbing, drawn per instance; every other panel adds up
# (or takes the worst of) the selected instances of a fleet.
PER_REPLICA = frozenset(
    {
        "Abandoned workers",
        "Worker processes killed",
        "Event loop held by async handlers",
        "Breaker storage up",
        "Open MCP sessions",
        "Adaptive concurrency limit and calls in flight",
    }
)


def test_panels_aggregate_across_the_selected_instances() -> None:
    """A fleet's replicas are told apart by ``instance`` (the scrape's label): every query
    selects ``instance=~"$instance"`` and aggregates it away, except the per-replica panels."""
    for title, target in dashboard_targets():
        expr = target["expr"]
        assert 'instance=~"$instance"' in expr, title
        grouped = {
            label.strip() for by in re.findall(r"by \(([^)]*)\)", expr) for label in by.split(",")
        }
        assert ("instance" in grouped) == (title in PER_REPLICA), title
