"""A plugin's optional capabilities are explicit protocols (``toolrelay.capabilities``),
recognised with ``isinstance`` and read once, when the plugin is registered."""

from __future__ import annotations

from typing import Any

import pytest

from toolrelay import (
    AuthContext,
    Dispatcher,
    DispatcherOptions,
    ToolRegistry,
)
from toolrelay.capabilities import Closeable, DeclaresOne, HasHandler, ProcessIsolatable
from toolrelay.contract import ToolDeclaration

pytestmark = pytest.mark.anyio

DECL = ToolDeclaration("echo", "Echo.")


class Plain:
    """Only the contract: describe() and execute()."""

    def __init__(self) -> None:
        self.scans = 0

    def describe(self) -> list[ToolDeclaration]:
        self.scans += 1
        return [DECL]

    def execute(self, name: str, args: dict[str, Any], ctx: AuthContext) -> str:
        return "execute"


class Capable(Plain):
    def __init__(self) -> None:
        super().__init__()
        self.closed = 0

    def declaration(self, name: str) -> ToolDeclaration | None:
        return DECL if name == "echo" else None

    def handler(self, name: str) -> Any:
        return lambda args, ctx: "handler"

    async def aclose(self) -> None:
        self.closed += 1


class Disabled(Plain):
    """A capability set to ``None`` is not offered."""

    declaration = None
    aclose = None


def test_the_protocols_recognise_what_a_plugin_offers() -> None:
    plain, capable, disabled = Plain(), Capable(), Disabled()
    assert not isinstance(plain, DeclaresOne | HasHandler | ProcessIsolatable | Closeable)
    assert isinstance(capable, DeclaresOne) and isinstance(capable, HasHandler)
    assert isinstance(capable, Closeable) and not isinstance(capable, ProcessIsolatable)
    assert not isinstance(disabled, DeclaresOne) and not isinstance(disabled, Closeable)


def test_the_function_plugin_offers_declaration_handler_and_process_target() -> None:
    registry = ToolRegistry()

    @registry.tool()
    def hello(name: str) -> str:
        return name

    (functions,) = registry.plugins()
    assert isinstance(functions, DeclaresOne)
    assert isinstance(functions, HasHandler) and isinstance(functions, ProcessIsolatable)


async def test_lookups_use_declaration_and_handler_when_offered() -> None:
    plain, capable = Plain(), Capable()
    for plugin, answer in ((plain, "execute"), (capable, "handler")):
        registry = ToolRegistry()
        registry.register(plugin)
        scans = plugin.scans
        async with Dispatcher(registry, DispatcherOptions(telemetry=False)) as dispatcher:
            result = await dispatcher.dispatch("echo", {})
        assert result.ok and result.data == answer
        # a plugin without declaration() is scanned on each lookup; one with it is not
        assert (plugin.scans > scans) is (plugin is plain)
    assert capable.closed == 1  # Dispatcher.aclose() closed the Closeable plugin
