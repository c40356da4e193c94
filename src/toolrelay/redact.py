"""Redaction of what the model reads: credentials never cross into an answer."""

from __future__ import annotations

import re
from collections.abc import Iterable

__all__ = ["DEFAULT_SECRET_PATTERNS", "Redactor"]

DEFAULT_SECRET_PATTERNS: tuple[str, ...] = (
    # user:password@ in URLs
    r"(?i:(?<=://)[^/\s:@]+:[^/\s@]+(?=@))",
    # Authorization header values
    r"(?i:(?<=\bbearer )[A-Za-z0-9._~+/=-]{6,})",
    r"(?i:(?<=\bbasic )[A-Za-z0-9+/=]{6,})",
    # key=value / "key": "value" secrets
    r"(?i:(?<=api_key=)[^\s&\"',;]+)",
    r"(?i:(?<=apikey=)[^\s&\"',;]+)",
    r"(?i:(?<=access_token=)[^\s&\"',;]+)",
    r"(?i:(?<=token=)[^\s&\"',;]+)",
    r"(?i:(?<=password=)[^\s&\"',;]+)",
    r"(?i:(?<=secret=)[^\s&\"',;]+)",
    # well-known token shapes
    r"\bsk-[A-Za-z0-9_-]{16,}",
    r"\bgh[pousr]_[A-Za-z0-9]{20,}",
    r"\bAKIA[0-9A-Z]{16}\b",
    r"\beyJ[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]{8,}",
)
MASK = "***"


class Redactor:
    """Replaces every match of the secret patterns with ``***``."""

    __slots__ = ("_pattern",)

    def __init__(self, patterns: Iterable[str] = (), *, defaults: bool = True) -> None:
        chosen = [*(DEFAULT_SECRET_PATTERNS if defaults else ()), *patterns]
        for pattern in chosen:
            re.compile(pattern)  # a bad pattern fails here, with its own message
        self._pattern = re.compile("|".join(f"(?:{p})" for p in chosen)) if chosen else None

    def __call__(self, text: str) -> str:
        if self._pattern is None or not text:
            return text
        return self._pattern.sub(MASK, text)
