"""``toolrelay diff``: each schema change classified breaking or compatible by the rules in
``docs/catalog.md`` (a table of cases), and the exit status CI reads."""

from __future__ import annotations

import copy
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from toolrelay.catalog import diff_entries, diff_locks, dumps, entry, lock_of
from toolrelay.cli import main
from toolrelay.contract import ToolDeclaration

BASE = ToolDeclaration(
    name="search",
    description="Searches the web.",
    parameters={
        "type": "object",
        "properties": {
            "query": {"type": "string", "maxLength": 200, "description": "What to look for."},
            "limit": {"type": "integer", "minimum": 1, "maximum": 50},
            "lang": {"type": "string", "enum": ["en", "de"]},
            "tags": {"type": "array", "items": {"type": "string"}},
            "filters": {
                "type": "object",
                "properties": {"site": {"type": "string"}},
                "additionalProperties": True,
            },
        },
        "required": ["query"],
        "additionalProperties": False,
    },
    output_schema={
        "type": "object",
        "properties": {
            "hits": {"type": "array", "items": {"type": "string"}},
            "total": {"type": "integer"},
            "kind": {"enum": ["web", "news"]},
        },
        "required": ["hits", "total"],
    },
    risk="read",
)

Edit = Callable[[dict[str, Any]], None]


def _in(d: dict[str, Any]) -> dict[str, Any]:
    return d["definition"]["inputSchema"]  # type: ignore[no-any-return]


def _out(d: dict[str, Any]) -> dict[str, Any]:
    return d["definition"]["outputSchema"]  # type: ignore[no-any-return]


def _p(d: dict[str, Any]) -> dict[str, Any]:
    return _in(d)["properties"]  # type: ignore[no-any-return]


def _set(d: dict[str, Any], **fields: Any) -> None:
    d.update(fields)


# (case, edit, breaking?, a phrase of the change)
CASES: list[tuple[str, Edit, bool, str]] = [
    ("required parameter added",
     lambda d: (_p(d).update(page={"type": "integer"}), _in(d)["required"].append("page")),
     True, "required parameter added"),
    ("optional parameter added", lambda d: _p(d).update(page={"type": "integer"}),
     False, "optional parameter added"),
    ("parameter removed", lambda d: _p(d).pop("lang"), True, "parameter removed"),
    ("parameter renamed", lambda d: _p(d).update(q=_p(d).pop("query")), True, "removed"),
    ("parameter became required", lambda d: _in(d)["required"].append("limit"),
     True, "became required"),
    ("parameter no longer required", lambda d: _in(d)["required"].remove("query"),
     False, "no longer required"),
    ("type narrowed", lambda d: _p(d)["limit"].update(type="string"), True, "type narrowed"),
    ("type widened to a list", lambda d: _p(d)["limit"].update(type=["integer", "null"]),
     False, "type widened"),
    ("integer widened to number", lambda d: _p(d)["limit"].update(type="number"),
     False, "type widened"),
    ("const added", lambda d: _p(d)["lang"].update(const="en"), True, "const"),
    ("format added", lambda d: _p(d)["query"].update(format="uri"), True, "format"),
    ("type added where any was allowed", lambda d: _p(d)["filters"]["properties"]["site"]
     .update(type="integer"), True, "type narrowed"),
    ("enum value removed", lambda d: _p(d)["lang"].update(enum=["en"]), True, "'de' removed"),
    ("enum value added", lambda d: _p(d)["lang"].update(enum=["en", "de", "fr"]),
     False, "'fr' added"),
    ("enum added", lambda d: _p(d)["query"].update(enum=["a", "b"]), True, "enum added"),
    ("enum dropped", lambda d: _p(d)["lang"].pop("enum"), False, "enum removed"),
    ("additionalProperties closed",
     lambda d: _p(d)["filters"].update(additionalProperties=False), True, "closed"),
    ("additionalProperties opened", lambda d: _in(d).update(additionalProperties=True),
     False, "opened"),
    ("maxLength lowered", lambda d: _p(d)["query"].update(maxLength=100), True, "maxLength"),
    ("maxLength raised", lambda d: _p(d)["query"].update(maxLength=400), False, "maxLength"),
    ("maximum lowered", lambda d: _p(d)["limit"].update(maximum=10), True, "maximum"),
    ("minimum raised", lambda d: _p(d)["limit"].update(minimum=5), True, "minimum"),
    ("minimum dropped", lambda d: _p(d)["limit"].pop("minimum"), False, "minimum"),
    ("pattern added", lambda d: _p(d)["query"].update(pattern="^[a-z]+$"), True, "pattern"),
    ("array items narrowed", lambda d: _p(d)["tags"]["items"].update(type="integer"),
     True, "tags[]"),
    ("nested property removed", lambda d: _p(d)["filters"]["properties"].pop("site"),
     True, "filters.properties.site"),
    ("parameter description changed",
     lambda d: _p(d)["query"].update(description="Words."), False, "description"),
    ("tool description changed",
     lambda d: d["definition"].update(description="Finds pages."), False, "description"),
    ("unknown keyword changed", lambda d: _p(d)["query"].update(contentEncoding="base64"),
     True, "no rule"),
    ("risk raised", lambda d: _set(d, risk="write"), True, "read → write"),
    ("extra properties given a schema",
     lambda d: _p(d)["filters"].update(additionalProperties={"type": "string"}),
     True, "filters.additionalProperties"),
    ("version changed", lambda d: _set(d, version="2"), False, "version"),
    ("output field removed", lambda d: _out(d)["properties"].pop("total"),
     True, "output field removed"),
    ("output field added", lambda d: _out(d)["properties"].update(page={"type": "integer"}),
     False, "output field added"),
    ("output field no longer required", lambda d: _out(d)["required"].remove("total"),
     True, "no longer required"),
    ("output type widened", lambda d: _out(d)["properties"]["total"].update(type="number"),
     True, "type widened"),
    ("output enum value added", lambda d: _out(d)["properties"]["kind"].update(
        enum=["web", "news", "image"]), True, "added"),
    ("output enum value removed", lambda d: _out(d)["properties"]["kind"].update(
        enum=["web"]), False, "removed"),
    ("output schema removed", lambda d: d["definition"].pop("outputSchema"), True, "removed"),
    ("idempotency hint changed",
     lambda d: d["definition"]["annotations"].update(idempotentHint=False), False, "idempotent"),
]  # fmt: skip


@pytest.mark.parametrize(("case", "edit", "breaking", "phrase"), CASES, ids=[c[0] for c in CASES])
def test_each_change_is_classified(case: str, edit: Edit, breaking: bool, phrase: str) -> None:
    old = entry(BASE)
    new = copy.deepcopy(old)
    edit(new)
    changes = diff_entries("search", old, new)
    assert changes, case
    assert any(c.breaking for c in changes) is breaking, [c.line() for c in changes]
    assert any(phrase in c.line() for c in changes), [c.line() for c in changes]


def test_the_table_is_at_least_thirty_cases() -> None:
    assert len(CASES) >= 30
    lowered = diff_entries("search", {**entry(BASE), "risk": "write"}, entry(BASE))
    assert [(c.what, c.breaking) for c in lowered] == [("write → read", False)]


def test_tools_removed_and_added() -> None:
    old = lock_of([BASE])["tools"]
    other = ToolDeclaration(name="fetch", description="Fetches a page.")
    changes = diff_locks(old, lock_of([other])["tools"])
    assert [(c.tool, c.what, c.breaking) for c in changes] == [
        ("fetch", "tool added", False),
        ("search", "tool removed", True),
    ]
    assert diff_locks(old, old) == []


def test_the_command_exits_1_on_breaking_changes(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    old, new, same = tmp_path / "old.lock", tmp_path / "new.lock", tmp_path / "same.lock"
    lock = lock_of([BASE])
    old.write_text(dumps(lock))
    same.write_text(dumps(lock))
    changed = json.loads(dumps(lock))
    changed["tools"]["search"]["definition"]["description"] = "Finds pages."
    new.write_text(dumps(changed))
    assert main(["diff", str(old), str(same)]) == 0
    assert main(["diff", str(old), str(new)]) == 0  # description only: compatible
    _p(changed["tools"]["search"]).pop("lang")
    new.write_text(dumps(changed))
    assert main(["diff", str(old), str(new)]) == 1
    out = capsys.readouterr().out
    assert "BREAKING   search: inputSchema.properties.lang: parameter removed (or renamed)" in out
    assert out.rstrip().endswith("2 changes, 1 breaking")
    new.write_text("[1, 2]")
    assert main(["diff", str(old), str(new)]) == 2
    assert "is not a toolrelay lock file" in capsys.readouterr().err


def test_a_lock_against_a_live_config(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    config = tmp_path / "toolrelay.toml"
    config.write_text("[plugins.weather]\n")
    assert main(["lock", "--config", str(config)]) == 0  # toolrelay.lock beside it
    locked = tmp_path / "toolrelay.lock"
    assert main(["diff", str(locked), str(config)]) == 0
    assert capsys.readouterr().out.rstrip().endswith("0 changes, 0 breaking")
    lock = json.loads(locked.read_text())
    lock["tools"]["search"] = entry(BASE)  # locked once, offered no more
    locked.write_text(dumps(lock))
    assert main(["diff", str(locked), str(config)]) == 1
    assert "BREAKING   search: tool removed" in capsys.readouterr().out
