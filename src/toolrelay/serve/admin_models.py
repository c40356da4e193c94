"""The admin API's request and response bodies, as pydantic models.

FastAPI validates requests with them and generates the OpenAPI document from them. A fault
is checked twice over: the model's types and bounds (what the document shows), then
:class:`~toolrelay.pipeline.faults.Fault`'s own rules (one target, the size of ``output``).
"""

from __future__ import annotations

from typing import Annotated, Any, Literal, Self

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Discriminator,
    Field,
    Tag,
    WithJsonSchema,
    model_validator,
)

from ..contract import ErrorType
from ..pipeline.faults import Fault, FaultKind

__all__ = [
    "MAX_FAULTS",
    "Breaker",
    "BreakerWithKey",
    "Breakers",
    "Error",
    "FaultInForce",
    "FaultSpec",
    "Faults",
    "FaultsAdded",
    "FaultsBody",
    "Health",
    "Readiness",
    "Removed",
    "ToolInfo",
    "Tools",
]

MAX_FAULTS = 100
"""The most faults in force at once (and in one ``PUT /faults``)."""

BreakerState = Literal["closed", "open", "half_open"]
_Seconds = Annotated[float, Field(ge=0, allow_inf_nan=False)]
_Share = Annotated[float, Field(ge=0, le=1, allow_inf_nan=False)]


def _not_null(value: Any) -> Any:
    if value is None:
        raise ValueError("leave it out instead of null")
    return value


_Target = Annotated[str | None, BeforeValidator(_not_null), WithJsonSchema({"type": "string"})]
"""A tool name or a breaker key: a string when given (None only when left out)."""


class Error(BaseModel):
    """Every 4xx answer."""

    error: str = Field(description="A stable, machine-readable code.")
    message: str = Field(description="One sentence for a person.")


class Health(BaseModel):
    status: Literal["ok"]


class Readiness(BaseModel):
    ready: bool
    tools: int | None = Field(default=None, ge=0, description="Tools registered (when ready).")
    reason: str | None = Field(default=None, description="Why not (when not ready).")


class Breaker(BaseModel):
    state: BreakerState
    failures: int = Field(ge=0)
    trials_in_flight: int = Field(ge=0)
    retry_after_s: float | None = Field(
        description="Seconds until a trial call is admitted (open breakers only)."
    )
    pinned_open: bool = Field(description="Forced open: no trial calls until closed or reset.")
    failure_rate: _Share = Field(description="Failed share of the calls in the window.")
    slow_call_rate: _Share = Field(description="Slow share of the calls in the window.")
    break_s: _Seconds = Field(description="How long an opening lasts before a trial.")


class BreakerWithKey(Breaker):
    key: str


class Breakers(BaseModel):
    breakers: dict[str, Breaker]


class FaultSpec(BaseModel):
    """One fault to put in force: the ``[[faults]]`` entry of ``toolrelay.toml``."""

    model_config = ConfigDict(
        extra="forbid",
        strict=True,
        json_schema_extra={"oneOf": [{"required": ["tool"]}, {"required": ["breaker_key"]}]},
    )

    kind: FaultKind
    tool: _Target = None
    breaker_key: _Target = None
    rate: _Share = 1.0
    latency_s: _Seconds = 0.0
    jitter_s: _Seconds = 0.0
    error_type: ErrorType = Field(default=ErrorType.TOOL_ERROR, strict=False)
    message: str = Field(default="injected fault", max_length=240)
    retryable: bool = True
    output: Any = None

    @model_validator(mode="after")
    def _is_a_fault(self) -> Self:
        self.fault()  # Fault's own rules raise ValueError: a 422 naming the fault
        return self

    def fault(self) -> Fault:
        return Fault(**self.model_dump(mode="json", exclude_unset=True, exclude={"id"}))


def _shape(body: Any) -> str | None:
    return "many" if isinstance(body, list) else "one" if isinstance(body, dict) else None


FaultsBody = Annotated[
    Annotated[FaultSpec, Tag("one")]
    | Annotated[list[FaultSpec], Field(min_length=1, max_length=MAX_FAULTS), Tag("many")],
    Discriminator(
        _shape,
        custom_error_type="not_a_fault",
        custom_error_message="is not of type object (a fault) or array (a list of faults)",
    ),
]
"""The body of ``PUT /faults``: one fault, or a list of faults (all or none)."""


class FaultInForce(FaultSpec):
    id: int = Field(ge=1)


class Faults(BaseModel):
    faults: list[FaultInForce]


class FaultsAdded(Faults):
    added: list[int] = Field(description="The ids of the faults just added.")


class Removed(BaseModel):
    removed: int = Field(ge=0, description="How many faults were removed.")


class ToolInfo(BaseModel):
    name: str
    description: str
    risk: Literal["read", "write", "dangerous"]
    breaker_key: str
    timeout_s: float
    idempotent: bool
    tags: list[str]
    version: str
    breaker_state: BreakerState
    offered: bool = Field(
        description="Listed to MCP clients now (false while its breaker blocks calls)."
    )


class Tools(BaseModel):
    tools: list[ToolInfo]
