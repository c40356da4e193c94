"""A 2026-era client's ``tools/call`` whose upstream asks it something: ``InputRequiredResult``
rounds (what the client sees, the request state's checks and the limits: ``docs/serve.md``,
"During a call").

A 2026-era request carries no request from the server back to the client, so :class:`Rounds`
runs the call's dispatch in a task of its own, a :class:`HeldCall` (the call's
:class:`~toolrelay.sources.relay.CallChannel`): an upstream's request waits there for the
client's answer, while the client's request is answered with it. The request state is
``<tag>.<token>``; every HTTP answer names this process's tag (header ``Toolrelay-Replica``,
set by the runner's HTTP server), so a load balancer can send a call's rounds back to the
replica that holds it (deploy/haproxy.cfg).
"""

from __future__ import annotations

import secrets
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, cast

import anyio
import anyio.abc
import anyio.lowlevel
import mcp.types as types
from mcp.server.context import ServerRequestContext
from mcp.shared.exceptions import MCPError
from mcp.types.version import MODERN_PROTOCOL_VERSIONS
from pydantic import ValidationError

from ..sources.relay import R
from .channels import Channel, SessionChannel, may_be_asked, refused
from .sessions import client_key

HELD_PER_CLIENT = 8
"""The most calls waiting on one client's answers at once."""
_SETTLE_TURNS = 3  # event-loop turns for requests an upstream makes together to join a round

CallTool = Callable[
    [str, dict[str, Any] | None, types.RequestId | None], Awaitable[types.CallToolResult]
]


class _Ask:
    """One request of the upstream, waiting for the client's answer."""

    __slots__ = ("answer", "answered", "request", "result_type")

    def __init__(self, request: types.ServerRequest, result_type: type[types.Result]) -> None:
        self.request = request
        self.result_type = result_type
        self.answered = anyio.Event()
        self.answer: types.Result | types.ErrorData | None = None

    def give(self, answer: types.Result | types.ErrorData) -> None:
        if not isinstance(answer, types.ErrorData):
            try:  # as the upstream expects it (the client's answer was read as any result)
                wire = answer.model_dump(by_alias=True, mode="json", exclude_none=True)
                answer = self.result_type.model_validate(wire)
            except ValidationError:
                answer = types.ErrorData(
                    code=types.INVALID_PARAMS,
                    message=f"{self.request.method}: the client's answer is not a valid result",
                )
        self.answer = answer
        self.answered.set()


class HeldCall(Channel):
    """One call between rounds: what its upstream asks waits here for the client."""

    def __init__(
        self, rounds: Rounds, owner: str, params: types.CallToolRequestParams, first: SessionChannel
    ) -> None:
        super().__init__(first.meta)
        self.state = f"{rounds.tag}.{secrets.token_urlsafe(32)}"
        self.owner = owner
        self.call = (params.name, params.arguments or {})
        self.held = False
        """Answered with its requests; the client has not come back yet."""
        self.result: types.CallToolResult | None = None
        self._rounds = rounds
        self._first = first
        self._current: SessionChannel | None = None
        self._asks: dict[str, _Ask] = {}
        self._asked = 0
        self._changed = anyio.Event()
        self._scope = anyio.CancelScope()

    async def run(self, call: CallTool, request_id: types.RequestId | None) -> None:
        """The dispatch, in a task of the :class:`Rounds`; requests left unanswered at its
        end get an error."""
        name, arguments = self.call
        try:
            with self._scope, self:
                self.result = await call(name, arguments, request_id)
        finally:
            self._rounds.forget(self)
            left, self._asks = list(self._asks.values()), {}
            for ask in left:
                ask.give(refused(ask.request.method, "the call ended before its client answered"))
            self._changed.set()

    async def next(
        self, channel: SessionChannel
    ) -> types.CallToolResult | types.InputRequiredResult:
        """Answer the client's request: the call's result, or what the upstream asks now."""
        self._current, self.held = channel, False
        try:
            while not self.closed:
                self._changed = anyio.Event()
                if self._asks:
                    for _ in range(_SETTLE_TURNS):
                        await anyio.lowlevel.checkpoint()
                    if self._asks and not self.closed:
                        self.held = True
                        asks = {key: ask.request for key, ask in self._asks.items()}
                        requests = cast("dict[str, types.InputRequest]", asks)
                        return types.InputRequiredResult(
                            input_requests=requests, request_state=self.state
                        )
                    continue
                await self._changed.wait()
        except anyio.get_cancelled_exc_class():
            self._scope.cancel()  # the client is gone: so is its call
            raise
        finally:
            self._current = None
            channel.closed = True
        if self.result is None:
            raise MCPError(code=types.INTERNAL_ERROR, message="the call was cancelled")
        return self.result

    @property
    def waiting(self) -> bool:
        """Waiting on the client: asked (its round answered, or about to be)."""
        return self.held or bool(self._asks)

    def answer(self, responses: Mapping[str, types.Result]) -> None:
        """The client's answers, by the keys it was asked with (others are ignored)."""
        for key, response in responses.items():
            ask = self._asks.pop(key, None)
            if ask is not None:
                ask.give(response)

    # -- the CallChannel ------------------------------------------------------------------
    async def progress(self, progress: float, total: float | None, message: str | None) -> None:
        if self._current is not None:  # to the request waiting now, with its own token
            await self._current.progress(progress, total, message)

    async def log(self, params: types.LoggingMessageNotificationParams) -> None:
        if self._current is not None:
            await self._current.log(params)

    async def ask(self, request: types.ServerRequest, result_type: type[R]) -> R | types.ErrorData:
        method = request.method
        declined = self._first.declines(method)
        if declined is not None:
            return declined
        if self.closed:
            return refused(method, "the call has ended")
        if not self.waiting and self._rounds.held(self.owner) >= HELD_PER_CLIENT:
            why = f"{HELD_PER_CLIENT} calls are waiting on this client's answers already"
            return refused(method, why)
        self._asked += 1
        key = str(self._asked)
        ask = self._asks[key] = _Ask(request, result_type)
        self._changed.set()
        try:
            await ask.answered.wait()
        finally:
            self._asks.pop(key, None)  # withdrawn by the upstream: not asked any more
        return cast("R | types.ErrorData", ask.answer)


class Rounds:
    """The calls of 2026-era clients held between rounds (served while :meth:`run` runs)."""

    def __init__(self) -> None:
        self.tag = secrets.token_hex(4)
        """This process's prefix of its request states (and its ``Toolrelay-Replica``)."""
        self._calls: dict[str, HeldCall] = {}
        self._tg: anyio.abc.TaskGroup | None = None

    async def run(self) -> None:
        """Hold calls until cancelled (their tasks are cancelled with it)."""
        async with anyio.create_task_group() as tg:
            self._tg = tg
            try:
                await anyio.sleep_forever()
            finally:
                self._tg = None

    def serves(
        self, ctx: ServerRequestContext[Any, Any], params: types.CallToolRequestParams
    ) -> bool:
        """Whether this ``tools/call`` is served in rounds: a 2026-era request from a client
        that declared something an upstream may ask, or one coming back with a state."""
        if self._tg is None or ctx.protocol_version not in MODERN_PROTOCOL_VERSIONS:
            return False
        if params.request_state is not None or params.input_responses:
            return True
        return may_be_asked(ctx.session.client_capabilities)

    async def call(
        self,
        ctx: ServerRequestContext[Any, Any],
        params: types.CallToolRequestParams,
        channel: SessionChannel,
        call: CallTool,
    ) -> types.CallToolResult | types.InputRequiredResult:
        """Start the call, or resume it with the client's answers; then :meth:`HeldCall.next`."""
        scope = getattr(ctx.request, "scope", None)
        owner = "stdio" if scope is None else client_key(scope)
        if params.request_state is None and not params.input_responses:
            assert self._tg is not None
            held = HeldCall(self, owner, params, channel)
            self._calls[held.state] = held
            self._tg.start_soon(held.run, call, ctx.request_id)
            return await held.next(channel)
        resumed = self._calls.get(params.request_state or "")
        if (
            resumed is None
            or not resumed.held
            or resumed.owner != owner
            or resumed.call != (params.name, params.arguments or {})
        ):
            raise MCPError(
                code=types.INVALID_PARAMS,
                message="Invalid or expired requestState",
                data={"reason": "invalid_request_state"},
            )
        resumed.answer(params.input_responses or {})
        return await resumed.next(channel)

    def held(self, owner: str) -> int:
        """How many calls wait on ``owner``'s answers."""
        return sum(1 for call in self._calls.values() if call.waiting and call.owner == owner)

    def forget(self, call: HeldCall) -> None:
        self._calls.pop(call.state, None)
