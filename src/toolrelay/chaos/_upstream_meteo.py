"""The stand-in upstream's Open-Meteo: the forecast and geocoding APIs, deterministically.

Values derive from the coordinates and the server's clock, so the same request to a
server with the same clock always gets the same answer.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import UTC, datetime, timedelta, tzinfo
from typing import Any
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from ._upstream_replies import BadRequest, Query, Reply, integer, json_reply, noise, number, one


def _variables(query: Query, name: str, known: Mapping[str, str]) -> list[str]:
    raw = one(query, name)
    if not raw:
        return []
    chosen = [v.strip() for v in raw.split(",") if v.strip()]
    for variable in chosen:
        if variable not in known:
            raise BadRequest(
                f"Cannot initialize WeatherVariable from invalid String value {variable}"
            )
    return chosen


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
    h = noise(f"{lat:.2f}", f"{lon:.2f}", slot)
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
    name = one(query, "timezone") or "GMT"
    if name in ("auto", "GMT", "UTC"):
        return ("GMT" if name == "auto" else name), UTC  # the stand-in has no tz lookup
    try:
        return name, ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError):
        raise BadRequest(f"Invalid timezone '{name}'") from None


def forecast(query: Query, now: datetime) -> Reply:
    """``GET /v1/forecast`` as Open-Meteo answers it."""
    lat = number(query, "latitude", -90, 90)
    lon = number(query, "longitude", -180, 180)
    current = _variables(query, "current", CURRENT_UNITS)
    daily = _variables(query, "daily", DAILY_UNITS)
    days = integer(query, "forecast_days", 1, 16, 7)
    for name, supported in SUPPORTED_UNITS.items():
        value = one(query, name)
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
        "elevation": float(noise(lat, lon) % 600),
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
    name = one(query, "name")
    if name is None:
        raise BadRequest("Parameter 'name' is missing")
    count = integer(query, "count", 1, 100, 10)
    wanted = name.strip().casefold()
    body: dict[str, Any] = {"generationtime_ms": 0.3}
    if len(wanted) >= 2:
        found = [dict(c) for c in CITIES if c["name"].casefold().startswith(wanted)][:count]
        if found:  # the real API leaves "results" out when nothing matches
            body = {"results": found, **body}
    return json_reply(body)
