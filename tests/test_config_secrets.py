"""No settings error quotes a value: a malformed token, header, env value or credentialed URL
is named by its key path, never shown, in ``toolrelay check``, the reload refusal's log line
and the admin API's 422 (all three print one :class:`~toolrelay.config.ConfigError`).

Every key path of the config's JSON Schema gets every hostile value in turn (a string, a
number, a list and a table carrying a canary), and the canary is looked for in the error.
"""

from __future__ import annotations

import secrets
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from test_serve_mcp import TOKEN, start_http_server, stop_http_server
from toolrelay.chaos.upstream import StandInUpstream
from toolrelay.cli import main
from toolrelay.config import CONFIG_SCHEMA, ConfigError, parse_config
from toolrelay.options import StorageOptions
from toolrelay.serve.settings import AdminSection, ClientSettings, UpstreamSettings
from toolrelay.settings import SettingsError

CANARY = f"S3cr3t{secrets.token_hex(8)}"
NUMBER = 9_000_000_000 + secrets.randbelow(10**9)  # a secret that is all digits
HOSTILE: tuple[Any, ...] = (
    f"htps://svc:{CANARY}@docs.internal/mcp",  # a bad URL, a bad name, a bad enum value, …
    f"Bearer {CANARY}",
    "x" * 300 + CANARY,  # too long for any bounded string
    NUMBER,
    -NUMBER,
    [CANARY],
    {"Authorization": f"Bearer {CANARY}"},
    [{"k": CANARY}],
)


def _resolve(schema: dict[str, Any]) -> dict[str, Any]:
    while "$ref" in schema:
        schema = CONFIG_SCHEMA["$defs"][schema["$ref"].rsplit("/", 1)[1]]
    return schema


def key_paths(
    schema: dict[str, Any], path: tuple[str | int, ...] = ()
) -> Iterator[tuple[Any, ...]]:
    """Every place of the config a value can be written (a table's entries named ``x``)."""
    schema = _resolve(schema)
    if path:
        yield path
    for branch in (*schema.get("anyOf", ()), *schema.get("oneOf", ())):
        yield from key_paths(branch, path)
    for key, sub in schema.get("properties", {}).items():
        yield from key_paths(sub, (*path, key))
    extra = schema.get("additionalProperties")
    if isinstance(extra, dict):
        yield from key_paths(extra, (*path, "x"))
    items = schema.get("items")
    if isinstance(items, dict):
        yield from key_paths(items, (*path, 0))


def placed(path: tuple[Any, ...], value: Any) -> dict[str, Any]:
    """A config with ``value`` at ``path`` (an integer step is a list's first item)."""
    for step in reversed(path):
        value = [value] if isinstance(step, int) else {step: value}
    assert isinstance(value, dict)
    return value


PATHS = sorted(set(key_paths(CONFIG_SCHEMA)), key=str)


def test_every_key_path_is_tried() -> None:
    dotted = {".".join(map(str, path)) for path in PATHS}
    assert {
        "serve.upstreams.x.url",
        "serve.upstreams.x.headers.x",
        "serve.upstreams.x.env.x",
        "serve.upstreams.x.command",
        "serve.upstreams.x.bearer_token_env",
        "serve.http.clients.x.token",
        "serve.http.clients.x.token_env",
        "serve.admin.token",
        "storage.url",
        "telemetry.otlp_endpoint",
        "faults.0.message",
    } <= dotted
    assert len(PATHS) > 150


def test_no_config_error_quotes_a_value() -> None:
    refused = 0
    for path in PATHS:
        for value in HOSTILE:
            try:
                parse_config(placed(path, value))
            except ConfigError as exc:
                message = str(exc)
                refused += 1
            else:
                continue
            assert CANARY not in message and str(NUMBER) not in message, message
            assert "\n" not in message and f": {path[0]}" in message, message
    assert refused > 5 * len(PATHS)


@pytest.mark.parametrize(
    "build",
    [
        lambda: ClientSettings(token=[CANARY]),  # type: ignore[arg-type]
        lambda: ClientSettings(token_env=f"Bearer {CANARY}"),
        lambda: UpstreamSettings(breaker_key="k", url=f"htps://svc:{CANARY}@x"),
        lambda: UpstreamSettings(breaker_key="k", url="https://x", headers=CANARY),  # type: ignore[arg-type]
        lambda: UpstreamSettings(breaker_key="k", command=["x"], env={"PW": NUMBER}),  # type: ignore[dict-item]
        lambda: StorageOptions(url=f"http://u:{CANARY}@redis"),
        lambda: AdminSection(token=[CANARY]),  # type: ignore[arg-type]
    ],
)
def test_settings_built_by_hand_quote_no_value(build: Any) -> None:
    with pytest.raises((SettingsError, ValueError)) as caught:
        build()
    message = str(caught.value)
    assert CANARY not in message and str(NUMBER) not in message, message


# -- the three places an operator reads the error --------------------------------------------
UPSTREAM = '\n[serve.upstreams.docs]\nbreaker_key = "docs"\n'
CASES = {
    "url": UPSTREAM + f'url = "htps://svc:{CANARY}@docs.internal/mcp"\n',
    "url list": UPSTREAM + f'url = ["https://svc:{CANARY}@docs.internal/mcp"]\n',
    "headers text": UPSTREAM
    + f'url = "https://d/mcp"\nheaders = "Authorization: Bearer {CANARY}"\n',
    "header list": UPSTREAM
    + f'url = "https://d/mcp"\nheaders = {{ Authorization = ["Bearer {CANARY}"] }}\n',
    "env list": UPSTREAM + f'command = ["x"]\nenv = {{ DB_PASSWORD = ["{CANARY}"] }}\n',
    "env number": UPSTREAM + f'command = ["x"]\nenv = {{ DB_PASSWORD = {NUMBER} }}\n',
    "env text": UPSTREAM + f'command = ["x"]\nenv = "DB_PASSWORD={CANARY}"\n',
    "command": UPSTREAM + f'command = "run --token {CANARY}"\n',
    "bearer_token_env": UPSTREAM + f'url = "https://d/mcp"\nbearer_token_env = "{CANARY}!"\n',
    "client token": f'\n[serve.http.clients.bob]\ntoken = ["{CANARY}"]\n',
    "client token_env": f'\n[serve.http.clients.bob]\ntoken_env = "Bearer {CANARY}"\n',
    "redis url": f'\n[storage]\nurl = "http://u:{CANARY}@redis:6379"\n',
    "otlp endpoint": f'\n[telemetry]\notlp_endpoint = ["https://u:{CANARY}@otel"]\n',
}


def test_check_reload_log_and_admin_422_show_no_secret(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with StandInUpstream().run_in_thread() as upstream:
        server = start_http_server(tmp_path, upstream.url)
        config = tmp_path / "toolrelay.toml"
        good = config.read_text()
        admin = "[serve.admin]\nport = 0\n"
        cases = {
            **CASES,
            "admin token": good.replace(admin, f'{admin}token = {{ value = "{CANARY}" }}\n'),
        }
        try:
            for case, text in cases.items():
                config.write_text(text if case == "admin token" else good + text)
                assert main(["check", str(config)]) == 2, case
                printed = capsys.readouterr()
                assert "toolrelay: " in printed.err
                answer = httpx.post(
                    server.admin.url + "/reload",
                    headers={"Authorization": f"Bearer {TOKEN}"},
                    timeout=30,
                )
                assert answer.status_code == 422, (case, answer.text)
                for shown in (printed.out + printed.err, answer.text):
                    assert CANARY not in shown and str(NUMBER) not in shown, (case, shown)
            config.write_text(good)
        finally:
            stop_http_server(server)
    log = server.errlog.read_text()
    assert log.count("reload refused") == len(cases)
    assert CANARY not in log and str(NUMBER) not in log
