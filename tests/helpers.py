"""Small plugins and helpers shared by the tests (real code, no mocks)."""

from __future__ import annotations

import importlib.util
from collections.abc import Callable, Sequence
from pathlib import Path
from types import ModuleType
from typing import Any

from toolrelay import AuthContext, ToolDeclaration

OBJ = {"type": "object", "properties": {}, "additionalProperties": False}
CITY = {
    "type": "object",
    "properties": {"city": {"type": "string", "minLength": 1, "maxLength": 40}},
    "required": ["city"],
    "additionalProperties": False,
}


class MutablePlugin:
    """A plugin whose declarations an operator can change at run time."""

    def __init__(self, decls: Sequence[ToolDeclaration]) -> None:
        self.decls = list(decls)
        self.calls: list[tuple[str, dict[str, Any], AuthContext]] = []

    def describe(self) -> list[ToolDeclaration]:
        return list(self.decls)

    async def execute(self, name: str, args: dict[str, Any], ctx: AuthContext) -> Any:
        self.calls.append((name, args, ctx))
        return {"tool": name, "args": args}


class SyncPlugin(MutablePlugin):
    def execute(self, name: str, args: dict[str, Any], ctx: AuthContext) -> Any:  # type: ignore[override]
        self.calls.append((name, args, ctx))
        return {"tool": name, "sync": True}


async def wait_until(predicate: Callable[[], bool], limit_s: float = 5.0) -> None:
    """Poll until ``predicate()`` holds (state changed by other tasks or threads)."""
    import anyio

    with anyio.fail_after(limit_s):
        while not predicate():  # noqa: ASYNC110
            await anyio.sleep(0.005)


EXPERIMENTS = Path(__file__).resolve().parent.parent / "examples" / "experiments"


def load_experiment(name: str) -> ModuleType:
    """``examples/experiments/NAME.py`` as a module (the scripts are not a package)."""
    spec = importlib.util.spec_from_file_location(f"experiment_{name}", EXPERIMENTS / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
