"""``toolrelay chaos run EXPERIMENT.toml``: a workload, a fault schedule, invariant verdicts.

An experiment (:mod:`toolrelay.chaos.definition`) is played by the runner
(:mod:`toolrelay.chaos.runner`) and judged by its invariants
(:mod:`toolrelay.chaos.checks`). Each invariant is reported with its measured figure; the
exit status is 1 when one is violated.
"""

from __future__ import annotations

import json
import sys
from collections import Counter
from pathlib import Path
from typing import TextIO

import anyio

from .definition import EXPERIMENT_SCHEMA, Experiment
from .record import Check, Run, outcome
from .report_html import require_renderer, write_html
from .runner import play

__all__ = ["EXPERIMENT_SCHEMA", "Check", "Experiment", "Run", "main", "play", "print_report"]


def print_report(run: Run, out: TextIO | None = None) -> None:
    """Print the verdicts to ``out`` (``sys.stdout`` as it is when called)."""
    out = sys.stdout if out is None else out
    try:
        from rich.console import Console
        from rich.table import Table
    except ImportError:
        Console = None  # type: ignore[assignment,misc]
    title = f"{run.name} — {run.duration_s:g} s, seed {run.seed}, {run.record.calls} calls"
    if Console is not None and out.isatty():
        table = Table(title=title)
        for column in ("", "invariant", "measured"):
            table.add_column(column)
        for v in run.checks:
            table.add_row("[green]PASS[/]" if v.ok else "[bold red]FAIL[/]", v.name, v.figure)
        Console(file=out).print(table)
    else:
        print(title, file=out)
        for v in run.checks:
            print(f"  {v.line()}", file=out)
    outcomes = Counter(outcome(a[2]) for a in run.record.answers)
    print(f"outcomes: {', '.join(f'{k} {n}' for k, n in outcomes.most_common())}", file=out)
    print("all invariants hold" if run.ok else "an invariant was violated", file=out)


def main(
    path: Path,
    *,
    json_path: Path | None = None,
    seed: int | None = None,
    html_path: Path | None = None,
    compare: Path | None = None,
) -> int:
    """``toolrelay chaos run``: exit 0 when every invariant holds (in both runs), 1 otherwise.

    ``compare`` runs a second experiment after the first: the JSON report is then
    ``{"runs": [first, second], "ok": ...}`` and the HTML report shows both on one time axis.
    """
    experiments = [Experiment.load(p) for p in (path, compare) if p is not None]
    if html_path is not None:
        require_renderer()  # before the run, not after it
    reports = []
    for experiment in experiments:
        reports.append(anyio.run(play, experiment, seed))
        print_report(reports[-1])
    data = [report.to_json() for report in reports]
    if json_path is not None:
        document = data[0] if len(data) == 1 else {"runs": data, "ok": all(r.ok for r in reports)}
        json_path.write_text(json.dumps(document, indent=2) + "\n")
    if html_path is not None:
        write_html(data, html_path)
    return 0 if all(r.ok for r in reports) else 1
