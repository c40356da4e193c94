"""The latest items of RSS and Atom feeds the operator chose, parsed with feedparser.

Tool ``feed_latest`` (breaker key ``feeds``, risk read): the model names one of the
configured feeds, never a URL. Items come back as title, link (http(s) only), published
time (ISO 8601 UTC, or null) and a plain-text summary cut to ``summary_chars``. Parsing is
strict XML on a worker thread, with feedparser's sanitizer off (docs/security.md, "Hostile
upstream"); feedparser resolves no external entity and expat refuses entity bombs.

Settings: ``feeds`` (required: ``{name: url}``), ``summary_chars`` (default 280), and the
HTTP settings of :class:`~toolrelay_plugins._settings.HttpSettings`.
"""

from __future__ import annotations

import functools
import io
import re
import time
from collections.abc import Mapping
from typing import Annotated, Any

import anyio.to_thread
from pydantic import BeforeValidator, Field, Strict

from toolrelay.contract import AuthContext, ToolDeclaration

from ._failures import malformed
from ._http import HttpPlugin, Registrar, ServiceClient
from ._settings import HttpSettings, Must, Url
from ._text import clean_text, safe_url

try:
    import feedparser  # type: ignore[import-untyped]
except ModuleNotFoundError as exc:  # the ``plugins`` extra
    raise ModuleNotFoundError(
        "the feeds plugin needs feedparser: pip install 'toolrelay[plugins]'", name="feedparser"
    ) from exc

BREAKER_KEY = "feeds"
DEFAULT_LIMIT = 5
TITLE_CHARS = 300
ACCEPT = "application/atom+xml, application/rss+xml, application/xml;q=0.9, text/xml;q=0.8"
_NAME = re.compile(r"^[a-z0-9][a-z0-9_-]{0,39}$")
_HARMLESS = (feedparser.CharacterEncodingOverride, feedparser.NonXMLContentType)


def _feed_name(name: Any) -> Any:
    if not isinstance(name, str) or not _NAME.match(name):
        raise ValueError(f"is not a feed name: it must match {_NAME.pattern}")
    return name


class FeedsSettings(HttpSettings):
    """``[plugins.feeds]``."""

    feeds: Annotated[
        dict[Annotated[str, BeforeValidator(_feed_name)], Url],
        Field(min_length=1),
        Must("map at least one feed name to its URL"),
    ]
    summary_chars: Annotated[
        int, Strict(), Field(ge=20, le=5000), Must("be an integer from 20 to 5000")
    ] = 280


class FeedsPlugin(HttpPlugin):
    """``feed_latest`` over the operator's feeds."""

    def __init__(self, config: Mapping[str, Any]) -> None:
        self.settings = settings = FeedsSettings.parse("feeds", config)
        names = sorted(settings.feeds)
        parameters = {
            "type": "object",
            "properties": {
                "feed": {"type": "string", "enum": names},
                "limit": {"type": "integer", "minimum": 1, "maximum": 20, "default": DEFAULT_LIMIT},
            },
            "required": ["feed"],
            "additionalProperties": False,
        }
        listing = ", ".join(names)
        if len(listing) > 200:
            listing = listing[:199] + "…"
        declaration = ToolDeclaration(
            "feed_latest",
            "Latest items of a news feed: title, link, published time (UTC) and a short "
            f"summary. Feeds: {listing}.",
            parameters,
            risk="read",
            timeout_s=settings.timeout_s,
            breaker_key=BREAKER_KEY,
            tags=frozenset({"feeds"}),
        )
        client = ServiceClient(settings, accept=ACCEPT, follow_redirects=True)
        super().__init__([declaration], client)

    async def execute(self, name: str, args: dict[str, Any], ctx: AuthContext) -> Any:
        feed = args["feed"]  # one of the configured names: the schema's enum
        service = f"feed {feed!r}"
        body, content_type = await self.client.fetch(service, self.settings.feeds[feed])
        parsed = await anyio.to_thread.run_sync(
            functools.partial(parse_feed, body, content_type), abandon_on_cancel=True
        )
        if parsed is None:
            raise malformed(service)
        limit = int(args.get("limit", DEFAULT_LIMIT))
        return {
            "feed": feed,
            "title": clean_text(parsed.feed.get("title"), TITLE_CHARS),
            "items": [self._item(entry) for entry in parsed.entries[:limit]],
        }

    def _item(self, entry: Any) -> dict[str, Any]:
        return {
            "title": clean_text(entry.get("title"), TITLE_CHARS),
            "link": safe_url(entry.get("link")),
            "published": _utc(entry.get("published_parsed") or entry.get("updated_parsed")),
            "summary": clean_text(entry.get("summary"), self.settings.summary_chars),
        }


def parse_feed(body: bytes, content_type: str = "application/xml") -> Any | None:
    """The parsed feed, or ``None`` when the body is not a well-formed RSS or Atom feed."""
    parsed = feedparser.parse(
        io.BytesIO(body),  # never bytes or str: feedparser would read those as a path or URL
        response_headers={"content-type": content_type or "application/xml"},
        resolve_relative_uris=False,
        sanitize_html=False,  # clean_text keeps no markup; the sanitizer is quadratic
    )
    if not parsed.get("version"):
        return None
    if parsed.get("bozo") and not isinstance(parsed.get("bozo_exception"), _HARMLESS):
        return None
    return parsed


def _utc(value: Any) -> str | None:
    """feedparser's UTC ``struct_time`` as ISO 8601."""
    if not isinstance(value, time.struct_time):
        return None
    try:
        return time.strftime("%Y-%m-%dT%H:%M:%SZ", value)
    except (ValueError, OverflowError):
        return None


def register(registry: Registrar, config: Mapping[str, Any]) -> None:
    """Register ``feed_latest``: ``register(registry, {"feeds": {"news": "https://…"}})``."""
    registry.register(FeedsPlugin(config))
