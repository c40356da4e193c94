"""bench/frameworks.py: the side-by-side table in docs/integrations/*.md, checked.

Each framework's native tool and toolrelay's adapter meet a hung tool (async and sync), an
exception, invalid arguments and a service that stays down, in real agent runs with offline
scripted models. These tests hold the claims the docs' tables make (with a shorter deadline
and hang bound than the published run: 0.2 s and 1 s).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from helpers import load_script

pytestmark = [pytest.mark.anyio, pytest.mark.slow]

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"  # the three frameworks run on asyncio only


@pytest.fixture
def bench(monkeypatch: pytest.MonkeyPatch) -> Any:
    from agents import set_tracing_disabled

    set_tracing_disabled(True)
    module = load_script(ROOT / "bench" / "frameworks.py", "toolrelay_bench_frameworks")
    monkeypatch.setattr(module, "DEADLINE_S", 0.2)
    monkeypatch.setattr(module, "HANG_BOUND_S", 1.0)
    return module


def check_toolrelay(rows: dict[str, Any]) -> None:
    """toolrelay's column is the same in every framework: an envelope, at the deadline."""
    for hang in ("hang (async)", "hang (sync)"):
        cell = rows[hang][1]
        assert '"error_type":"timeout"' in cell.outcome.replace(" ", ""), cell
        assert cell.seconds < 0.2 + 0.5, cell
    assert '"error_type":"tool_error"' in rows["exception"][1].outcome.replace(" ", "")
    assert '"error_type":"validation_error"' in rows["invalid arguments"][1].outcome.replace(
        " ", ""
    )
    down = rows["service down"][1]
    assert '"error_type":"circuit_open"' in down.outcome.replace(" ", "") and down.hits == 2


async def test_openai_agents_native_and_toolrelay(bench: Any) -> None:
    rows = await bench.table("openai-agents")
    check_toolrelay(rows)
    native = {name: cells[0] for name, cells in rows.items()}
    assert "timed out after 0.2 seconds" in native["hang (async)"].outcome
    assert native["hang (sync)"].outcome.startswith("hangs")  # timeout= refused for sync tools
    generic = "An error occurred while running the tool. Please try again."
    for name in ("exception", "invalid arguments", "service down"):
        assert generic in native[name].outcome, native[name]
    assert native["service down"].hits == bench.DOWN_CALLS  # no breaker: every call reaches it


async def test_pydantic_ai_native_and_toolrelay(bench: Any) -> None:
    rows = await bench.table("pydantic-ai")
    check_toolrelay(rows)
    native = {name: cells[0] for name, cells in rows.items()}
    assert "Timed out after 0.2 seconds." in native["hang (async)"].outcome
    assert "Timed out after 0.2 seconds." in native["hang (sync)"].outcome
    assert native["exception"].outcome.startswith("run fails: ConnectionError")
    assert native["service down"].outcome.startswith("run fails: ConnectionError")
    assert "string_type" in native["invalid arguments"].outcome


async def test_langchain_native_and_toolrelay(bench: Any) -> None:
    rows = await bench.table("langchain")
    check_toolrelay(rows)
    native = {name: cells[0] for name, cells in rows.items()}
    assert native["hang (async)"].outcome.startswith("hangs")
    assert native["hang (sync)"].outcome.startswith("hangs")
    assert native["exception"].outcome.startswith("run fails: ConnectionError")
    assert native["service down"].outcome.startswith("run fails: ConnectionError")
    assert "Error invoking tool 'weather'" in native["invalid arguments"].outcome
