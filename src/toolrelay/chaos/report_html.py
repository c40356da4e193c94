"""One self-contained HTML file for a chaos run (or two, side by side): ``--html report.html``.

The input is the ``--json`` report itself. Charts (described in docs/chaos.md) are
Vega-Lite specs rendered to SVG by ``vl-convert-python`` and inlined: no script, no font,
no request; the page's Content-Security-Policy forbids any.
"""

from __future__ import annotations

import html
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ..config import ConfigError

OUTCOME_COLOURS = {
    "ok": "#2e8b57",
    "timeout": "#e6850e",
    "circuit_open": "#d62728",
    "overloaded": "#9467bd",
    "tool_error": "#8c564b",
    "invalid_output": "#e377c2",
    "internal_error": "#17becf",
}
OTHER_COLOURS = ["#7f7f7f", "#bcbd22", "#1f77b4", "#ff7f0e", "#aec7e8"]
STATE_COLOURS = {"closed": "#a1d99b", "half_open": "#fdd49e", "open": "#fb6a4a"}
WIDTH = 760
STARTED = "call started (s)"
CSP = "default-src 'none'; style-src 'unsafe-inline'; img-src data:"
STYLE = """
body { font: 14px/1.4 system-ui, sans-serif; margin: 2em auto; max-width: 860px; color: #222; }
h1 { font-size: 1.5em; } h2 { font-size: 1.2em; margin-top: 2em; }
table { border-collapse: collapse; margin: .5em 0; }
th, td { border-bottom: 1px solid #ddd; padding: .25em .6em; text-align: left; }
td.num { text-align: right; font-variant-numeric: tabular-nums; }
.pass { color: #1a7f37; font-weight: bold; } .fail { color: #c62828; font-weight: bold; }
.note { color: #666; font-size: .9em; }
"""


def require_renderer() -> None:
    """Raise :class:`~toolrelay.config.ConfigError` (one line) when vl-convert is missing."""
    try:
        import vl_convert  # noqa: F401
    except ImportError:
        raise ConfigError(
            "--html needs vl-convert-python: pip install 'toolrelay[report]'"
        ) from None


def _svg(spec: dict[str, Any], prefix: str) -> str:
    import vl_convert

    svg: str = vl_convert.vegalite_to_svg(spec)
    # Every chart numbers its clip paths from 1: prefix them, or inline charts clash.
    svg = re.sub(r'id="([^"]+)"', lambda m: f'id="{prefix}-{m.group(1)}"', svg)
    return re.sub(r"url\(#([^)]+)\)", lambda m: f"url(#{prefix}-{m.group(1)})", svg)


def _colours(runs: Sequence[dict[str, Any]]) -> dict[str, Any]:
    seen = {p["outcome"] for run in runs for p in run["timeline"]["calls"]["points"]}
    seen |= {row["outcome"] for run in runs for row in run["timeline"]["answers_per_second"]}
    domain = [o for o in OUTCOME_COLOURS if o in seen] + sorted(seen - set(OUTCOME_COLOURS))
    others = iter(OTHER_COLOURS * (len(domain) // len(OTHER_COLOURS) + 1))
    return {"domain": domain, "range": [OUTCOME_COLOURS.get(o) or next(others) for o in domain]}


def _x(field: str, end: float, title: str | None = None) -> dict[str, Any]:
    return {
        "field": field,
        "type": "quantitative",
        "scale": {"domain": [0, end], "nice": False},
        "title": title,
    }


def _tool_rows(
    run: dict[str, Any], tool: str, end: float, colours: dict[str, Any], n: int
) -> list[dict[str, Any]]:
    """Run ``n``'s rows of the tool's chart (mark names end in ``_n``: unique per chart)."""
    timeline = run["timeline"]
    info = timeline["tools"].get(tool, {})
    points = [p for p in timeline["calls"]["points"] if p["tool"] == tool]
    key = info.get("breaker_key")
    windows = [
        w
        for w in timeline["fault_windows"]
        if w.get("tool", tool) == tool and w.get("breaker_key", key) == key
    ]
    layers: list[dict[str, Any]] = []
    if windows:
        layers.append(
            {
                "name": f"fault_window_{n}",
                "data": {"values": windows},
                "mark": {"type": "rect", "color": "#888", "opacity": 0.18},
                "encoding": {
                    "x": _x("from_s", end, STARTED),
                    "x2": {"field": "until_s"},
                    "tooltip": [{"field": "fault"}],
                },
            }
        )
    layers.append(
        {
            "name": f"calls_{n}",
            "data": {"values": points},
            "mark": {"type": "point", "filled": True, "size": 18, "opacity": 0.7},
            "encoding": {
                "x": _x("t_s", end, STARTED),
                "y": {"field": "latency_ms", "type": "quantitative", "title": "latency (ms)"},
                "color": {"field": "outcome", "type": "nominal", "scale": colours},
            },
        }
    )
    if info.get("deadline_s"):
        layers.append(
            {
                "name": f"deadline_{n}",
                "data": {"values": [{"deadline_ms": info["deadline_s"] * 1000}]},
                "mark": {"type": "rule", "color": "#444", "strokeDash": [6, 4]},
                "encoding": {"y": {"field": "deadline_ms", "type": "quantitative"}},
            }
        )
    label = run["name"] if "compared" in run else tool
    rows: list[dict[str, Any]] = [{"title": label, "height": 150, "width": WIDTH, "layer": layers}]
    bands = timeline["breaker_states"].get(key) if key else None
    if bands:
        rows.append(
            {
                "name": f"breaker_{n}",
                "height": 12,
                "width": WIDTH,
                "data": {"values": bands},
                "mark": "rect",
                "encoding": {
                    "x": _x("from_s", end),
                    "x2": {"field": "until_s"},
                    "y": {"datum": key, "type": "nominal", "axis": None},
                    "color": {
                        "field": "state",
                        "type": "nominal",
                        "title": "breaker",
                        "scale": {
                            "domain": list(STATE_COLOURS),
                            "range": list(STATE_COLOURS.values()),
                        },
                    },
                },
            }
        )
    return rows


def _rate_row(run: dict[str, Any], end: float, colours: dict[str, Any]) -> dict[str, Any]:
    return {
        "title": run["name"] if "compared" in run else "answers per second",
        "height": 110,
        "width": WIDTH,
        "data": {"values": run["timeline"]["answers_per_second"]},
        "transform": [{"calculate": "datum.second + 1", "as": "second_end"}],
        "mark": {"type": "rect", "stroke": "white", "strokeWidth": 0.5},
        "encoding": {
            "x": _x("second", end, "answered (s)"),
            "x2": {"field": "second_end"},
            "y": {"field": "answers", "type": "quantitative", "stack": True, "title": "answers"},
            "color": {"field": "outcome", "type": "nominal", "scale": colours},
        },
    }


def _chart(rows: list[dict[str, Any]]) -> dict[str, Any]:
    return {
        "vconcat": rows,
        "resolve": {"scale": {"color": "independent", "y": "independent"}},
        "config": {"font": "sans-serif", "view": {"stroke": "#ddd"}},
    }


def _fmt(value: Any, unit: str = "") -> str:
    if value is None:
        return "—"
    if unit == "ms":
        return f"{value * 1000:.0f} ms"
    if unit == "%":
        return f"{value * 100:.1f} %"
    return f"{value:g}"


def _headline_table(runs: Sequence[dict[str, Any]]) -> str:
    rows = []
    for run in runs:
        h = run["timeline"]["headline"]
        rows.append(
            f"<tr><td>{html.escape(run['name'])}</td><td class=num>{h['answers']}</td>"
            f"<td class=num>{_fmt(h['p99_latency_s'], 'ms')}</td>"
            f"<td class=num>{_fmt(h['upstream_requests_per_call'])}</td>"
            f"<td class=num>{_fmt(h['attempts_per_call'])}</td>"
            f"<td class=num>{_fmt(h['ok_ratio'], '%')}</td></tr>"
        )
    return (
        "<table class=headline><tr><th>run</th><th>answers</th><th>p99 latency</th>"
        "<th>upstream requests / call</th><th>attempts / call</th><th>ok</th></tr>"
        + "".join(rows)
        + "</table>"
    )


def _verdicts(run: dict[str, Any]) -> str:
    rows = "".join(
        f"<tr><td class={'pass' if v['ok'] else 'fail'}>{'PASS' if v['ok'] else 'FAIL'}</td>"
        f"<td>{html.escape(v['name'])}</td><td>{html.escape(v['figure'])}</td></tr>"
        for v in run["invariants"]
    )
    return (
        f"<table class=verdicts><tr><th></th><th>invariant</th><th>measured</th></tr>{rows}</table>"
    )


def render_html(reports: Sequence[dict[str, Any]]) -> str:
    """The HTML page of one run's JSON report, or of two runs side by side."""
    if not 1 <= len(reports) <= 2:
        raise ValueError("a report shows one run or two")
    runs = [dict(r, compared=True) if len(reports) > 1 else dict(r) for r in reports]
    for index, run in enumerate(runs):
        run.setdefault("name", f"run {index + 1}")
    end = max(run["timeline"]["end_s"] for run in runs)
    colours = _colours(runs)
    title = " vs ".join(run["name"] for run in runs)
    parts = [
        f"<h1>{html.escape(title)}</h1>",
        _headline_table(runs),
    ]
    for run in runs:
        calls = run["timeline"]["calls"]
        heading = f"Invariants — {run['name']}" if len(runs) > 1 else "Invariants"
        seed = f"seed {run['seed']}, " if "seed" in run else ""
        parts.append(
            f"<h2>{html.escape(heading)}</h2>"
            f"<p class=note>{seed}{run['duration_s']:g} s, {calls['answers']} answers"
            + (
                f"; the charts show {calls['shown']} (every failure, ok answers sampled)"
                if calls["shown"] < calls["answers"]
                else ""
            )
            + "</p>"
            + _verdicts(run)
        )
    parts.append("<h2>Answers per second</h2>")
    rate = _chart([_rate_row(run, end, colours) for run in runs])
    parts.append(f"<section class='chart rate'>{_svg(rate, 'rate')}</section>")
    tools = sorted({tool for run in runs for tool in run["timeline"]["tools"]})
    for index, tool in enumerate(tools):
        rows = [row for n, run in enumerate(runs) for row in _tool_rows(run, tool, end, colours, n)]
        key = next((r["timeline"]["tools"].get(tool, {}).get("breaker_key") for r in runs), None)
        parts.append(
            f"<h2>{html.escape(tool)}</h2><p class=note>breaker key {html.escape(str(key))}; "
            "shaded: faults in force on it (all, for faults on an upstream path); "
            "dashed: the deadline</p>"
            f"<section class='chart tool' data-tool='{html.escape(tool, quote=True)}'>"
            f"{_svg(_chart(rows), f't{index}')}</section>"
        )
    return (
        "<!doctype html><html lang=en><head><meta charset=utf-8>"
        f'<meta http-equiv="Content-Security-Policy" content="{CSP}">'
        f"<title>{html.escape(title)}</title><style>{STYLE}</style></head>"
        f"<body>{''.join(parts)}</body></html>\n"
    )


def write_html(reports: Sequence[dict[str, Any]], path: Path) -> None:
    path.write_text(render_html(reports), encoding="utf-8")
