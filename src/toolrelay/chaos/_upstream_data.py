"""What the stand-in upstream serves, in the real services' formats, deterministically.

Open-Meteo's forecast and geocoding APIs (:mod:`._upstream_meteo`), SearXNG's JSON search,
and an RSS 2.0 and an Atom feed. Values derive from the request (coordinates, query) and
the server's clock, so the same request to a server with the same clock always gets the
same answer.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime, timedelta, timezone
from email.utils import format_datetime
from urllib.parse import quote
from xml.sax.saxutils import escape, quoteattr

from ._upstream_meteo import forecast, geocode
from ._upstream_replies import ATOM, RSS, TEXT, Query, Reply, json_reply, noise, one

REFERENCE_NOW = datetime(2025, 6, 1, 12, 0, tzinfo=UTC)
"""The stand-in's default clock: a fixed instant, so answers are reproducible."""


# -- SearXNG ----------------------------------------------------------------------------
ENGINES = ("duckduckgo", "brave", "wikipedia", "startpage", "qwant")
DOMAINS = ("example.org", "example.com", "example.net")
ANSWER_TEXT = "Stand-in instant answer for {q}: always 42."
INFOBOX_TEXT = "Stand-in infobox text about {q}, written by the upstream."


def searxng(query: Query, now: datetime) -> Reply:
    """``GET /search?format=json`` as SearXNG answers it, with an answer and an infobox."""
    if one(query, "format") != "json":
        return Reply(403, b"Forbidden", TEXT)
    q = (one(query, "q") or "").strip()
    if not q:
        return json_reply({"error": "search query is empty"}, 400)
    slug = quote("-".join(q.casefold().split())[:60], safe="-")
    results = []
    for i in range(8):
        h = noise(q, i)
        engine = ENGINES[h % len(ENGINES)]
        host = DOMAINS[(h >> 8) % len(DOMAINS)]
        url = f"https://{host}/{slug}/{i + 1}"
        results.append(
            {
                "url": url,
                "title": f"{q} — result {i + 1}",
                "content": f"Result {i + 1} about {q} from the stand-in index.",
                "engine": engine,
                "parsed_url": ["https", host, f"/{slug}/{i + 1}", "", "", ""],
                "template": "default.html",
                "engines": [engine],
                "positions": [i + 1],
                "publishedDate": None,
                "score": round(8 / (i + 1), 3),
                "category": "general",
            }
        )
    body = {
        "query": q,
        "number_of_results": len(results),
        "results": results,
        "answers": [{"answer": ANSWER_TEXT.format(q=q), "url": None, "engine": "stand-in"}],
        "corrections": [],
        "infoboxes": [
            {
                "infobox": q,
                "id": f"https://en.wikipedia.org/wiki/{slug}",
                "content": INFOBOX_TEXT.format(q=q),
                "img_src": None,
                "urls": [{"title": "Wikipedia", "url": f"https://en.wikipedia.org/wiki/{slug}"}],
                "attributes": [],
                "engine": "wikipedia",
                "engines": ["wikipedia"],
            }
        ],
        "suggestions": [],
        "unresponsive_engines": [],
    }
    return json_reply(body)


# -- feeds ------------------------------------------------------------------------------
LONG_TEXT = (
    "The regional transport authority published its ten-year plan on Sunday. "
    "It proposes new tram lines to the eastern districts, longer platforms at the "
    "central station, a night bus network for the suburbs and an integrated ticket "
    "valid on ferries, trams, buses and regional trains. Public hearings start next "
    "month and the final vote is expected before the end of the year, after which "
    "construction of the first tram line could begin within eighteen months."
)
STORIES: tuple[tuple[str, str, str], ...] = (
    ("Harbour reopens after storm", "https://example.org/news/1",
     "<p>The <b>harbour</b> reopened on Sunday &amp; ferries resumed.</p>"),
    ("Council approves new cycle lanes", "https://example.org/news/2",
     "<p>Twelve kilometres of lanes.</p><script>alert('x')</script>"),
    ("Long read: the ten-year transport plan", "https://example.org/news/3",
     f"<div><p>{LONG_TEXT}</p></div>"),
    ("Museum extends opening hours", "https://example.org/news/4",
     "Open until <em>22:00</em> on Thursdays."),
    ("Weekend markets return", "javascript:alert(1)", "<p>Stalls from 9 to 3.</p>"),
)  # fmt: skip
PLUS_TWO = timezone(timedelta(hours=2))


def _story_times(now: datetime) -> list[datetime | None]:
    """Publication times: one with a +02:00 offset, one missing."""
    return [
        now - timedelta(hours=1),
        (now - timedelta(hours=3)).astimezone(PLUS_TWO),
        now - timedelta(hours=5),
        None,
        now - timedelta(hours=26),
    ]


def rss(query: Query, now: datetime) -> Reply:
    """An RSS 2.0 feed with five items."""
    items = []
    for (title, link, html), when in zip(STORIES, _story_times(now), strict=True):
        date = "" if when is None else f"<pubDate>{format_datetime(when)}</pubDate>"
        items.append(
            f"<item><title>{escape(title)}</title><link>{escape(link)}</link>"
            f'<guid isPermaLink="false">{escape(title)}</guid>{date}'
            f"<description>{escape(html)}</description></item>"
        )
    doc = (
        '<?xml version="1.0" encoding="UTF-8"?>\n<rss version="2.0"><channel>'
        "<title>Stand-in News</title><link>https://example.org/news</link>"
        "<description>Headlines from the toolrelay stand-in upstream.</description>"
        f"<lastBuildDate>{format_datetime(now)}</lastBuildDate>{''.join(items)}"
        "</channel></rss>"
    )
    return Reply(200, doc.encode(), RSS)


def atom(query: Query, now: datetime) -> Reply:
    """An Atom feed with five entries."""
    entries = []
    for index, ((title, link, html), when) in enumerate(
        zip(STORIES, _story_times(now), strict=True), start=1
    ):
        updated = (when or now - timedelta(days=2)).isoformat()
        published = "" if when is None else f"<published>{when.isoformat()}</published>"
        entries.append(
            f"<entry><title>{escape(title)}</title>"
            f'<link rel="alternate" href={quoteattr(link)}/>'
            f"<id>urn:toolrelay:standin:{index}</id>{published}<updated>{updated}</updated>"
            f'<summary type="html">{escape(html)}</summary></entry>'
        )
    doc = (
        '<?xml version="1.0" encoding="UTF-8"?>\n<feed xmlns="http://www.w3.org/2005/Atom">'
        "<title>Stand-in Updates</title><id>urn:toolrelay:standin</id>"
        f'<link rel="alternate" href="https://example.org/updates"/>'
        f"<updated>{now.isoformat()}</updated>{''.join(entries)}</feed>"
    )
    return Reply(200, doc.encode(), ATOM)


Route = Callable[[Query, datetime], Reply]
ROUTES: dict[str, Route] = {
    "/v1/forecast": forecast,
    "/v1/search": geocode,
    "/search": searxng,
    "/backup/search": searxng,  # a second search service: a fallback's (docs/fallbacks.md)
    "/feeds/rss.xml": rss,
    "/feeds/atom.xml": atom,
}
