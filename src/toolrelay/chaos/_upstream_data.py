"""What the stand-in upstream serves, in the real services' formats, deterministically.

Open-Meteo's forecast and geocoding APIs, SearXNG's JSON search, and an RSS 2.0 and an
Atom feed. Values derive from the request (coordinates, query) and the server's clock, so
the same request to a server with the same clock always gets the same answer.
"""

from __future__ import annotations

import json
import zlib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta, timezone, tzinfo
from email.utils import format_datetime
from typing import Any
from urllib.parse import quote
from xml.sax.saxutils import escape, quoteattr
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

__all__ = ["REFERENCE_NOW", "ROUTES", "Query", "Reply", "error_reply", "json_reply", "malformed"]

JSON = "application/json; charset=utf-8"
RSS = "application/rss+xml; charset=utf-8"
ATOM = "application/atom+xml; charset=utf-8"
TEXT = "text/plain; charset=utf-8"

REFERENCE_NOW = datetime(2025, 6, 1, 12, 0, tzinfo=UTC)
"""The stand-in's default clock: a fixed instant, so answers are reproducible."""

Query = Mapping[str, Sequence[str]]


@dataclass(frozen=True, slots=True)
class Reply:
    """One HTTP response, before any fault is applied to it."""

    status: int
    body: bytes
    content_type: str = JSON
    headers: tuple[tuple[str, str], ...] = ()


class BadRequest(ValueError):
    """A request the real service would refuse with HTTP 400."""


def json_reply(data: Any, status: int = 200, headers: tuple[tuple[str, str], ...] = ()) -> Reply:
    body = json.dumps(data, ensure_ascii=False, separators=(",", ":")).encode()
    return Reply(status, body, JSON, headers)


def error_reply(status: int, reason: str, headers: tuple[tuple[str, str], ...] = ()) -> Reply:
    """An error in Open-Meteo's shape, ``{"error": true, "reason": …}``."""
    return json_reply({"error": True, "reason": reason}, status, headers)


def malformed(reply: Reply) -> Reply:
    """The same answer with a body that does not parse as its content type claims."""
    if "xml" in reply.content_type:
        body = (
            b'<?xml version="1.0" encoding="UTF-8"?>\n<rss version="2.0"><channel>'
            b"<title>Stand-in News</title><item><title>Unclosed</channel></rss>"
        )
    else:
        body = b'{"latitude": 59.91, "current": {"temperature_2m": 21.5,, "results": ['
    return Reply(200, body, reply.content_type, reply.headers)


# -- query helpers ---------------------------------------------------------------------
def _one(query: Query, name: str) -> str | None:
    values = query.get(name)
    return values[-1] if values else None


def _number(query: Query, name: str, low: float, high: float) -> float:
    raw = _one(query, name)
    if raw is None or raw == "":
        raise BadRequest(f"Parameter '{name}' is missing")
    try:
        value = float(raw)
    except ValueError:
        raise BadRequest(f"Parameter '{name}' must be a number") from None
    if not low <= value <= high:
        raise BadRequest(f"Parameter '{name}' must be in range of {low:g} to {high:g}")
    return value


def _integer(query: Query, name: str, low: int, high: int, default: int) -> int:
    raw = _one(query, name)
    if raw is None:
        return default
    try:
        value = int(raw)
    except ValueError:
        raise BadRequest(f"Parameter '{name}' must be an integer") from None
    if not low <= value <= high:
        raise BadRequest(f"Parameter '{name}' must be between {low} and {high}")
    return value


def _variables(query: Query, name: str, known: Mapping[str, str]) -> list[str]:
    raw = _one(query, name)
    if not raw:
        return []
    chosen = [v.strip() for v in raw.split(",") if v.strip()]
    for variable in chosen:
        if variable not in known:
            raise BadRequest(
                f"Cannot initialize WeatherVariable from invalid String value {variable}"
            )
    return chosen


def _noise(*parts: object) -> int:
    return zlib.crc32("|".join(str(p) for p in parts).encode())


# -- Open-Meteo forecast ----------------------------------------------------------------
CURRENT_UNITS = {
    "temperature_2m": "°C",
    "relative_humidity_2m": "%",
    "precipitation": "mm",
    "wind_speed_10m": "km/h",
    "weather_code": "wmo code",
}
DAILY_UNITS = {
    "temperature_2m_max": "°C",
    "temperature_2m_min": "°C",
    "precipitation_sum": "mm",
    "wind_speed_10m_max": "km/h",
    "weather_code": "wmo code",
}
SUPPORTED_UNITS = {
    "temperature_unit": "celsius",
    "wind_speed_unit": "kmh",
    "precipitation_unit": "mm",
}
CODES = (0, 1, 2, 3, 45, 48, 51, 53, 61, 63, 65, 71, 73, 80, 81, 95)


def _conditions(lat: float, lon: float, slot: str) -> dict[str, float | int]:
    """Weather for one place and time slot, derived from the coordinates."""
    h = _noise(f"{lat:.2f}", f"{lon:.2f}", slot)
    code = CODES[h % len(CODES)]
    temperature = round(30.0 - 0.3 * abs(lat) + (h >> 8) % 90 / 10 - 4.5, 1)
    if code in (71, 73) and temperature > 2:
        code -= 10  # rain, not snow, above freezing
    return {
        "temperature_2m": temperature,
        "relative_humidity_2m": 40 + (h >> 4) % 55,
        "precipitation": round(0.2 + (h >> 16) % 80 / 10, 1) if code >= 51 else 0.0,
        "wind_speed_10m": round(2.0 + (h >> 12) % 350 / 10, 1),
        "weather_code": code,
    }


def _zone(query: Query) -> tuple[str, tzinfo]:
    name = _one(query, "timezone") or "GMT"
    if name in ("auto", "GMT", "UTC"):
        return ("GMT" if name == "auto" else name), UTC  # the stand-in has no tz lookup
    try:
        return name, ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError):
        raise BadRequest(f"Invalid timezone '{name}'") from None


def forecast(query: Query, now: datetime) -> Reply:
    """``GET /v1/forecast`` as Open-Meteo answers it."""
    lat = _number(query, "latitude", -90, 90)
    lon = _number(query, "longitude", -180, 180)
    current = _variables(query, "current", CURRENT_UNITS)
    daily = _variables(query, "daily", DAILY_UNITS)
    days = _integer(query, "forecast_days", 1, 16, 7)
    for name, supported in SUPPORTED_UNITS.items():
        value = _one(query, name)
        if value is not None and value != supported:
            raise BadRequest(f"The stand-in serves {name}={supported} only")
    tz_name, zone = _zone(query)
    local = now.astimezone(zone)
    offset = local.utcoffset() or timedelta(0)
    body: dict[str, Any] = {
        "latitude": round(lat, 2),
        "longitude": round(lon, 2),
        "generationtime_ms": 0.05,
        "utc_offset_seconds": int(offset.total_seconds()),
        "timezone": tz_name,
        "timezone_abbreviation": local.tzname() or tz_name,
        "elevation": float(_noise(lat, lon) % 600),
    }
    if current:
        slot = local.replace(minute=local.minute - local.minute % 15, second=0, microsecond=0)
        values = _conditions(lat, lon, slot.isoformat())
        body["current_units"] = {"time": "iso8601", "interval": "seconds"} | {
            v: CURRENT_UNITS[v] for v in current
        }
        body["current"] = {"time": slot.strftime("%Y-%m-%dT%H:%M"), "interval": 900} | {
            v: values[v] for v in current
        }
    if daily:
        dates = [(local.date() + timedelta(days=i)).isoformat() for i in range(days)]
        series: dict[str, list[float | int]] = {v: [] for v in daily}
        for date in dates:
            day = _conditions(lat, lon, date)
            temperature = float(day["temperature_2m"])
            derived: dict[str, float | int] = {
                "temperature_2m_max": round(temperature + 3.5, 1),
                "temperature_2m_min": round(temperature - 4.5, 1),
                "precipitation_sum": round(float(day["precipitation"]) * 4, 1),
                "wind_speed_10m_max": round(float(day["wind_speed_10m"]) * 1.5, 1),
                "weather_code": day["weather_code"],
            }
            for v in daily:
                series[v].append(derived[v])
        body["daily_units"] = {"time": "iso8601"} | {v: DAILY_UNITS[v] for v in daily}
        body["daily"] = {"time": dates} | series
    return json_reply(body)


# -- Open-Meteo geocoding ---------------------------------------------------------------
CITIES: tuple[dict[str, Any], ...] = (
    {"id": 3143244, "name": "Oslo", "latitude": 59.91273, "longitude": 10.74609,
     "country_code": "NO", "country": "Norway", "timezone": "Europe/Oslo"},
    {"id": 2950159, "name": "Berlin", "latitude": 52.52437, "longitude": 13.41053,
     "country_code": "DE", "country": "Germany", "timezone": "Europe/Berlin"},
    {"id": 2643743, "name": "London", "latitude": 51.50853, "longitude": -0.12574,
     "country_code": "GB", "country": "United Kingdom", "timezone": "Europe/London"},
    {"id": 2988507, "name": "Paris", "latitude": 48.85341, "longitude": 2.3488,
     "country_code": "FR", "country": "France", "timezone": "Europe/Paris"},
    {"id": 5128581, "name": "New York", "latitude": 40.71427, "longitude": -74.00597,
     "country_code": "US", "country": "United States", "timezone": "America/New_York"},
    {"id": 1850147, "name": "Tokyo", "latitude": 35.6895, "longitude": 139.69171,
     "country_code": "JP", "country": "Japan", "timezone": "Asia/Tokyo"},
    {"id": 2147714, "name": "Sydney", "latitude": -33.86785, "longitude": 151.20732,
     "country_code": "AU", "country": "Australia", "timezone": "Australia/Sydney"},
    {"id": 3448439, "name": "São Paulo", "latitude": -23.5475, "longitude": -46.63611,
     "country_code": "BR", "country": "Brazil", "timezone": "America/Sao_Paulo"},
    {"id": 360630, "name": "Cairo", "latitude": 30.06263, "longitude": 31.24967,
     "country_code": "EG", "country": "Egypt", "timezone": "Africa/Cairo"},
    {"id": 1275339, "name": "Mumbai", "latitude": 19.07283, "longitude": 72.88261,
     "country_code": "IN", "country": "India", "timezone": "Asia/Kolkata"},
    {"id": 3413829, "name": "Reykjavík", "latitude": 64.13548, "longitude": -21.89541,
     "country_code": "IS", "country": "Iceland", "timezone": "Atlantic/Reykjavik"},
)  # fmt: skip


def geocode(query: Query, now: datetime) -> Reply:
    """``GET /v1/search`` as Open-Meteo's geocoding API answers it."""
    name = _one(query, "name")
    if name is None:
        raise BadRequest("Parameter 'name' is missing")
    count = _integer(query, "count", 1, 100, 10)
    wanted = name.strip().casefold()
    body: dict[str, Any] = {"generationtime_ms": 0.3}
    if len(wanted) >= 2:
        found = [dict(c) for c in CITIES if c["name"].casefold().startswith(wanted)][:count]
        if found:  # the real API leaves "results" out when nothing matches
            body = {"results": found, **body}
    return json_reply(body)


# -- SearXNG ----------------------------------------------------------------------------
ENGINES = ("duckduckgo", "brave", "wikipedia", "startpage", "qwant")
DOMAINS = ("example.org", "example.com", "example.net")
ANSWER_TEXT = "Stand-in instant answer for {q}: always 42."
INFOBOX_TEXT = "Stand-in infobox text about {q}, written by the upstream."


def searxng(query: Query, now: datetime) -> Reply:
    """``GET /search?format=json`` as SearXNG answers it, with an answer and an infobox."""
    if _one(query, "format") != "json":
        return Reply(403, b"Forbidden", TEXT)
    q = (_one(query, "q") or "").strip()
    if not q:
        return json_reply({"error": "search query is empty"}, 400)
    slug = quote("-".join(q.casefold().split())[:60], safe="-")
    results = []
    for i in range(8):
        h = _noise(q, i)
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
