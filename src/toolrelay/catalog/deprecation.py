"""Deprecation windows: a tool that still works until its sunset, with a hint to move on.

``[serve.catalog.deprecated.NAME]`` declares ``since``, ``sunset`` and ``use`` (the
successor). Until the sunset the tool is offered tagged ``deprecated`` (a profile with
``deny_tags = ["deprecated"]`` opts out of it) and every answer carries
``{"use": ..., "sunset": ...}``; from the sunset on it answers ``unknown_tool`` naming the
successor (``docs/catalog.md``).
"""

from __future__ import annotations

import datetime as dt
from typing import Annotated

from pydantic import BaseModel, Field, field_validator

from ..compiled import NAME_RE
from ..settings import MODEL, Text

DEPRECATED_TAG = "deprecated"
"""The tag a deprecated tool is offered with (for ``deny_tags``)."""


class Deprecation(BaseModel):
    """``[serve.catalog.deprecated.NAME]``: one tool's deprecation window."""

    model_config = MODEL

    since: Text
    """When it was deprecated: an ISO 8601 date or date and time (as all these, a string)."""
    sunset: Text
    """The instant the tool stops answering: an ISO 8601 date (its midnight UTC) or date and
    time (UTC when it names no zone)."""
    use: Annotated[str, Field(pattern=NAME_RE.pattern)]
    """The tool that replaces it, named in every hint and in the answer after the sunset."""

    @field_validator("since", "sunset")
    @classmethod
    def _iso(cls, text: str) -> str:
        _instant(text)  # a ValueError names the field
        return text

    @property
    def sunset_at(self) -> dt.datetime:
        """The sunset as an aware datetime."""
        return _instant(self.sunset)


def _instant(text: str) -> dt.datetime:
    when = dt.datetime.fromisoformat(text)
    return when if when.tzinfo is not None else when.replace(tzinfo=dt.UTC)
