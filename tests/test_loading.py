"""Loading plugins: explicit module lists, named entry points, clear one-line failures."""

from __future__ import annotations

import functools
import sys
import textwrap
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest

from toolrelay import Dispatcher, ToolRegistry
from toolrelay.chaos.upstream import StandInUpstream
from toolrelay.loading import (
    ENTRY_POINT_GROUP,
    PluginLoadError,
    load_entry_points,
    load_plugins,
)

pytestmark = pytest.mark.anyio

FEEDS = {"feeds": {"news": "http://127.0.0.1:9/feeds/rss.xml"}}
SEARCH = {"base_url": "http://127.0.0.1:9"}


@pytest.fixture
def plugin_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A folder on sys.path for throwaway plugin modules (removed from sys.modules after)."""
    monkeypatch.syspath_prepend(str(tmp_path))
    before = set(sys.modules)
    yield tmp_path
    for name in set(sys.modules) - before:
        if name.startswith("tr_test_"):
            del sys.modules[name]


def write(folder: Path, name: str, source: str) -> str:
    (folder / f"{name}.py").write_text(textwrap.dedent(source))
    return name


GOOD = """
    from toolrelay.contract import ToolDeclaration

    class Plugin:
        def __init__(self, config):
            self.config = dict(config)

        def describe(self):
            return [ToolDeclaration("{tool}", "A test tool.", {{"type": "object"}})]

        async def execute(self, name, args, ctx):
            return self.config

    def register(registry, config):
        registry.register(Plugin(config))
"""


def test_load_an_explicit_list() -> None:
    registry = ToolRegistry()
    config: dict[str, Mapping[str, Any]] = {
        "toolrelay_plugins.weather": {"timeout_s": 4},
        "feeds": FEEDS,
    }
    loaded = load_plugins(
        registry, ["toolrelay_plugins.weather", "toolrelay_plugins.feeds"], config
    )
    assert loaded == ["toolrelay_plugins.weather", "toolrelay_plugins.feeds"]
    assert sorted(d.name for d in registry.declarations()) == [
        "feed_latest",
        "weather_current",
        "weather_forecast",
    ]
    tool = registry.resolve("weather_current")
    assert tool is not None and tool.decl.timeout_s == 4  # config by full module name


async def test_config_by_short_name_reaches_register(plugin_dir: Path) -> None:
    name = write(plugin_dir, "tr_test_echo", GOOD.format(tool="echo"))
    registry = ToolRegistry()
    load_plugins(registry, [name], {"tr_test_echo": {"greeting": "hi"}})
    result = await Dispatcher(registry).dispatch("echo", "{}")
    assert result.data == {"greeting": "hi"}


def test_unknown_module() -> None:
    with pytest.raises(PluginLoadError) as caught:
        load_plugins(ToolRegistry(), ["toolrelay_plugins.nope"])
    assert str(caught.value) == (
        "plugin 'toolrelay_plugins.nope' could not be imported: "
        "ModuleNotFoundError: No module named 'toolrelay_plugins.nope'"
    )
    assert isinstance(caught.value, RuntimeError)


def test_module_that_fails_to_import(plugin_dir: Path) -> None:
    name = write(plugin_dir, "tr_test_syntax", "def register(:\n")
    with pytest.raises(PluginLoadError, match=r"^plugin 'tr_test_syntax' could not be imported: "):
        load_plugins(ToolRegistry(), [name])


def test_register_that_raises_is_one_line_and_rolled_back(plugin_dir: Path) -> None:
    good = write(plugin_dir, "tr_test_good", GOOD.format(tool="good_tool"))
    bad = write(
        plugin_dir,
        "tr_test_bad",
        GOOD.format(tool="half_tool")
        + """
    def register(registry, config):
        registry.register(Plugin(config))
        raise RuntimeError("the licence server said no\\nTraceback: secret details")
    """,
    )
    registry = ToolRegistry()
    with pytest.raises(PluginLoadError) as caught:
        load_plugins(registry, [good, bad])
    message = str(caught.value)
    assert message == (
        "plugin 'tr_test_bad' could not be registered: RuntimeError: the licence server said no"
    )
    assert "\n" not in message
    assert list(registry.declarations()) == []  # all or nothing


def test_bad_plugin_config_is_a_load_error() -> None:
    with pytest.raises(PluginLoadError) as caught:
        load_plugins(ToolRegistry(), ["toolrelay_plugins.feeds"])
    assert str(caught.value) == (
        "plugin 'toolrelay_plugins.feeds' could not be registered: "
        "ValueError: feeds: 'feeds' must map at least one feed name to its URL"
    )


def test_module_without_register(plugin_dir: Path) -> None:
    name = write(plugin_dir, "tr_test_empty", "VALUE = 1\n")
    with pytest.raises(PluginLoadError, match="has no register"):
        load_plugins(ToolRegistry(), [name])


def test_one_string_is_not_a_list() -> None:
    with pytest.raises(TypeError, match="sequence"):
        load_plugins(ToolRegistry(), "toolrelay_plugins.weather")


# -- entry points ----------------------------------------------------------------------------
def test_entry_points_by_name_only() -> None:
    registry = ToolRegistry()
    loaded = load_entry_points(registry, ["weather", "websearch"], {"websearch": SEARCH})
    assert loaded == ["weather", "websearch"]
    names = {d.name for d in registry.declarations()}
    assert names == {"weather_current", "weather_forecast", "web_search"}
    assert "feed_latest" not in registry  # installed, but not asked for


def test_unknown_entry_point_lists_the_available_ones() -> None:
    registry = ToolRegistry()
    with pytest.raises(PluginLoadError) as caught:
        load_entry_points(registry, ["weather", "wether"])
    message = str(caught.value)
    assert message.startswith("no toolrelay plugin named 'wether' is installed; available: ")
    assert {"feeds", "weather", "websearch"} <= set(message.split(": ", 1)[1].split(", "))
    assert list(registry.declarations()) == []  # nothing was imported or registered


def test_entry_point_listed_twice() -> None:
    with pytest.raises(PluginLoadError, match="'weather' is listed twice"):
        load_entry_points(ToolRegistry(), ["weather", "weather"])


def test_entry_point_whose_register_fails_rolls_back() -> None:
    registry = ToolRegistry()
    with pytest.raises(PluginLoadError, match=r"^plugin 'feeds' could not be registered: "):
        load_entry_points(registry, ["weather", "feeds"], {"feeds": {"feeds": {}}})
    assert list(registry.declarations()) == []


def test_group_name() -> None:
    assert ENTRY_POINT_GROUP == "toolrelay.plugins"


async def test_entry_point_plugin_answers_through_the_dispatcher() -> None:
    async with StandInUpstream() as up:
        registry = ToolRegistry()
        config = {"weather": {"base_url": up.url, "geocoding_url": up.url}}
        load_entry_points(registry, ["weather"], config)
        tool = registry.resolve("weather_current")
        assert tool is not None and isinstance(tool.fn, functools.partial)
        plugin: Any = getattr(tool.fn.func, "__self__")  # noqa: B009 - no public way to list plugins
        try:
            result = await Dispatcher(registry).dispatch("weather_current", '{"city": "Oslo"}')
        finally:
            await plugin.aclose()
    assert result.ok and result.data["place"]["name"] == "Oslo"
