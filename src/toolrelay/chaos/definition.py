"""What a chaos experiment is: its data (a TOML file, checked against a JSON Schema; its
tables are described in docs/chaos.md) and, for one written in Python such as the demo,
the parts data cannot hold."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import jsonschema_rs

from ..dispatcher import Dispatcher
from ..faults import Fault
from ..registry import ToolRegistry
from ..result import ToolCall, ToolResult
from ..settings import ConfigError, read_toml, schema_problems
from .record import Check, Run
from .upstream_faults import UpstreamFault

_SECONDS = {"type": "number", "minimum": 0}
EXPERIMENT_SCHEMA: dict[str, Any] = {
    "type": "object",
    "additionalProperties": False,
    "required": ["name", "config", "workload"],
    "properties": {
        "name": {"type": "string"},
        "description": {"type": "string"},
        "seed": {"type": "integer"},
        "duration_s": {"type": "number", "exclusiveMinimum": 0, "maximum": 3600},
        "settle_s": _SECONDS,
        "config": {"type": "object"},
        "upstream": {"type": "boolean"},
        "upstream_faults": {
            "description": "faults the stand-in upstream has for the whole run (its character)",
            "type": "array",
            "items": {"type": "object", "required": ["path", "fault"]},
        },
        "workload": {
            "type": "object",
            "additionalProperties": False,
            "required": ["calls"],
            "properties": {
                "agents": {"type": "integer", "minimum": 1, "maximum": 200},
                "slot_budget_s": {"type": "number", "exclusiveMinimum": 0},
                "think_s": {"type": "array", "items": _SECONDS, "minItems": 2, "maxItems": 2},
                "honour_retry_after": {"type": "boolean"},
                "calls_per_turn": {
                    "type": "array",
                    "items": {"type": "integer", "minimum": 1},
                    "minItems": 2,
                    "maxItems": 2,
                },
                "calls": {
                    "type": "array",
                    "minItems": 1,
                    "items": {
                        "type": "object",
                        "additionalProperties": False,
                        "required": ["tool"],
                        "properties": {
                            "tool": {"type": "string"},
                            "args": {"type": "object"},
                            "weight": {"type": "number", "exclusiveMinimum": 0},
                        },
                    },
                },
            },
        },
        "steady_state": {
            "type": "object",
            "additionalProperties": False,
            "properties": {
                "max_error_ratio": {"type": "number", "minimum": 0, "maximum": 1},
                "min_calls": {"type": "integer", "minimum": 0},
            },
        },
        "faults": {
            "type": "array",
            "items": {
                "type": "object",
                "required": ["from_s", "until_s"],
                "properties": {
                    "from_s": _SECONDS,
                    "until_s": _SECONDS,
                    "label": {"type": "string"},
                    "upstream_path": {"type": "string", "pattern": "^/"},
                    "upstream_fault": {"type": "string"},
                    "switch": {"type": "string"},
                },
            },
        },
        "invariants": {
            "type": "object",
            "additionalProperties": False,
            "properties": {
                "deadline_slack_ms": _SECONDS,
                "breakers": {"type": "array", "items": {"type": "string"}},
                "no_leaks": {"type": "boolean"},
            },
        },
    },
}
_VALIDATOR = jsonschema_rs.Draft202012Validator(EXPERIMENT_SCHEMA, offline=True)

WINDOW_KEYS = frozenset({"from_s", "until_s", "label"})
"""Keys of a ``faults`` item that place and name it; the rest say what the fault is."""


class Model(Protocol):
    """What one agent asks for each turn, and how long it thinks between turns."""

    def turn(self) -> list[ToolCall]: ...

    def pause(self, results: list[ToolResult]) -> float: ...


class Switch(Protocol):
    """A fault of the experiment's own, on while set (a :class:`threading.Event` is one)."""

    def set(self) -> None: ...

    def clear(self) -> None: ...


@dataclass(frozen=True)
class Extras:
    """What an experiment written in Python adds to its data."""

    tools: Callable[[ToolRegistry], object] | None = None
    """Registers tools in Python, before the config's plugins load."""
    switches: Mapping[str, Switch] = field(default_factory=dict)
    """The faults items ``{"switch": NAME}`` turn on and off."""
    model: Callable[[Dispatcher, int, int], Model] | None = None
    """``(dispatcher, seed, agent)`` → the agent's model, in place of the workload's menu."""
    checks: Callable[[Run], list[Check]] | None = None
    """The invariants, in place of the ``[invariants]`` table's."""


@dataclass
class Experiment:
    name: str
    data: dict[str, Any]
    path: Path | None = None
    extras: Extras = field(default_factory=Extras)

    @classmethod
    def load(cls, path: str | Path) -> Experiment:
        file = Path(path)
        return cls.parse(read_toml(file), file)

    @classmethod
    def parse(
        cls, data: dict[str, Any], path: Path | None = None, extras: Extras | None = None
    ) -> Experiment:
        extras = Extras() if extras is None else extras
        errors = schema_problems(_VALIDATOR, data)
        if errors:
            raise ConfigError(f"{path or 'experiment'}: {'; '.join(errors[:5])}")
        try:
            for item in data.get("faults", []):
                if "switch" in item:
                    if item["switch"] not in extras.switches:
                        raise ValueError(f"no switch named {item['switch']!r}")
                elif "upstream_path" not in item:
                    Fault.from_dict({k: v for k, v in item.items() if k not in WINDOW_KEYS})
                elif "upstream_fault" not in item:
                    raise ValueError("an upstream fault needs upstream_fault")
            for standing in data.get("upstream_faults", []):
                UpstreamFault.parse(standing)
        except (TypeError, ValueError) as exc:
            raise ConfigError(f"{path or 'experiment'}: faults: {exc}") from None
        return cls(str(data["name"]), data, path, extras)
