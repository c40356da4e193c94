"""The admin API's request and response bodies, as pydantic models (FastAPI validates with
them and generates the OpenAPI document from them). A model that shows a runtime object is
named ``…View``. A fault's fields are :class:`~toolrelay.faults.Fault`'s own, so the API
and ``[[faults]]`` cannot drift apart, and its body is built into a ``Fault``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated, Any, Literal, Self, TypeAlias

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Discriminator,
    Field,
    Tag,
    WithJsonSchema,
    create_model,
    model_validator,
)

from ..faults import Fault

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


class UpstreamView(BaseModel):
    name: str
    state: Literal["connected", "reconnecting", "down"]
    optional: bool = Field(description="Whether the gateway is ready without it.")
    failures: int = Field(
        ge=0, description="Connection attempts that failed and connections lost so far."
    )
    last_error: str | None = Field(default=None, description="The last failure, in short.")
    last_error_at: float | None = Field(
        default=None, description="When the last failure happened (seconds since the epoch)."
    )


class Readiness(BaseModel):
    ready: bool
    tools: int | None = Field(default=None, ge=0, description="Tools registered (when ready).")
    reason: str | None = Field(default=None, description="Why not (when not ready).")
    upstreams: list[UpstreamView] | None = Field(
        default=None, description="Every upstream MCP server's state (when there are any)."
    )
    config_hash: str | None = Field(
        default=None,
        description="SHA-256 of the config file in force (a failed reload keeps the old one).",
    )


class BreakerView(BaseModel):
    state: BreakerState
    failures: int = Field(ge=0)
    trials_in_flight: int = Field(ge=0)
    retry_after_s: float | None = Field(
        description="Seconds until a trial call is admitted (open breakers only)."
    )
    pinned_open: bool = Field(description="Forced open: no trial calls until closed or reset.")
    failure_rate: _Share | None = Field(
        description="Failed share of the calls in the window; null for the consecutive "
        "window (`failures` is its count in a row)."
    )
    slow_call_rate: _Share | None = Field(
        description="Slow share of the calls in the window; null for the consecutive window."
    )
    break_s: _Seconds = Field(description="How long an opening lasts before a trial.")


class BreakerWithKey(BreakerView):
    key: str


class BreakersView(BaseModel):
    breakers: dict[str, BreakerView]


class _FaultBody(BaseModel):
    """What :data:`FaultSpec` adds to :class:`~toolrelay.faults.Fault`'s fields:
    ``null`` is refused (leave a key out instead), and ``Fault``'s own rules apply."""

    model_config = ConfigDict(
        extra="forbid",
        allow_inf_nan=False,
        json_schema_extra={"oneOf": [{"required": ["tool"]}, {"required": ["breaker_key"]}]},
    )

    @model_validator(mode="after")
    def _is_a_fault(self) -> Self:
        self.fault()  # Fault's own rules raise ValueError: a 422 naming the fault
        return self

    def fault(self) -> Fault:
        return Fault(**self.model_dump(mode="json", exclude_unset=True, exclude={"id"}))


if TYPE_CHECKING:
    FaultSpec: TypeAlias = _FaultBody
    FaultInForce: TypeAlias = _FaultBody
else:  # Fault's fields, with a tool name or breaker key that is a string when given
    FaultSpec = create_model(
        "FaultSpec",
        __base__=_FaultBody,
        __doc__="One fault to put in force: the ``[[faults]]`` entry of ``toolrelay.toml``.",
        __module__=__name__,
        **{
            key: (_Target, None) if key in ("tool", "breaker_key") else (info.annotation, info)
            for key, info in Fault.__pydantic_fields__.items()
        },
    )
    FaultInForce = create_model(
        "FaultInForce", __base__=FaultSpec, __module__=__name__, id=(int, Field(ge=1))
    )


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


class Faults(BaseModel):
    faults: list[FaultInForce]


class FaultsAdded(Faults):
    added: list[int] = Field(description="The ids of the faults just added.")


class Removed(BaseModel):
    removed: int = Field(ge=0, description="How many faults were removed.")


class Reloaded(BaseModel):
    changed: list[str] = Field(
        description="Changed settings, as dotted keys (breakers.search.fail_max, serve.http.port)."
    )
    breakers: list[str] = Field(description="Breaker keys whose settings changed (state kept).")
    profiles: list[str | None] = Field(
        description="Profiles whose tool list changed (null: callers without a profile); "
        "their MCP clients were sent tools/list_changed."
    )


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
