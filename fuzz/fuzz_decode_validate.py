"""Coverage-guided fuzz target for argument decoding and schema validation (atheris).

Every input becomes raw arguments in one of the forms a host hands over (bytes, text with
lone surrogates, Latin-1 text, a mapping) under varying size and depth limits, and goes
through ``toolrelay.pipeline.decode.decode_arguments`` and the compiled validator of a tool
registered through the public ``ToolRegistry``. Invariants:

* ``decode_arguments`` returns a ``dict`` or a non-empty, printable, one-line ``str``;
  it never raises.
* Text and bytes over ``max_bytes`` (UTF-8) are refused; accepted text is strict JSON
  (no NaN/Infinity, no duplicate keys, string keys, depth within ``max_depth``) and equals
  what the standard library parses; text the standard library parses within those rules
  is accepted (a differential check both ways).
* The validator's ``is_valid`` and ``iter_errors`` return normally or raise only what the
  validate stage documents (``ValueError``, ``TypeError``, ``OverflowError``); they agree
  with each other, and with the pure-Python ``jsonschema`` package on strict JSON.

Run it (see docs/security.md)::

    .venv/bin/pip install -e '.[fuzz]'
    mkdir -p /tmp/fuzz-corpus
    .venv/bin/python fuzz/fuzz_decode_validate.py -dict=fuzz/decode_validate.dict \\
        -max_total_time=3600 -timeout=10 /tmp/fuzz-corpus fuzz/corpus

``check_one(data)`` is the target itself; ``tests/test_fuzz.py`` runs it over a corpus of
hostile inputs without atheris, and a short atheris run when atheris is installed.
"""

from __future__ import annotations

import json
import math
import sys
from collections.abc import Mapping
from typing import Any

try:
    import atheris
except ImportError:  # the target still runs without atheris (tests/test_fuzz.py)
    atheris = None

if atheris is not None:
    with atheris.instrument_imports(include=["toolrelay"]):
        from toolrelay import ToolRegistry
        from toolrelay.pipeline.decode import decode_arguments
else:
    from toolrelay import ToolRegistry
    from toolrelay.pipeline.decode import decode_arguments

try:
    import jsonschema
except ImportError:  # the oracle is optional
    jsonschema = None

SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "city": {"type": "string", "minLength": 1, "maxLength": 12},
        "days": {"type": "integer", "minimum": 1, "maximum": 14},
        "ratio": {"type": "number", "exclusiveMinimum": 0, "maximum": 1},
        "tags": {"type": "array", "items": {"type": "string"}, "maxItems": 3, "uniqueItems": True},
        "mode": {"enum": ["fast", "slow", 1, None]},
        "flag": {"const": True},
        "opts": {
            "type": "object",
            "properties": {"metric": {"type": "boolean"}},
            "required": ["metric"],
            "additionalProperties": False,
        },
        "either": {"anyOf": [{"type": "string"}, {"type": "array", "maxItems": 1}]},
        "nested": {"$ref": "#/$defs/node"},
    },
    "additionalProperties": {"type": ["integer", "null"]},
    "$defs": {
        "node": {
            "type": "object",
            "properties": {"child": {"$ref": "#/$defs/node"}, "v": {"type": "integer"}},
            "additionalProperties": False,
        }
    },
}
DOCUMENTED = (ValueError, TypeError, OverflowError)
DEPTHS = (1, 2, 3, 8, 64)
SIZES = (8, 64, 1024, 256 * 1024)
MAX_REASON_CHARS = 200


def _compile() -> Any:
    registry = ToolRegistry()
    registry.tool(name="fuzzed", parameters=SCHEMA)(lambda args, ctx: None)
    tool = registry.resolve("fuzzed")
    assert tool is not None
    return tool.validator


VALIDATOR = _compile()
ORACLE = None if jsonschema is None else jsonschema.Draft202012Validator(SCHEMA)


class _Refused(ValueError):
    pass


def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    keys = [key for key, _ in pairs]
    if len(set(keys)) != len(keys):
        raise _Refused("duplicate key")
    return dict(pairs)


def _no_constant(name: str) -> Any:
    raise _Refused(name)


def _finite(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise _Refused(text)
    return value


def depth(value: Any, *, leaves: bool = False) -> int:
    """Nesting depth as toolrelay documents it: objects and arrays count, the top object
    is level 1, scalars add nothing (with ``leaves``, a scalar counts as a level too)."""
    deepest, stack = 0, [(value, 1)]
    while stack:
        node, level = stack.pop()
        container = isinstance(node, Mapping | list | tuple)
        if leaves or container:
            deepest = max(deepest, level)
        if isinstance(node, Mapping):
            stack.extend((child, level + 1) for child in node.values())
        elif isinstance(node, list | tuple):
            stack.extend((child, level + 1) for child in node)
    return deepest


def reference(text: str, max_depth: int, *, leaves: bool = False) -> dict[str, Any] | None:
    """The standard library's reading under toolrelay's documented rules, or None."""
    if not text or text.isspace():
        return {}
    try:
        value = json.loads(
            text,
            object_pairs_hook=_no_duplicates,
            parse_constant=_no_constant,
            parse_float=_finite,
        )
    except (ValueError, RecursionError):
        return None
    if not isinstance(value, dict) or depth(value, leaves=leaves) > max_depth:
        return None
    return value


def strict_json(value: Any) -> bool:
    try:
        json.dumps(value, allow_nan=False)
    except (ValueError, TypeError, RecursionError):
        return False
    return _string_keys(value)


def _string_keys(value: Any) -> bool:
    stack = [value]
    while stack:
        node = stack.pop()
        if isinstance(node, dict):
            if not all(isinstance(k, str) for k in node):
                return False
            stack.extend(node.values())
        elif isinstance(node, list):
            stack.extend(node)
    return True


def has_surrogate(value: Any) -> bool:
    text = json.dumps(value, ensure_ascii=False, default=repr)
    return any(0xD800 <= ord(ch) <= 0xDFFF for ch in text)


def raw_from(data: bytes) -> tuple[Any, int, int]:
    """Raw arguments, max_bytes and max_depth from one fuzz input."""
    if len(data) < 3:
        return data, SIZES[-1], DEPTHS[-1]
    mode, size, deep, body = data[0] % 6, data[1], data[2], data[3:]
    max_bytes, max_depth = SIZES[size % len(SIZES)], DEPTHS[deep % len(DEPTHS)]
    if mode == 0:
        return body, max_bytes, max_depth
    if mode == 1:
        return body.decode("utf-8", "surrogateescape"), max_bytes, max_depth  # lone surrogates
    if mode == 2:
        return body.decode("latin-1"), max_bytes, max_depth
    if mode == 3:
        return body.decode("utf-8", "replace"), max_bytes, max_depth
    if mode == 4:
        return bytearray(body), max_bytes, max_depth
    try:  # a mapping, as a lenient parser (NaN and all) would hand it over
        value = json.loads(body.decode("utf-8", "replace"))
    except (ValueError, RecursionError):
        value = {"raw": body.decode("latin-1")}
    return (value if isinstance(value, dict) else {"v": value}), max_bytes, max_depth


def check_decode(raw: Any, max_bytes: int, max_depth: int) -> dict[str, Any] | None:
    result = decode_arguments(raw, max_bytes, max_depth)
    if isinstance(result, str):
        assert result, "empty reason"
        assert result.isprintable() and "\n" not in result, repr(result)
        assert len(result) <= MAX_REASON_CHARS, len(result)
        if isinstance(raw, Mapping):
            return None
        text = raw if isinstance(raw, str) else _utf8(raw)
        if text is not None and not _too_big(raw, max_bytes):
            accepted = reference(text, max_depth)
            assert accepted is None, f"refused ({result}) what the standard library reads"
        return None
    assert isinstance(result, dict), type(result)
    assert all(isinstance(k, str) for k in result)
    if isinstance(raw, Mapping):
        assert depth(result) <= max_depth, (depth(result), max_depth)
        assert result == dict(raw)
        return result
    assert depth(result, leaves=False) <= max_depth, (depth(result, leaves=False), max_depth)
    assert not _too_big(raw, max_bytes), "accepted arguments over the size cap"
    assert strict_json(result), "accepted text that is not strict JSON"
    text = raw if isinstance(raw, str) else _utf8(raw)
    assert text is not None, "accepted bytes that are not UTF-8"
    expected = reference(text, max_depth, leaves=False)
    assert expected is not None, "accepted what the standard library refuses"
    assert result == expected, (result, expected)
    return result


def _utf8(raw: bytes | bytearray | memoryview) -> str | None:
    try:
        return bytes(raw).decode("utf-8")
    except UnicodeDecodeError:
        return None


def _too_big(raw: Any, max_bytes: int) -> bool:
    if isinstance(raw, str):
        return len(raw.encode("utf-8", "surrogatepass")) > max_bytes
    return len(raw) > max_bytes


def check_validate(args: Any) -> None:
    try:
        valid = VALIDATOR.is_valid(args)
    except DOCUMENTED:
        return
    assert isinstance(valid, bool)
    try:
        errors = list(VALIDATOR.iter_errors(args))
    except DOCUMENTED:
        # Tolerated here, but the validate stage does not catch it: see
        # tests/test_properties.py::test_arguments_failing_the_schema_never_answer_internal_error
        return
    assert valid == (not errors), (valid, [e.message for e in errors])
    if ORACLE is not None and strict_json(args) and not has_surrogate(args):
        assert ORACLE.is_valid(args) == valid, ("jsonschema disagrees", args, valid)


def check_one(data: bytes) -> None:
    """The fuzz target: raises AssertionError when an invariant breaks."""
    raw, max_bytes, max_depth = raw_from(data)
    args = check_decode(raw, max_bytes, max_depth)
    if args is not None:
        check_validate(args)


def main() -> None:
    if atheris is None:
        sys.exit("atheris is not installed: pip install -e '.[fuzz]'")
    atheris.Setup(sys.argv, check_one)
    atheris.Fuzz()


if __name__ == "__main__":
    main()
