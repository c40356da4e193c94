"""A typed tool's descriptions, from its docstring (Google, NumPy or Sphinx style, parsed
by griffe, imported only when a typed tool has a docstring)."""

from __future__ import annotations

import functools
import inspect
import re
from collections.abc import Callable
from typing import Any, Literal

_ARGS_HEADER = re.compile(r"^(args|arguments|params|parameters|keyword args):\s*$", re.I)


def _docstring_style(doc: str) -> Literal["google", "numpy", "sphinx"]:
    if re.search(r"^:(param|parameter|arg|argument|type|returns?|rtype|raises?)\b", doc, re.M):
        return "sphinx"
    if re.search(r"^\s*(Parameters|Returns|Yields|Raises)\s*\n\s*-{3,}", doc, re.M):
        return "numpy"
    return "google"


def _blank_before_args(doc: str) -> str:
    """griffe skips a Google ``Args:`` header with no blank line above it."""
    lines = doc.splitlines()
    out: list[str] = []
    for index, line in enumerate(lines):
        if out and out[-1].strip() and _ARGS_HEADER.match(line) and index + 1 < len(lines):
            out.append("")
        out.append(line)
    return "\n".join(out)


def docstring(fn: Callable[..., Any]) -> tuple[str, dict[str, str]]:
    """The description (the docstring's first paragraph, lines joined) and each parameter's
    description (Google, NumPy or Sphinx style, parsed by griffe)."""
    target = fn.func if isinstance(fn, functools.partial) else fn
    doc = inspect.getdoc(target)
    if not doc:
        return "", {}
    import griffe  # only typed tools with a docstring need it

    style = _docstring_style(doc)
    options: griffe.DocstringOptions
    if style == "google":
        doc = _blank_before_args(doc)
        options = griffe.GoogleOptions(warnings=False)
    elif style == "numpy":
        options = griffe.NumpyOptions(warnings=False)
    else:
        options = griffe.SphinxOptions(warnings=False)
    sections = griffe.Docstring(doc, lineno=1, parser=style, parser_options=options).parse()
    text = next((s.value for s in sections if s.kind is griffe.DocstringSectionKind.text), "")
    first = str(text).strip().split("\n\n", 1)[0]
    described: dict[str, str] = {}
    for section in sections:
        if isinstance(section, griffe.DocstringSectionParameters):
            for param in section.value:
                described.setdefault(param.name.lstrip("*"), " ".join(param.description.split()))
    return " ".join(first.split()), described
