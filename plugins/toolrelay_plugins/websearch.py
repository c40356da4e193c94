"""Web search through a SearXNG instance's JSON API.

Tool ``web_search`` (breaker key ``searxng``, risk read). Answers hold results only —
title, URL, snippet and engine, as plain text, cut to fixed lengths. SearXNG's
``answers`` and ``infoboxes`` (text an engine wrote *for* the reader, the likeliest place
for instructions aimed at a model) are dropped, as are results without an http(s) URL.

Settings: ``base_url`` (required: your SearXNG, with the JSON format enabled),
``safesearch`` (0–2, default 1), ``language`` (e.g. ``"en"``, default: SearXNG's),
``tool`` (the tool's name, default ``web_search``; another name — e.g. a second instance as
``web_search_backup``, a fallback — also makes that name its breaker key), and the HTTP
settings of :class:`~toolrelay_plugins._settings.HttpSettings`.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Annotated, Any

from pydantic import Field, Strict

from toolrelay.contract import AuthContext, ToolDeclaration, ToolError

from ._failures import malformed
from ._http import HttpPlugin, Registrar, ServiceClient
from ._settings import HttpSettings, Must, Url
from ._text import clean_text, safe_url

SERVICE = "searxng"
DEFAULT_RESULTS = 5
TITLE_CHARS = 200
SNIPPET_CHARS = 300
MAX_SCANNED = 100
"""Raw results looked at, at most: a body of 50,000 junk results costs no more than 100."""
_ENGINE = re.compile(r"^[a-z0-9][a-z0-9 ._-]{0,39}$")

PARAMETERS: dict[str, Any] = {
    "type": "object",
    "properties": {
        "query": {"type": "string", "minLength": 1, "maxLength": 300, "pattern": r"\S"},
        "max_results": {
            "type": "integer",
            "minimum": 1,
            "maximum": 10,
            "default": DEFAULT_RESULTS,
        },
    },
    "required": ["query"],
    "additionalProperties": False,
}


class WebSearchSettings(HttpSettings):
    """``[plugins.websearch]``."""

    base_url: Url = Field(description="the SearXNG instance")
    safesearch: Annotated[int, Strict(), Field(ge=0, le=2), Must("be an integer from 0 to 2")] = 1
    language: (
        Annotated[
            str,
            Strict(),
            Field(pattern=r"^[A-Za-z]{2,3}(-[A-Za-z0-9]{2,8})?$|^all$|^auto$"),
            Must("be a language code such as 'en'"),
        ]
        | None
    ) = None
    tool: Annotated[
        str,
        Strict(),
        Field(pattern=r"^[A-Za-z0-9_-]{1,64}$"),
        Must("be a tool name such as 'web_search_backup'"),
    ] = "web_search"


class WebSearchPlugin(HttpPlugin):
    """``web_search`` on SearXNG."""

    def __init__(self, config: Mapping[str, Any]) -> None:
        self.settings = settings = WebSearchSettings.parse("websearch", config)
        tool = settings.tool
        declaration = ToolDeclaration(
            tool,
            "Search the web. Returns up to max_results results, each with title, url, a short "
            "snippet and the engine that found it.",
            PARAMETERS,
            risk="read",
            timeout_s=settings.timeout_s,
            breaker_key=SERVICE if tool == "web_search" else tool,
            tags=frozenset({"web"}),
        )
        super().__init__([declaration], ServiceClient(settings, accept="application/json"))

    async def execute(self, name: str, args: dict[str, Any], ctx: AuthContext) -> Any:
        settings = self.settings
        query: dict[str, str | int | float] = {
            "q": args["query"],
            "format": "json",
            "safesearch": settings.safesearch,
        }
        if settings.language is not None:
            query["language"] = settings.language
        data = await self.client.get_json(SERVICE, f"{settings.base_url}/search", query)
        if not isinstance(data, dict) or not isinstance(data.get("results"), list):
            raise malformed(SERVICE)
        results = _results(data["results"], int(args.get("max_results", DEFAULT_RESULTS)))
        if not results and data.get("unresponsive_engines"):
            raise ToolError(f"the search engines behind {SERVICE} did not answer", retryable=True)
        return {"results": results}


def _results(raw: list[Any], limit: int) -> list[dict[str, Any]]:
    """Results only: answers and infoboxes are never read."""
    out: list[dict[str, Any]] = []
    seen: set[str] = set()
    for item in raw[:MAX_SCANNED]:
        if len(out) == limit:
            break
        if not isinstance(item, dict):
            continue
        url = safe_url(item.get("url"))
        if url is None or url in seen:
            continue
        seen.add(url)
        engine = item.get("engine")
        out.append(
            {
                "title": clean_text(item.get("title"), TITLE_CHARS) or url,
                "url": url,
                "snippet": clean_text(item.get("content"), SNIPPET_CHARS),
                "engine": engine if isinstance(engine, str) and _ENGINE.match(engine) else None,
            }
        )
    return out


def register(registry: Registrar, config: Mapping[str, Any]) -> None:
    """Register ``web_search`` (or ``config["tool"]``):
    ``register(registry, {"base_url": "https://searx.example"})``."""
    registry.register(WebSearchPlugin(config))
