"""Weather from Open-Meteo: current conditions and a daily forecast, measurements only.

Tools ``weather_current`` and ``weather_forecast`` (breaker key ``open-meteo``, risk read).
A place is a ``city`` (looked up with Open-Meteo's geocoding API) or a ``latitude`` and
``longitude``. Answers hold numbers with their units in the key names, the WMO weather
code and its meaning from the table below; no text written by the service reaches the
model except the geocoder's place name and country, cut to 80 characters.

Settings: ``base_url`` (default ``https://api.open-meteo.com``), ``geocoding_url``
(default ``https://geocoding-api.open-meteo.com``), and the HTTP settings of
:class:`~toolrelay_plugins._settings.HttpSettings` (``timeout_s`` …).
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from typing import Any

from toolrelay.contract import AuthContext, ToolDeclaration, ToolError

from ._failures import malformed
from ._http import HttpPlugin, Registrar, ServiceClient
from ._settings import HttpSettings, Url
from ._text import clean_text

SERVICE = "open-meteo"
DEFAULT_BASE_URL = "https://api.open-meteo.com"
DEFAULT_GEOCODING_URL = "https://geocoding-api.open-meteo.com"
DEFAULT_DAYS = 3

WMO_CODES: dict[int, str] = {
    0: "clear sky",
    1: "mainly clear",
    2: "partly cloudy",
    3: "overcast",
    45: "fog",
    48: "depositing rime fog",
    51: "light drizzle",
    53: "moderate drizzle",
    55: "dense drizzle",
    56: "light freezing drizzle",
    57: "dense freezing drizzle",
    61: "slight rain",
    63: "moderate rain",
    65: "heavy rain",
    66: "light freezing rain",
    67: "heavy freezing rain",
    71: "slight snowfall",
    73: "moderate snowfall",
    75: "heavy snowfall",
    77: "snow grains",
    80: "slight rain showers",
    81: "moderate rain showers",
    82: "violent rain showers",
    85: "slight snow showers",
    86: "heavy snow showers",
    95: "thunderstorm",
    96: "thunderstorm with slight hail",
    99: "thunderstorm with heavy hail",
}
"""The WMO 4677 codes Open-Meteo uses, with their meaning (Open-Meteo's documentation); any
other code (0–99) is answered with ``"weather": null``."""

_PLACE = {
    "city": {
        "type": "string",
        "minLength": 1,
        "maxLength": 80,
        "pattern": r"\S",
        "description": "City name, e.g. Oslo.",
    },
    "latitude": {"type": "number", "minimum": -90, "maximum": 90},
    "longitude": {"type": "number", "minimum": -180, "maximum": 180},
}
_ONE_PLACE = {
    "oneOf": [{"required": ["city"]}, {"required": ["latitude", "longitude"]}],
    "dependentRequired": {"latitude": ["longitude"], "longitude": ["latitude"]},
    "additionalProperties": False,
}
CURRENT_PARAMETERS: dict[str, Any] = {"type": "object", "properties": _PLACE, **_ONE_PLACE}
FORECAST_PARAMETERS: dict[str, Any] = {
    "type": "object",
    "properties": {
        **_PLACE,
        "days": {"type": "integer", "minimum": 1, "maximum": 7, "default": DEFAULT_DAYS},
    },
    **_ONE_PLACE,
}
UNITS = {"temperature_unit": "celsius", "wind_speed_unit": "kmh", "precipitation_unit": "mm"}
CURRENT = {"temperature_2m": "°C", "precipitation": "mm", "wind_speed_10m": "km/h"}
DAILY = {"temperature_2m_max": "°C", "temperature_2m_min": "°C", "precipitation_sum": "mm"}
_LOCAL_TIME = re.compile(r"^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}$")
_DATE = re.compile(r"^\d{4}-\d{2}-\d{2}$")
_ZONE = re.compile(r"^[A-Za-z0-9_+\-/]{1,64}$")


class WeatherSettings(HttpSettings):
    """``[plugins.weather]``."""

    base_url: Url = DEFAULT_BASE_URL
    geocoding_url: Url = DEFAULT_GEOCODING_URL


class WeatherPlugin(HttpPlugin):
    """``weather_current`` and ``weather_forecast`` on Open-Meteo."""

    def __init__(self, config: Mapping[str, Any]) -> None:
        self.settings = settings = WeatherSettings.parse("weather", config)
        common: dict[str, Any] = {
            "risk": "read",
            "timeout_s": settings.timeout_s,
            "breaker_key": SERVICE,
            "tags": frozenset({"weather"}),
        }
        super().__init__(
            [
                ToolDeclaration(
                    "weather_current",
                    "Current weather at a place: temperature (°C), precipitation (mm), wind "
                    "speed (km/h) and the WMO weather code with its meaning. Give city, or "
                    "latitude and longitude.",
                    CURRENT_PARAMETERS,
                    **common,
                ),
                ToolDeclaration(
                    "weather_forecast",
                    "Daily forecast for 1–7 days at a place: highest and lowest temperature "
                    "(°C), precipitation (mm) and the WMO weather code with its meaning. Give "
                    "city, or latitude and longitude.",
                    FORECAST_PARAMETERS,
                    **common,
                ),
            ],
            ServiceClient(settings, accept="application/json"),
        )

    async def execute(self, name: str, args: dict[str, Any], ctx: AuthContext) -> Any:
        place = await self._place(args)
        forecast = f"{self.settings.base_url}/v1/forecast"
        query: dict[str, str | int | float] = {
            "latitude": place["latitude"],
            "longitude": place["longitude"],
            "timezone": "auto",
            **UNITS,
        }
        if name == "weather_current":
            query["current"] = ",".join([*CURRENT, "weather_code"])
            data = await self.client.get_json(SERVICE, forecast, query)
            return {"place": place, **_current(data)}
        days = int(args.get("days", DEFAULT_DAYS))
        query["daily"] = ",".join([*DAILY, "weather_code"])
        query["forecast_days"] = days
        data = await self.client.get_json(SERVICE, forecast, query)
        return {"place": place, **_daily(data, days)}

    async def _place(self, args: Mapping[str, Any]) -> dict[str, Any]:
        city = args.get("city")
        if city is None:
            return {
                "name": None,
                "country": None,
                "latitude": args["latitude"],
                "longitude": args["longitude"],
            }
        query = {"name": city.strip(), "count": 1, "language": "en", "format": "json"}
        data = await self.client.get_json(
            SERVICE, f"{self.settings.geocoding_url}/v1/search", query
        )
        results = data.get("results", []) if isinstance(data, dict) else None
        if not isinstance(results, list):
            raise malformed(SERVICE)
        if not results:
            raise ToolError(f"no place named {city.strip()!r} was found", counts_as_failure=False)
        first = results[0] if isinstance(results[0], dict) else {}  # no coordinates: malformed
        latitude = _number(first.get("latitude"), 90)
        longitude = _number(first.get("longitude"), 180)
        if latitude is None or longitude is None:
            raise malformed(SERVICE)
        return {
            "name": clean_text(first.get("name"), 80),
            "country": clean_text(first.get("country"), 80),
            "latitude": latitude,
            "longitude": longitude,
        }


# -- reading Open-Meteo's answers ----------------------------------------------------------
def _number(value: Any, bound: float = 10_000) -> float | None:
    """A finite measurement within ±bound, or ``None`` for a missing one; else malformed."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise malformed(SERVICE)
    if not math.isfinite(value) or abs(value) > bound:
        raise malformed(SERVICE)
    return round(float(value), 4)


def _weather(value: Any) -> dict[str, Any]:
    if value is None:
        return {"weather_code": None, "weather": None}
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= 99:
        raise malformed(SERVICE)
    return {"weather_code": value, "weather": WMO_CODES.get(value)}


def _section(data: Any, key: str) -> dict[str, Any]:
    section = data.get(key) if isinstance(data, dict) else None
    if not isinstance(section, dict):
        raise malformed(SERVICE)
    return section


def _check_units(data: Any, key: str, expected: Mapping[str, str]) -> None:
    units = _section(data, key)
    if any(units.get(name) != unit for name, unit in expected.items()):
        raise malformed(SERVICE)  # never pass on numbers in units we did not ask for


def _timezone(data: Any) -> str | None:
    zone = data.get("timezone") if isinstance(data, dict) else None
    return zone if isinstance(zone, str) and _ZONE.match(zone) else None


def _current(data: Any) -> dict[str, Any]:
    current = _section(data, "current")
    _check_units(data, "current_units", CURRENT)
    time = current.get("time")
    if not isinstance(time, str) or not _LOCAL_TIME.match(time):
        raise malformed(SERVICE)
    return {
        "time": time,
        "timezone": _timezone(data),
        "temperature_c": _number(current.get("temperature_2m")),
        "precipitation_mm": _number(current.get("precipitation")),
        "wind_speed_kmh": _number(current.get("wind_speed_10m")),
        **_weather(current.get("weather_code")),
    }


def _daily(data: Any, days: int) -> dict[str, Any]:
    daily = _section(data, "daily")
    _check_units(data, "daily_units", DAILY)
    columns: list[list[Any]] = []
    for key in ("time", *DAILY, "weather_code"):
        column = daily.get(key)
        if not isinstance(column, list):
            raise malformed(SERVICE)
        columns.append(column)
    if len({len(column) for column in columns}) != 1:
        raise malformed(SERVICE)
    out = []
    for date, high, low, rain, code in zip(*(column[:days] for column in columns), strict=True):
        if not isinstance(date, str) or not _DATE.match(date):
            raise malformed(SERVICE)
        out.append(
            {
                "date": date,
                "temperature_max_c": _number(high),
                "temperature_min_c": _number(low),
                "precipitation_mm": _number(rain),
                **_weather(code),
            }
        )
    return {"timezone": _timezone(data), "days": out}


def register(registry: Registrar, config: Mapping[str, Any]) -> None:
    """Register the weather tools: ``register(registry, {"base_url": …})``."""
    registry.register(WeatherPlugin(config))
