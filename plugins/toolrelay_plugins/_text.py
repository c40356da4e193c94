"""Text and URLs from upstreams, made safe to hand to a model: linear time, never raising."""

from __future__ import annotations

import html
import re
from typing import Any
from urllib.parse import urlsplit

TEXT_WINDOW_FACTOR = 8
TEXT_WINDOW_SLACK = 1024
""":func:`clean_text` reads at most ``TEXT_WINDOW_FACTOR * limit + TEXT_WINDOW_SLACK``
characters of its input."""


_BLOCK = frozenset({"p", "div", "br", "li", "ul", "ol", "tr", "td", "h1", "h2", "h3", "h4"})
_HIDDEN = ("script", "style", "template", "noscript")
_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f\u200b-\u200f\u2028-\u202e\u2060-\u206f]")
# One pass, linear: every alternative either fails within a few characters or matches
# everything it scanned (an unterminated comment, tag or hidden element runs to the end),
# so no position is scanned twice. No nested quantifiers.
_MARKUP = re.compile(
    r"<!--.*?(?:-->|\Z)"  # comment
    rf"|<(?P<hidden>{'|'.join(_HIDDEN)})\b[^>]*(?:>|\Z).*?(?:</(?P=hidden)\s*>|\Z)"  # with content
    r"|</?(?P<tag>[A-Za-z][A-Za-z0-9]*)[^>]*(?:>|\Z)"  # tag (block tags become a space)
    r"|<[!?/][^>]*(?:>|\Z)",  # declaration, CDATA, processing instruction, bogus end tag
    re.DOTALL | re.IGNORECASE,
)


def _markup(match: re.Match[str]) -> str:
    tag = match.group("tag")
    return " " if tag is not None and tag.lower() in _BLOCK else ""


def clean_text(value: Any, limit: int) -> str | None:
    """Plain text from an upstream's text or HTML: tags and control characters removed,
    whitespace collapsed, at most ``limit`` characters (cut ones end with "…"). Linear time
    (the input is cut to its window first, then one regular-expression pass) and never raises.
    """
    if not isinstance(value, str) or not value:
        return None
    window = value[: TEXT_WINDOW_FACTOR * max(limit, 1) + TEXT_WINDOW_SLACK]
    text = html.unescape(_MARKUP.sub(_markup, window))
    text = " ".join(_CONTROL.sub(" ", text).split())
    if len(text) > limit:
        text = text[: limit - 1].rstrip() + "…"
    return text or None


def safe_url(value: Any) -> str | None:
    """An absolute http(s) URL without credentials, or ``None``."""
    if not isinstance(value, str) or not 0 < len(value) <= 2048 or _CONTROL.search(value):
        return None
    if any(ch.isspace() for ch in value):
        return None
    try:
        parts = urlsplit(value)
    except ValueError:
        return None
    if parts.scheme not in ("http", "https") or not parts.hostname or "@" in parts.netloc:
        return None
    return value
