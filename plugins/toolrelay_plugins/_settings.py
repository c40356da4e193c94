"""A plugin's settings: the deadline and HTTP limits every plugin's settings model extends,
and the field types (:class:`Must` says what a setting must be, in its error message)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Annotated, Any, Self, get_args
from urllib.parse import urlsplit

import httpx
from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    Strict,
    ValidationError,
    WithJsonSchema,
)
from pydantic_core import ErrorDetails

DEFAULT_MAX_BYTES = 2 * 1024 * 1024


@dataclass(frozen=True, slots=True)
class Must:
    """What a setting must be, as a verb phrase ("be a number from 1 to 9"): the message of
    every error of the field but a validator's own (``ValueError("must …")``)."""

    text: str


Seconds = Annotated[float, Strict(), Field(ge=0.01, le=600), Must("be a number from 0.01 to 600")]


def _http_url(value: Any) -> str:
    parts = urlsplit(value) if isinstance(value, str) else None
    if parts is None or parts.scheme not in ("http", "https") or not parts.hostname or parts.query:
        raise ValueError("must be an http(s) URL without a query")
    return str(value).rstrip("/")


Url = Annotated[
    str, BeforeValidator(_http_url), WithJsonSchema({"type": "string", "pattern": "^https?://"})
]
"""An http(s) base URL without a query, kept without its trailing slash."""


class HttpSettings(BaseModel):
    """A plugin's deadline and HTTP limits; each plugin's settings model extends it.

    ``timeout_s`` is the tools' deadline in toolrelay; ``read_timeout_s`` (default: the
    same) bounds each read from the service, as a backstop: the deadline usually fires
    first, because it started earlier. :meth:`parse` reads a plugin's config table.
    """

    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)

    timeout_s: Seconds = 10.0
    connect_timeout_s: Seconds = 3.0
    read_timeout_s: Seconds | None = None
    max_response_bytes: Annotated[
        int, Strict(), Field(ge=1024, le=64 << 20), Must("be an integer from 1024 to 67108864")
    ] = DEFAULT_MAX_BYTES
    trust_env: Annotated[bool, Strict(), Must("be true or false")] = True

    @classmethod
    def parse(cls, plugin: str, config: Mapping[str, Any]) -> Self:
        """``config`` checked, or a ``ValueError`` of one line: ``"weather: 'timeout_s' must
        be a number from 0.01 to 600"`` (an unknown key first: it explains a missing one)."""
        try:
            return cls.model_validate(dict(config) if isinstance(config, Mapping) else config)
        except ValidationError as exc:
            first = min(exc.errors(), key=lambda error: error["type"] != "extra_forbidden")
            raise ValueError(f"{plugin}: {cls._complaint(first)}") from None

    @classmethod
    def _complaint(cls, error: ErrorDetails) -> str:
        path = [str(part) for part in error["loc"] if part != "[key]"]
        key = ".".join(path)
        if not path:
            return "the configuration must be a mapping"
        if error["type"] == "extra_forbidden":
            return f"unknown setting {key!r}"
        if error["type"] == "value_error":
            return f"{key!r} {error['ctx']['error']}"
        field = cls.model_fields[path[0]]
        if error["type"] == "missing" and field.description:
            return f"{key!r} ({field.description}) is required"
        inner = (m for arg in get_args(field.annotation) for m in getattr(arg, "__metadata__", ()))
        must = next((m for m in (*field.metadata, *inner) if isinstance(m, Must)), None)
        return f"{key!r}: {error['msg']}" if must is None else f"{key!r} must {must.text}"

    def httpx_timeout(self) -> httpx.Timeout:
        read = self.timeout_s if self.read_timeout_s is None else self.read_timeout_s
        return httpx.Timeout(read, connect=min(self.connect_timeout_s, read))
