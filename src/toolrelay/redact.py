"""Redaction: credentials never cross into an answer, an audit line, a log line or a span.

A :class:`Redactor` masks text (``redactor(text)``) and JSON-like values
(``redactor.value(obj)``: strings through the patterns, and whatever sits under a
secret-named key, like ``password`` or ``apiKey``, masked whole). The dispatcher owns one,
built from the defaults below plus the host's ``secret_patterns``; docs/security.md lists
what it is applied to.

Every pattern is linear-time (no nested quantifiers, no backreferences), and a default
pattern runs only when the text holds one of its hint words, so text without a hint of a
secret costs a few substring checks. Redaction runs only on failure messages, exception
text and opted-in content (audited arguments, captured span content), never on a
successful call's path.
"""

from __future__ import annotations

import re
import traceback
from collections.abc import Callable, Iterable, Mapping
from typing import Any

MASK = "***"

# Names whose value is a secret, in text (``password: x``, ``"api_key": "x"``, ``token=x``)
# and as keys of structured values (also ``x-api-key``, ``clientSecret``, ``db_password``).
_KEY_NAMES = (
    r"api[_-]?key|access[_-]?key|secret[_-]?key|private[_-]?key"
    r"|token|passw(?:or)?d|secret"
)
# ``key`` + optional closing quote (JSON, Python repr, JSON escaped inside JSON or in a
# repr: up to three backslashes) + ``:`` or ``=`` (or their URL encodings, ``%3A``, ``%3D``).
_SEPARATOR = r"""\\{0,3}["']?\s*(?:[:=]|%3[AaDd])\s*"""
_KEYED = rf"(?:{_KEY_NAMES}){_SEPARATOR}"
# An ``Authorization`` header of any scheme (``Token``, ``ApiKey``, …; Bearer and Basic have
# their own pattern), or none, and its opening quote: the credentials follow.
_AUTHORIZATION = rf"""\bauthorization{_SEPARATOR}\\{{0,3}}["']?(?:[A-Za-z][\w-]*[ \t]+)?"""
_COOKIE = rf"""\b(?:set-)?cookie{_SEPARATOR}\\{{0,3}}["']?"""

_DEFAULTS: tuple[tuple[tuple[str, ...], str], ...] = (
    # (hints: lower-case text one of which a match must contain, pattern)
    # user:password@ in URLs (the scheme's "://" is kept)
    (("://",), r"://[^/\s:@]+:[^/\s@]+(?=@)"),
    # Authorization credentials, after any whitespace (or its JSON escape); the scheme is kept
    (("bearer", "basic"), r"(?i:\b(?:bearer|basic)(?:\s|\\[tnr])+[A-Za-z0-9._~+/=-]{6,})"),
    # other Authorization schemes (``Token <hex>``), and every cookie of a Cookie header
    (("authorization",), rf"""(?i:{_AUTHORIZATION}(?!bearer|basic)[^\s"'\\,;&]+)"""),
    (("cookie",), rf"""(?i:{_COOKIE}[^\r\n"'\\]+)"""),
    # key=value, key: value, "key": "value", 'key': 'value', {\"key\": \"value\"}: the key
    # and the separator are kept, the value is masked (a quoted one up to its closing quote,
    # an unquoted one with its Authorization scheme: ``token: Bearer x``)
    (
        ("key", "token", "passw", "secret"),
        rf"""(?i:{_KEYED}(?:\\{{0,3}}"[^"\\\r\n]*|'[^'\\\r\n]*"""
        r"""|(?:bearer\s+|basic\s+)?[^\s"'&,;<>(){}\[\]\\]+))""",
    ),
    # well-known token shapes
    (("sk-",), r"\bsk-[A-Za-z0-9_-]{16,}"),
    (("ghp_", "gho_", "ghu_", "ghs_", "ghr_"), r"\bgh[pousr]_[A-Za-z0-9]{20,}"),
    (("github_pat_",), r"\bgithub_pat_[A-Za-z0-9_]{20,}"),
    (("glpat-",), r"\bglpat-[A-Za-z0-9_-]{20,}"),
    (("xox",), r"\bxox[abposr]-[A-Za-z0-9-]{10,}"),
    (("akia",), r"\bAKIA[0-9A-Z]{16}\b"),
    (("aiza",), r"\bAIza[0-9A-Za-z_-]{35}"),
    (("eyj",), r"\beyJ[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]{8,}"),
    (("private key-----",), r"-----BEGIN [A-Z ]{0,40}PRIVATE KEY-----[A-Za-z0-9+/=\s\\]*"),
)
_COMPILED_DEFAULTS = tuple((hints, re.compile(pattern)) for hints, pattern in _DEFAULTS)

# What a match keeps of itself: a URL's "://", an Authorization scheme and its whitespace,
# a secret key with its separator and opening quote. Applied to matched text only.
_KEEP = re.compile(
    rf"""://|(?i:(?:bearer|basic)(?:\s|\\[tnr])+|{_AUTHORIZATION}|{_COOKIE}"""
    rf"""|{_KEYED}(?:\\{{0,3}}["'])?"""
    r"|-----BEGIN [A-Z ]{0,40}PRIVATE KEY-----)"
)
# A key of a structured value that holds a secret: it ends with one of the names
# (``password``, ``db_password``, ``apiKey``, ``x-api-key``, ``clientSecret``), or names an
# HTTP credential header. ``max_tokens`` and ``tokenizer`` are not secrets.
_SECRET_KEY = re.compile(rf"(?i:{_KEY_NAMES}|authorization|cookie|credentials?)\Z")
_MAX_DEPTH = 100
_SCALARS = (int, float, bool, type(None))


def _mask(match: re.Match[str]) -> str:
    text = match.group()
    keep = _KEEP.match(text)
    return MASK if keep is None else text[: keep.end()] + MASK


class Redactor:
    """Replaces every match of the secret patterns with ``***`` (keeping a key or scheme
    in front of it: ``password: ***``, ``Bearer ***``).

    The host's patterns run first, as one expression; then each default pattern whose
    hint (a word every match contains, like ``bearer`` or ``token``) occurs in the text,
    so text without a hint of a secret costs a few substring checks.
    """

    __slots__ = ("_custom", "_defaults")

    def __init__(self, patterns: Iterable[str] = (), *, defaults: bool = True) -> None:
        custom = list(patterns)
        for pattern in custom:
            re.compile(pattern)  # a bad pattern fails here, with its own message
        self._custom = re.compile("|".join(f"(?:{p})" for p in custom)) if custom else None
        self._defaults = _COMPILED_DEFAULTS if defaults else ()

    def __call__(self, text: str) -> str:
        if not text:
            return text
        if self._custom is not None:
            text = self._custom.sub(_mask, text)
        if self._defaults:
            lowered = text.lower()
            for hints, pattern in self._defaults:
                for hint in hints:
                    if hint in lowered:
                        text = pattern.sub(_mask, text)
                        break
        return text

    def value(self, obj: Any) -> Any:
        """A redacted copy of a JSON-like value (``obj`` itself is never changed).

        Strings (keys included) go through the patterns; a value under a secret-named key
        is masked whole, whatever its type; bytes and other objects become redacted text;
        nesting deeper than 100 levels is masked.
        """
        return self._value(obj, 0)

    def _value(self, obj: Any, depth: int) -> Any:
        if isinstance(obj, str):
            return self(obj)
        if isinstance(obj, _SCALARS):
            return obj
        if depth >= _MAX_DEPTH:
            return MASK
        if isinstance(obj, Mapping):
            out: dict[Any, Any] = {}
            for key, item in obj.items():
                name = self(key) if isinstance(key, str) else key
                secret = isinstance(key, str) and _SECRET_KEY.search(key) is not None
                out[name] = MASK if secret else self._value(item, depth + 1)
            return out
        if isinstance(obj, list | tuple):
            return [self._value(item, depth + 1) for item in obj]
        if isinstance(obj, bytes | bytearray):
            return self(bytes(obj).decode("utf-8", "replace"))
        try:
            return self(str(obj))
        except Exception:  # an object whose str() fails: nothing of it is shown
            return f"<{type(obj).__name__}>"


def describe_exception(exc: BaseException, redact: Callable[[str], str]) -> str:
    """The exception's traceback (its causes and context included) as text, redacted.

    For log lines: a record's ``exc_info`` would be formatted by the logging handler, out of
    reach of redaction, so toolrelay logs this text instead.
    """
    try:
        text = "".join(traceback.format_exception(exc)).rstrip()
    except Exception:  # pragma: no cover - format_exception guards str() failures itself
        text = type(exc).__name__
    return redact(text)
