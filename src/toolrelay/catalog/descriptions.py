"""Description checks: text written by someone else for our model, read before the model does.

Every description and title of a tool (its own, and those inside its input and output
schemas) is checked against a small, explicit rule set; a rule that matches *flags* the
tool (logged and counted once per definition), and ``[serve.catalog] descriptions =
"refuse"`` also withholds it. ``docs/catalog.md`` tables the rules and what each catches.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping
from typing import Any

RULES = ("invisible", "bidi", "html_comment", "imperative", "too_long")
_BIDI = re.compile("[\u202a-\u202e\u2066-\u2069\u200e\u200f\u061c]")
_INVISIBLE = re.compile(  # Unicode category Cf (15.0) but the bidi controls; variation selectors
    "[\u00ad\u0600-\u0605\u06dd\u070f\u0890\u0891\u08e2\u180e\u200b-\u200d"
    "\u2060-\u2064\u206a-\u206f\ufeff\ufff9-\ufffb\U000110bd\U000110cd"
    "\U00013430-\U0001343f\U0001bca0-\U0001bca3\U0001d173-\U0001d17a\U000e0001"
    "\U000e0020-\U000e007f\ufe00-\ufe0f\U000e0100-\U000e01ef]"
)
_IMPERATIVE = re.compile(
    r"\b(ignore|disregard|forget|override)\b[^.\n]{0,40}?\b(previous|prior|above|earlier|all"
    r"|other|your)\b[^.\n]{0,20}?\b(instructions?|prompts?|rules|messages|directions)\b"
    r"|\b(do not|don't|never)\s+(tell|inform|mention|reveal|show)\b[^.\n]{0,20}?\buser\b"
    r"|\bsystem prompt\b"
    r"|</?\s*(important|system|instructions?|secret|hidden)\s*>"
    r"|~/\.[A-Za-z]",
    re.IGNORECASE,
)


def _texts(defn: Mapping[str, Any]) -> Iterator[str]:
    """The description, and every ``description`` and ``title`` in the schemas."""
    if isinstance(defn.get("description"), str):
        yield defn["description"]
    stack = [defn.get("inputSchema"), defn.get("outputSchema")]
    while stack:
        node = stack.pop()
        if isinstance(node, Mapping):
            for key, value in node.items():
                if key in ("description", "title") and isinstance(value, str):
                    yield value
                else:
                    stack.append(value)
        elif isinstance(node, list):
            stack.extend(node)


def flags(defn: Mapping[str, Any], max_description_chars: int = 1024) -> list[str]:
    """The rules a tool definition (a lock entry's ``definition``) breaks, in rule order."""
    found: set[str] = set()
    for text in _texts(defn):
        if _BIDI.search(text):
            found.add("bidi")
        if _INVISIBLE.search(text):
            found.add("invisible")
        if "<!--" in text:
            found.add("html_comment")
        if _IMPERATIVE.search(text):
            found.add("imperative")
    if len(defn.get("description") or "") > max_description_chars:
        found.add("too_long")
    return [rule for rule in RULES if rule in found]
