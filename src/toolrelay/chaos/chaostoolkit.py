"""Chaos Toolkit activities for a running ``toolrelay serve``, through its admin API
(documented in docs/serve.md, "Chaos Toolkit"). The activities' docstrings are their
descriptions in the discovery document.

(No ``from __future__ import annotations``: Chaos Toolkit's discovery reads the
annotations as Python types.)
"""

import importlib
import os
import time
from collections.abc import Mapping
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from .._version import __version__

try:
    import httpx
except ModuleNotFoundError as exc:  # the ``chaos`` extra
    raise ModuleNotFoundError(
        "the Chaos Toolkit activities need httpx: pip install 'toolrelay[chaos]'", name="httpx"
    ) from exc

__all__ = [
    "ToolrelayAdminError",
    "answered_ratio",
    "breaker_state",
    "clear_faults",
    "discover",
    "force_open_breaker",
    "inject_fault",
    "reset_breaker",
]

Configuration = dict[str, Any]
Secrets = dict[str, Any]

ACTIONS = ("inject_fault", "clear_faults", "force_open_breaker", "reset_breaker")
PROBES = ("breaker_state", "answered_ratio")
URL_KEY = "toolrelay_admin_url"
TIMEOUT_KEY = "toolrelay_admin_timeout_s"
TOKEN_KEY = "admin_token"
CALLS_METRIC = "toolrelay_mcp_tool_calls"


class ToolrelayAdminError(RuntimeError):
    """The admin API could not be reached or refused the request."""


# -- the admin API -------------------------------------------------------------------------
def _request(
    method: str,
    path: str,
    configuration: Configuration | None,
    secrets: Secrets | None,
    *,
    body: Any = None,
    params: Mapping[str, str] | None = None,
) -> httpx.Response:
    config = configuration or {}
    url = str(config.get(URL_KEY) or os.environ.get("TOOLRELAY_ADMIN_URL", "")).rstrip("/")
    token = str((secrets or {}).get(TOKEN_KEY) or os.environ.get("TOOLRELAY_ADMIN_TOKEN", ""))
    if not url:
        raise ToolrelayAdminError(
            f"no admin API URL: set configuration {URL_KEY!r} or TOOLRELAY_ADMIN_URL"
        )
    if not token:
        raise ToolrelayAdminError(
            f"no admin token: set secret {TOKEN_KEY!r} or TOOLRELAY_ADMIN_TOKEN"
        )
    try:
        response = httpx.request(
            method,
            url + path,
            headers={"Authorization": f"Bearer {token}"},
            json=body,
            params=params,
            timeout=float(config.get(TIMEOUT_KEY, 10.0)),
        )
    except httpx.HTTPError as exc:
        raise ToolrelayAdminError(f"{method} {path}: {type(exc).__name__}: {exc}") from None
    if response.status_code >= 400:
        try:
            detail = response.json()
            reason = f"{detail['error']}: {detail['message']}"
        except (ValueError, KeyError, TypeError):
            reason = response.text[:200]
        raise ToolrelayAdminError(f"{method} {path} answered {response.status_code} {reason}")
    return response


def _json(response: httpx.Response) -> dict[str, Any]:
    data = response.json()
    if not isinstance(data, dict):
        raise ToolrelayAdminError(f"{response.request.url.path}: expected a JSON object")
    return data


# -- actions -------------------------------------------------------------------------------
def inject_fault(
    fault: dict[str, Any],
    seed: int | None = None,
    replace: bool = False,
    configuration: Configuration | None = None,
    secrets: Secrets | None = None,
) -> dict[str, Any]:
    """Put a fault in force in the gateway's pipeline (``PUT /faults``).

    ``fault`` is a toolrelay fault, as in ``[[faults]]`` of ``toolrelay.toml``: ``kind``
    (latency, error, exception, hang, bad_output), ``tool`` or ``breaker_key``, ``rate``,
    and the kind's settings. ``seed`` restarts the fault dice; ``replace`` clears the faults
    in force first. Returns ``{"added": [ids], "faults": [every fault in force]}``.
    """
    params = {"replace": "true" if replace else "false"}
    if seed is not None:
        params["seed"] = str(int(seed))
    response = _request("PUT", "/faults", configuration, secrets, body=fault, params=params)
    return _json(response)


def clear_faults(
    configuration: Configuration | None = None, secrets: Secrets | None = None
) -> dict[str, Any]:
    """Remove every fault (``DELETE /faults``); returns ``{"removed": n}``."""
    return _json(_request("DELETE", "/faults", configuration, secrets))


def force_open_breaker(
    key: str, configuration: Configuration | None = None, secrets: Secrets | None = None
) -> dict[str, Any]:
    """Open the breaker of ``key`` and keep it open, no trial calls, until it is reset
    (``POST /breakers/{key}/open``); returns the breaker's state."""
    return _json(_request("POST", f"/breakers/{key}/open", configuration, secrets))


def reset_breaker(
    key: str, configuration: Configuration | None = None, secrets: Secrets | None = None
) -> dict[str, Any]:
    """Back to a fresh closed breaker for ``key`` (``POST /breakers/{key}/reset``)."""
    return _json(_request("POST", f"/breakers/{key}/reset", configuration, secrets))


# -- probes --------------------------------------------------------------------------------
def breaker_state(
    key: str, configuration: Configuration | None = None, secrets: Secrets | None = None
) -> str:
    """The state of the breaker of ``key``: ``closed``, ``open`` or ``half_open``."""
    return str(_json(_request("GET", f"/breakers/{key}", configuration, secrets))["state"])


def _call_counts(
    configuration: Configuration | None, secrets: Secrets | None, tool: str
) -> dict[str, float]:
    """MCP ``tools/call`` counts by outcome (for one tool, or all)."""
    text = _request("GET", "/metrics", configuration, secrets).text
    counts: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        if family.name != CALLS_METRIC:
            continue
        for sample in family.samples:
            if not sample.name.endswith("_total") or (tool and sample.labels["tool"] != tool):
                continue
            outcome = sample.labels["outcome"]
            counts[outcome] = counts.get(outcome, 0.0) + sample.value
    return counts


def answered_ratio(
    tool: str = "",
    window_s: float = 0.0,
    ok_only: bool = False,
    configuration: Configuration | None = None,
    secrets: Secrets | None = None,
) -> float:
    """The fraction of MCP tool calls the gateway answered, from its metrics.

    An answer is any result, a structured error (``timeout``, ``circuit_open``, …)
    included; a call the client cancelled was not answered. With ``ok_only`` it is the
    fraction of answered calls whose answer was ``ok`` instead. ``tool`` limits it to one
    tool; ``window_s > 0`` counts only the calls that ended during the next ``window_s``
    seconds (the probe waits), otherwise every call since the gateway started. With no
    call to count the ratio is 1.0.
    """
    before = _call_counts(configuration, secrets, tool) if window_s > 0 else {}
    if window_s > 0:
        time.sleep(window_s)
    after = _call_counts(configuration, secrets, tool)
    delta = {k: v - before.get(k, 0.0) for k, v in after.items()}
    total = sum(delta.values())
    answered = total - delta.get("cancelled", 0.0)
    if ok_only:
        return 1.0 if answered <= 0 else delta.get("ok", 0.0) / answered
    return 1.0 if total <= 0 else answered / total


# -- discovery -----------------------------------------------------------------------------
def discover(discover_system: bool = True) -> dict[str, Any]:
    """The Chaos Toolkit discovery document: these activities and, with
    ``discover_system`` and a reachable admin API (``TOOLRELAY_ADMIN_URL`` and
    ``TOOLRELAY_ADMIN_TOKEN``), the gateway's tools and breakers. Needs Chaos Toolkit
    (``chaostoolkit-lib``, in the ``chaos`` extra)."""
    try:
        discovery = importlib.import_module("chaoslib.discovery.discover")
    except ImportError:
        raise ImportError("discovery is Chaos Toolkit's: pip install 'toolrelay[chaos]'") from None
    result: dict[str, Any] = discovery.initialize_discovery_result(
        "toolrelay", __version__, "toolrelay"
    )
    for activity in discovery.discover_activities(__name__, "action"):
        if activity["name"] in PROBES:
            activity["type"] = "probe"
        if activity["name"] in ACTIONS + PROBES:
            result["activities"].append(activity)
    if discover_system:
        try:
            result["system"] = {
                "tools": _json(_request("GET", "/tools", None, None))["tools"],
                "breakers": _json(_request("GET", "/breakers", None, None))["breakers"],
            }
        except ToolrelayAdminError:
            result["system"] = None
    return result
