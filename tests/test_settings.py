"""Settings as models: one-line errors from constructors and files, the generated schema,
and what changed between two settings values."""

from __future__ import annotations

import dataclasses
import inspect
import json
import math
import tomllib
from pathlib import Path
from typing import Any

import jsonschema_rs
import pytest

from toolrelay import (
    BreakerOptions,
    Fault,
    KeyPolicy,
    Profile,
    RetryOptions,
)
from toolrelay.cli import main
from toolrelay.config import CONFIG_SCHEMA, ConfigError, Settings, load_config, parse_config
from toolrelay.serve.settings import (
    ClientSettings,
    GatewaySettings,
    UpstreamSettings,
    parse_serve_section,
)
from toolrelay.settings import SettingsError

EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "toolrelay.toml"


# -- constructors ---------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("build", "message"),
    [
        (lambda: BreakerOptions(fail_max=0), "BreakerOptions.fail_max must be ≥ 1"),
        (lambda: BreakerOptions(fail_max=True), "BreakerOptions.fail_max must be a valid integer"),
        (
            lambda: BreakerOptions(slow_call_rate=1),
            "BreakerOptions.slow_call_rate needs slow_call_s",
        ),
        (
            lambda: BreakerOptions(reset_timeout_s=2, reset_timeout_max_s=1),
            "BreakerOptions.reset_timeout_max_s must be ≥ reset_timeout_s",
        ),
        (lambda: RetryOptions(backoff_max_s=math.inf), "RetryOptions.backoff_max_s must be a "),
        (lambda: BreakerOptions(colour="red"), "BreakerOptions.colour is not a setting"),
        (lambda: Fault(kind="hang"), "a fault targets exactly one of tool= or breaker_key="),
        (lambda: Fault(kind="hang", tool="t", rate=2), "fault rate must be less than or equal to"),
        (lambda: Fault(kind="boom", tool="t"), "fault kind must be one of 'latency', 'error'"),
        (lambda: Profile(allow="web_search"), "allow must be a valid frozenset, not a string"),
        (lambda: Profile(max_risk="extreme"), "max_risk must be one of 'read', 'write' or"),  # type: ignore[arg-type]
    ],
)  # fmt: skip
def test_constructors_raise_one_line_naming_the_setting(build: Any, message: str) -> None:
    with pytest.raises(SettingsError) as caught:
        build()
    assert isinstance(caught.value, ValueError)
    assert str(caught.value).startswith(message)
    assert "\n" not in str(caught.value) and "pydantic" not in str(caught.value)


def test_fault_output_is_bounded() -> None:
    deep: list[Any] = []
    for _ in range(70):
        deep = [deep]
    with pytest.raises(SettingsError, match=r"^fault output is nested deeper than 64 levels$"):
        Fault(kind="bad_output", tool="t", output=deep)
    with pytest.raises(ConfigError) as caught:
        parse_config({"faults": [{"kind": "bad_output", "tool": "t", "output": deep}]})
    assert str(caught.value) == "config: faults.0.output: is nested deeper than 64 levels"
    assert Fault(kind="bad_output", tool="t", output=[[1]]).output == [[1]]


def test_settings_are_frozen_hashable_values() -> None:
    config = BreakerOptions(fail_max=3)
    assert config == BreakerOptions(fail_max=3) and hash(config) == hash(BreakerOptions(fail_max=3))
    policy = KeyPolicy(breaker=config)
    assert policy == KeyPolicy(breaker=BreakerOptions(fail_max=3)) and hash(policy) == hash(
        KeyPolicy(breaker=BreakerOptions(fail_max=3))
    )
    with pytest.raises(dataclasses.FrozenInstanceError):
        config.fail_max = 4  # type: ignore[misc]
    assert dataclasses.replace(config, fail_max=4).fail_max == 4
    with pytest.raises(SettingsError, match=r"^BreakerOptions\.fail_max must be ≥ 1$"):
        dataclasses.replace(config, fail_max=0)  # replace() checks like the constructor
    profile = Profile(allow=["a", "b"], deny_tags=(tag for tag in ("x",)))
    assert profile == Profile(allow={"b", "a"}, deny_tags=["x"])
    assert profile.allow == frozenset({"a", "b"}) and profile.deny_tags == frozenset({"x"})
    assert hash(profile) == hash(Profile(allow=("a", "b"), deny_tags=("x",)))
    with pytest.raises(dataclasses.FrozenInstanceError):
        profile.max_risk = "read"  # type: ignore[misc]
    assert [f.name for f in dataclasses.fields(Profile)] == [
        *inspect.signature(Profile.__init__).parameters
    ][1:]


# -- files --------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("data", "expected"),
    [
        (
            {"keys": {"x": {"breaker": {"slow_call_rate": 0.5}}}},
            "config: keys.x.breaker.slow_call_rate: needs slow_call_s",
        ),
        (
            {"keys": {"x": {"bulkhead": {"adaptive_min": 5, "adaptive_max": 4}}}},
            "config: keys.x.bulkhead.adaptive_max: must be ≥ adaptive_min",
        ),
        (
            {"faults": [{"kind": "hang", "tool": "t"}, {"kind": "hang"}]},
            "config: faults.1: a fault targets exactly one of tool= or breaker_key=",
        ),
        (
            {"plugins": {"w": {"module": "a", "entry_point": "b"}}},
            "config: plugins.w: module and entry_point exclude each other",
        ),
    ],
)
def test_rules_beyond_the_schema_name_their_key_path(data: dict[str, Any], expected: str) -> None:
    with pytest.raises(ConfigError) as caught:
        parse_config(data)
    assert str(caught.value) == expected


def test_settings_mirror_the_file() -> None:
    settings = parse_config(
        {
            "plugins": {"feeds": {"enabled": False, "feeds": {"a": "https://x"}}},
            "tools": {"t": {"timeout_s": 2}},
            "keys": {"default": {"breaker": {"fail_max": 2}}, "k": {}},
            "dispatcher": {"secret_patterns": ["a", "b"]},
        }
    )
    assert settings.path is None and settings.default_key == KeyPolicy(
        breaker=BreakerOptions(fail_max=2)
    )
    assert settings.plugins["feeds"].settings == {"feeds": {"a": "https://x"}}
    assert settings.plugins["feeds"].enabled is False
    assert settings.tools["t"].model_dump(exclude_none=True) == {"timeout_s": 2.0}
    assert settings.dispatcher.secret_patterns == frozenset({"a", "b"})
    assert load_config(EXAMPLE).path == EXAMPLE


# -- the generated schema -------------------------------------------------------------------
def test_config_schema_prints_the_generated_schema(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["config", "schema"]) == 0
    printed = json.loads(capsys.readouterr().out)
    assert printed == CONFIG_SCHEMA
    assert printed["$schema"] == "https://json-schema.org/draft/2020-12/schema"
    validator = jsonschema_rs.validator_for(printed)
    assert validator.is_valid(tomllib.loads(EXAMPLE.read_text()))
    assert not validator.is_valid({"keys": {"k": {"breaker": {"fail_max": 0}}}})
    assert not validator.is_valid({"keys": {"k": {"breaker": {"colour": 1}}}})
    assert not validator.is_valid({"keys": {"k": {"colour": {}}}})
    assert not validator.is_valid({"profiles": {"p": {"max_risk": "extreme"}}})


def test_the_schema_is_the_models() -> None:
    breaker = CONFIG_SCHEMA["$defs"]["BreakerOptions"]
    assert set(breaker["properties"]) == {f.name for f in dataclasses.fields(BreakerOptions)}
    policy = CONFIG_SCHEMA["$defs"]["KeyPolicy"]
    assert set(policy["properties"]) == {f.name for f in dataclasses.fields(KeyPolicy)}
    assert breaker["additionalProperties"] is False
    assert breaker["properties"]["fail_max"] == {"default": 5, "minimum": 1, "type": "integer"}
    # "not set" is absent, never null: TOML has no null
    assert breaker["properties"]["slow_call_s"] == {"exclusiveMinimum": 0, "type": "number"}
    assert set(CONFIG_SCHEMA["properties"]) == set(GatewaySettings.model_fields)  # [serve] too
    assert "null" not in json.dumps(CONFIG_SCHEMA)


# -- comparing settings ---------------------------------------------------------------------
BASE: dict[str, Any] = {
    "keys": {"searxng": {"breaker": {"fail_max": 3}}, "open-meteo": {}},
    "profiles": {"support": {"allow": ["web_search"]}},
    "faults": [{"kind": "hang", "tool": "t"}],
    "telemetry": {"capture_content": False},
}


def _changed(**sections: Any) -> Settings:
    return parse_config({**BASE, **sections})


def test_equal_settings_have_no_difference() -> None:
    assert parse_config(BASE) == parse_config(json.loads(json.dumps(BASE)))
    assert parse_config(BASE).diff(parse_config(BASE)) == {}


def test_diff_names_each_changed_key() -> None:
    old = parse_config(BASE)
    new = _changed(
        keys={"searxng": {"breaker": {"fail_max": 5}}, "open-meteo": {}, "feeds": {}},
        profiles={},
        telemetry={"capture_content": True},
    )
    assert old != new
    assert old.diff(new) == {
        "keys.searxng.breaker.fail_max": (3, 5),
        "keys.feeds": (None, KeyPolicy()),
        "profiles.support": (Profile(allow=["web_search"]), None),
        "telemetry.capture_content": (False, True),
    }
    assert new.diff(old)["keys.feeds"] == (KeyPolicy(), None)


def test_diff_compares_lists_whole_and_sees_plugin_settings() -> None:
    old = _changed(plugins={"feeds": {"feeds": {"a": "https://x"}}})
    new = _changed(
        plugins={"feeds": {"feeds": {"a": "https://y"}}},
        faults=[{"kind": "hang", "tool": "u"}],
    )
    assert old.diff(new) == {
        "plugins.feeds.feeds.a": ("https://x", "https://y"),
        "faults": ((Fault(kind="hang", tool="t"),), (Fault(kind="hang", tool="u"),)),
    }


# -- the [serve] section --------------------------------------------------------------------
def test_serve_section_is_part_of_the_settings_and_the_schema() -> None:
    upstream = {"command": ["mcp-x"], "breaker_key": "x", "count_errors": "^down"}
    old = parse_config({"serve": {"http": {"port": 8001}, "upstreams": {"x": upstream}}})
    new = parse_config({"serve": {"http": {"port": 8002}, "upstreams": {"x": upstream}}})
    assert old.diff(new) == {"serve.http.port": (8001, 8002)}
    served = parse_serve_section(old.serve)
    assert served.http.port == 8001 and served.http.host == "127.0.0.1"  # unset: the defaults
    (built,) = served.upstreams.values()
    assert built.name == "x" and built.command == ("mcp-x",) and built.count_errors == "^down"
    assert CONFIG_SCHEMA["properties"]["serve"] == {"$ref": "#/$defs/ServeSection"}
    upstream_schema = CONFIG_SCHEMA["$defs"]["UpstreamSettings"]
    assert "name" not in upstream_schema["properties"]  # the table's name is not a key
    assert upstream_schema["required"] == ["breaker_key"]


@pytest.mark.parametrize(
    ("serve", "expected"),
    [
        ({"upstreams": {"u": {"breaker_key": "u"}}},
         "serve.upstreams.u: an upstream has exactly one of command and url"),
        ({"upstreams": {"u": {"url": "http://h", "breaker_key": "u", "count_errors": "("}}},
         "serve.upstreams.u.count_errors: not a valid regular expression"),
        ({"http": {"clients": {"bot": {"profile": "p"}}}},
         "serve.http.clients.bot: a client has exactly one of token_env and token"),
        ({"upstreams": {"u": {"url": "http://h", "breaker_key": "u", "name": "v"}}},
         "serve.upstreams.u: Additional properties are not allowed ('name'"),
    ],
)  # fmt: skip
def test_serve_rules_name_their_key_path(serve: dict[str, Any], expected: str) -> None:
    for parse in (lambda: parse_config({"serve": serve}), lambda: parse_serve_section(serve)):
        with pytest.raises(ConfigError) as caught:
            parse()
        assert str(caught.value).startswith(f"config: {expected}")


def test_command_line_overrides_land_in_their_tables_and_in_the_diff(tmp_path: Path) -> None:
    from toolrelay.serve.settings import load

    file = tmp_path / "toolrelay.toml"
    file.write_text('[serve]\nprofile = "p"\n[serve.http]\nport = 8001\n[profiles.p]\n')
    config, served = load(file, transport="http", port=9000, admin_port=9001, host=None)
    assert (served.transport, served.http.port, served.admin.port) == ("http", 9000, 9001)
    assert served.http.host == "127.0.0.1" and served.profile == "p"  # None: the file's
    assert config.serve == served and config.path == file
    as_written, _ = load(file)
    assert as_written.diff(config) == {
        "serve.transport": ("stdio", "http"),
        "serve.http.port": (8001, 9000),
        "serve.admin.port": (None, 9001),
    }


def test_serve_settings_built_in_code_are_checked() -> None:
    assert ClientSettings("bot", token="secret").name == "bot"
    with pytest.raises(SettingsError, match="exactly one of token_env and token"):
        ClientSettings("bot")
    with pytest.raises(SettingsError, match=r"^an upstream has exactly one of command and url$"):
        UpstreamSettings(name="u", breaker_key="u", command=("a",), url="http://h")


# -- deprecated keys ------------------------------------------------------------------------
def test_old_breaker_tables_still_work_with_a_warning_naming_the_new_key() -> None:
    old = {
        "breakers": {
            "default": {"fail_max": 2, "max_concurrent": 4},
            "searxng": {"max_attempts": 1, "hedge_after_s": 0.2, "retry_budget": 0.1},
        },
        "breaker_storage": {"url": "redis://localhost:6379/0", "sync_interval_s": 0.5},
    }
    with pytest.warns(DeprecationWarning, match="is deprecated; use") as caught:
        settings = parse_config(old)
    said = [str(w.message) for w in caught]
    assert "breakers.searxng.hedge_after_s is deprecated; use keys.searxng.hedge.after_s" in said
    assert (
        "breakers.default.max_concurrent is deprecated; use keys.default.bulkhead.max_concurrent"
        in said
    )
    assert "[breaker_storage] is deprecated; use [storage]" in said
    new = {
        "keys": {
            "default": {"breaker": {"fail_max": 2}, "bulkhead": {"max_concurrent": 4}},
            "searxng": {
                "retry": {"max_attempts": 1},
                "hedge": {"after_s": 0.2},
                "budget": {"share": 0.1},
            },
        },
        "storage": {"url": "redis://localhost:6379/0", "sync_interval_s": 0.5},
    }
    assert settings == parse_config(new)
    with (
        pytest.warns(DeprecationWarning, match="bulkhead_wait_s"),
        pytest.raises(ConfigError) as bad,
    ):
        parse_config({"breakers": {"x": {"bulkhead_wait_s": -1}}})
    assert "keys.x.bulkhead.wait_s" in str(bad.value)


# -- TOML dates -----------------------------------------------------------------------------
def test_toml_dates_are_read_as_their_iso_text(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """JSON has no dates: a TOML date or time is read as its ISO 8601 text, so an unquoted
    ``sunset`` works, and a date under an unknown key is the usual one-line error."""
    config = tmp_path / "toolrelay.toml"
    config.write_text(
        "[serve.catalog.deprecated.old]\n"
        "since = 2026-01-01\nsunset = 2027-01-01T12:00:00Z\nuse = 'new'\n"
    )
    settings = load_config(config)
    assert isinstance(settings, GatewaySettings)
    old = settings.serve.catalog.deprecated["old"]
    assert (old.since, old.sunset) == ("2026-01-01", "2027-01-01T12:00:00+00:00")
    assert main(["check", str(config)]) == 0
    for text in ("foo = 2026-01-01\n", "[keys.k]\nwhen = [1979-05-27T07:32:00]\n"):
        config.write_text(text)
        assert main(["check", str(config)]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and "Unsupported type" not in err, err
        assert "foo" in err or "keys.k" in err, err
