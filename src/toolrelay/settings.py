"""What every settings model shares: pydantic config, value types, TOML tables, one-line
errors, diffs. Settings are frozen pydantic models or dataclasses that refuse unknown keys;
a class built by hand (``BreakerOptions(fail_max=0)``) raises :class:`SettingsError`, a
``ValueError`` of one line naming the setting, never pydantic's multi-line report.

No error quotes the value it refuses (a token, a header, an env value or a URL with a
password may be what was malformed): it names the key path, says what was expected and,
for a value of the wrong type, what type it was (``must be a valid string, not an array``).
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import functools
import inspect
import os
import stat
import tomllib
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Annotated, Any, Generic, TypeVar

import jsonschema_rs
from pydantic import BaseModel, ConfigDict, Field, Strict, ValidationError
from pydantic.json_schema import GenerateJsonSchema
from pydantic_core import ErrorDetails, core_schema

DATACLASS = ConfigDict(extra="forbid", allow_inf_nan=False, hide_input_in_errors=True)
"""The pydantic config of every settings dataclass (declared ``frozen=True, slots=True``)."""
MODEL = ConfigDict(**DATACLASS, frozen=True, defer_build=True)
"""The pydantic config of every settings model (built on first use: imports stay fast)."""
MAX_FILE_BYTES = 1 << 20
"""The largest config file read (1 MiB): a bigger one is refused, not read."""

# Values: numbers are finite; ``True`` is no number and ``2.0`` no count; ints pass as floats.
Count = Annotated[int, Strict(), Field(ge=1)]
Seconds = Annotated[float, Strict(), Field(ge=0)]
Positive = Annotated[float, Strict(), Field(gt=0)]
Rate = Annotated[float, Strict(), Field(gt=0, le=1)]  # a share in (0, 1]
Share = Annotated[float, Strict(), Field(ge=0, le=1)]  # a share in [0, 1]
Flag = Annotated[bool, Strict()]
Text = Annotated[str, Strict()]
Name = Annotated[str, Strict(), Field(min_length=1)]
Port = Annotated[int, Strict(), Field(ge=0, le=65535)]

T = TypeVar("T")
M = TypeVar("M", bound=BaseModel)


class SettingsError(ValueError):
    """A setting that cannot be used; the message is one line naming it."""


class ConfigError(SettingsError):
    """A config file that cannot be used; the message names the key path."""


def _kind(value: Any) -> str:
    """What a value is, in TOML's words: said instead of the value, which may be a secret."""
    name = type(value).__name__
    return _KINDS.get(name, f"a {name}")


_KINDS = {"bool": "a boolean", "int": "an integer", "float": "a number", "str": "a string"}
_KINDS.update(dict="a table", list="an array", tuple="an array", NoneType="null")

_SCHEMA_PHRASES = {
    "pattern": "must match {pattern!r}",
    "minimum": "must be ≥ {limit}",
    "maximum": "must be ≤ {limit}",
    "exclusiveMinimum": "must be > {limit}",
    "exclusiveMaximum": "must be < {limit}",
    **dict.fromkeys(("minLength", "minItems"), "must have a length ≥ {limit}"),
    **dict.fromkeys(("maxLength", "maxItems"), "must have a length ≤ {limit}"),
    "minProperties": "must have ≥ {limit} key(s)",
    "const": "must be {expected_value!r}",
}
"""What a JSON Schema keyword's error says, from the keyword alone: jsonschema's own
messages begin with the refused value."""


def _phrase(error: ErrorDetails) -> str:
    """A pydantic error's clause, which never quotes its input."""
    kind, ctx = error["type"], error.get("ctx") or {}
    if kind == "value_error":
        return str(ctx.get("error", error["msg"]))
    if kind in ("literal_error", "enum"):
        return f"must be one of {ctx['expected']}"
    if kind == "greater_than_equal":
        return f"must be ≥ {ctx['ge']}"
    if kind in ("unexpected_keyword_argument", "extra_forbidden"):
        return "is not a setting"
    if not error["msg"].startswith("Input should"):
        return error["msg"][:1].lower() + error["msg"][1:]
    phrase = "must" + error["msg"].removeprefix("Input should")
    return f"{phrase}, not {_kind(error['input'])}" if kind.endswith("_type") else phrase


def _schema_phrase(error: jsonschema_rs.ValidationError) -> str:
    """A JSON Schema error's clause, which never quotes the value it refuses."""
    name, ctx = error.kind.name, error.kind.as_dict()
    if name == "type":
        types = " or ".join(map(repr, ctx["types"]))
        return f"must be of type {types}, not {_kind(error.instance)}"
    if name == "enum":
        return f"must be one of {', '.join(map(repr, ctx['options']))}"
    if name in ("required", "additionalProperties"):
        return error.message  # names keys, not values
    forms = [_schema_phrase(form[0]) for form in ctx.get("context") or () if form]
    if name in ("anyOf", "oneOf") and forms:  # each allowed form's first complaint
        return " or ".join(forms)
    phrase = _SCHEMA_PHRASES.get(name)
    return f"is not valid ({name})" if phrase is None else phrase.format(**ctx)


def explain(exc: ValidationError, where: str = "{}") -> list[str]:
    """One clause per error: ``where`` (a format with one ``{}`` for the dotted key path)
    before what is wrong; an error of the whole object is its message alone."""
    found = ((".".join(map(str, error["loc"])), _phrase(error)) for error in exc.errors())
    return [f"{where.format(path)} {clause}" if path else clause for path, clause in found]


def one_line_errors(where: str) -> Callable[[type[T]], type[T]]:
    """Make a settings class's constructor raise :class:`SettingsError` (one line, each
    setting named by ``where``, e.g. ``"BreakerOptions.{}"``) instead of pydantic's report.
    Validation inside a larger model (the config file) does not call the constructor."""

    def decorate(cls: type[T]) -> type[T]:
        init = cls.__init__

        @functools.wraps(init)
        def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
            try:
                init(self, *args, **kwargs)
            except ValidationError as exc:
                raise SettingsError("; ".join(explain(exc, where))) from None

        fields = inspect.signature(cls).parameters.values()
        self_ = inspect.Parameter("self", inspect.Parameter.POSITIONAL_ONLY)
        __init__.__signature__ = inspect.Signature([self_, *fields])  # type: ignore[attr-defined]
        cls.__init__ = __init__  # type: ignore[method-assign]
        return cls

    return decorate


class _TomlSchema(GenerateJsonSchema):
    """JSON Schema of a TOML table: no ``null`` (``None`` means "not set") and no titles."""

    def nullable_schema(self, schema: core_schema.NullableSchema) -> dict[str, Any]:
        return self.generate_inner(schema["schema"])

    def default_schema(self, schema: core_schema.WithDefaultSchema) -> dict[str, Any]:
        default = schema.get("default", ...)
        if default is None or isinstance(default, BaseModel) or dataclasses.is_dataclass(default):
            # a section: see its fields
            return self.generate_inner(schema["schema"])
        return super().default_schema(schema)

    def field_title_should_be_set(self, schema: Any) -> bool:
        return False


def schema_problems(validator: jsonschema_rs.Validator, data: Any, prefix: str = "") -> list[str]:
    """One clause per place ``data`` fails ``validator``: its dotted key path (under
    ``prefix``; ``(top level)`` for the whole) and what was expected (never the value)."""
    return [
        f"{'.'.join([prefix, *map(str, e.instance_path)]).strip('.') or '(top level)'}: "
        + _schema_phrase(e)
        for e in validator.iter_errors(data)
    ]


class TomlTable(Generic[M]):
    """A TOML table read into ``model``: checked against the JSON Schema generated from the
    model first (jsonschema's messages, as an editor using :attr:`schema` shows them), then
    built, so the model's validators check what a schema cannot say. Errors are one
    :class:`ConfigError` naming the file and each key path (under ``prefix``)."""

    def __init__(self, model: type[M], prefix: str = "") -> None:
        self.model, self.prefix = model, prefix

    @functools.cached_property  # built on first use: importing toolrelay stays fast
    def schema(self) -> dict[str, Any]:
        return {
            "$schema": "https://json-schema.org/draft/2020-12/schema",
            **self.model.model_json_schema(schema_generator=_TomlSchema),
        }

    @functools.cached_property
    def _validator(self) -> jsonschema_rs.Validator:
        return jsonschema_rs.Draft202012Validator(self.schema, offline=True)

    def __call__(self, data: Mapping[str, Any], path: Path | None = None) -> M:
        errors = schema_problems(self._validator, dict(data), self.prefix)
        if not errors:
            try:
                return self.model.model_validate(data)
            except ValidationError as exc:
                errors = explain(exc, f"{self.prefix}.{{}}:" if self.prefix else "{}:")
        shown = "; ".join(errors[:5]) + ("; …" if len(errors) > 5 else "")
        raise ConfigError(f"{path or 'config'}: {shown}")


def read_bytes(path: str | os.PathLike[str]) -> bytes:
    """A config file's bytes: a regular file of at most :data:`MAX_FILE_BYTES`, or a
    :class:`ConfigError` naming the file. Opened without waiting (a FIFO, which would block
    the reader until someone writes to it, is refused like any file that is not regular)."""
    try:
        with open(os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0)), "rb") as file:
            if not stat.S_ISREG(os.fstat(file.fileno()).st_mode):
                raise ConfigError(f"{path}: not a regular file")
            data = file.read(MAX_FILE_BYTES + 1)
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read ({exc.strerror or exc})") from None
    if len(data) > MAX_FILE_BYTES:
        raise ConfigError(f"{path}: larger than {MAX_FILE_BYTES} bytes")
    return data


def read_toml(path: str | os.PathLike[str]) -> dict[str, Any]:
    """A TOML file's content (read by :func:`read_bytes`); :class:`ConfigError` naming the
    file when it cannot be read or is not TOML. Dates and times are read as ISO 8601 text."""
    try:
        data: dict[str, Any] = _iso(tomllib.loads(read_bytes(path).decode("utf-8")))
    except UnicodeDecodeError:
        raise ConfigError(f"{path}: not UTF-8 text") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{path}: not valid TOML: {exc}") from None
    return data


def _iso(value: Any) -> Any:
    """``value`` with every TOML date and time as its ISO 8601 text (JSON has none)."""
    if isinstance(value, dict):
        return {key: _iso(item) for key, item in value.items()}
    if isinstance(value, list):
        return [_iso(item) for item in value]
    return value.isoformat() if isinstance(value, dt.date | dt.time) else value


def _entries(value: Any) -> Mapping[str, Any] | None:
    """A model's, a dataclass's or a mapping's entries; ``None`` for a plain value."""
    if isinstance(value, BaseModel):
        fields = {name: getattr(value, name) for name in type(value).model_fields}
        return {**fields, **(value.model_extra or {})}  # not dict(value): a field may be "keys"
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: getattr(value, f.name) for f in dataclasses.fields(value)}
    if isinstance(value, Mapping):
        return {str(key): item for key, item in value.items()}
    return None


def diff(old: Any, new: Any, prefix: str = "") -> dict[str, tuple[Any, Any]]:
    """What changed between two settings values: dotted key → ``(old, new)``.

    Models, dataclasses and tables are compared key by key; anything else (a list, a
    number) as a whole. A key on one side only is reported with ``None`` on the other.
    """
    if old == new:
        return {}
    old_entries, new_entries = _entries(old), _entries(new)
    if old_entries is None or new_entries is None or type(old) is not type(new):
        return {prefix: (old, new)}
    changes: dict[str, tuple[Any, Any]] = {}
    for key in dict.fromkeys([*old_entries, *new_entries]):  # one side only: None on the other
        path = f"{prefix}.{key}" if prefix else key
        changes.update(diff(old_entries.get(key), new_entries.get(key), path))
    return changes
