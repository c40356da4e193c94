"""The upstream MCP servers' resources, prompts and completions, served to the gateway's
clients (routing, paging and errors: ``docs/serve.md``, "Resources, prompts and
completions").

:class:`Offerings` merges what every upstream offers (each upstream's lists are kept by a
:class:`~toolrelay.sources.mcp_lists.Listing`) and routes each request to the upstream that
owns it. Each request to an upstream runs as a tool call does: within the upstream's
``timeout_s``, admitted and counted by the upstream's breaker, its answer under the output
cap. A caller's profile hides (and refuses) the resources and prompts it does not reach
(:meth:`~toolrelay.policy.Profile.reaches`).
"""

from __future__ import annotations

import base64
import logging
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from typing import Any, TypeVar

import anyio
import mcp.types as types
from mcp import Client
from mcp.server.context import ServerRequestContext
from mcp.server.lowlevel.server import Server
from mcp.shared.exceptions import MCPError
from mcp.shared.subscriptions import ResourceUpdated, ServerEvent

from ..breakers import REJECT
from ..dispatcher import Dispatcher
from ..outcome import Verdict
from ..policy import Profile
from ..sources.mcp import McpSource
from ..sources.mcp_lists import Listing, UpstreamFailure
from .callers import Callers
from .client_limits import ClientLimits
from .errors import ServeError
from .settings import UpstreamSettings
from .subscriptions import Subscriptions
from .watch import ToolListWatcher

log = logging.getLogger("toolrelay.serve")

PAGE_SIZE = 100
"""Items per page of a list the gateway answers."""
RESOURCE_NOT_FOUND = -32002
"""The MCP error code of a resource nobody offers (or the caller may not read)."""
T = TypeVar("T")
Ctx = ServerRequestContext[Any]


def _page(items: Sequence[T], cursor: str | None) -> tuple[list[T], str | None]:
    start = 0
    if cursor is not None:
        try:
            start = int(base64.urlsafe_b64decode(cursor.encode()).decode())
        except ValueError:
            start = -1
        if not 0 <= start <= len(items):
            raise MCPError(code=types.INVALID_PARAMS, message="Invalid cursor")
    end = start + PAGE_SIZE
    after = base64.urlsafe_b64encode(str(end).encode()).decode() if end < len(items) else None
    return list(items[start:end]), after


class Offerings:
    """Serves resources, prompts and completions of the upstreams in ``upstreams`` (the
    live ``Upstreams.open``) once :meth:`start` has read them; :meth:`run` keeps 2026-era
    upstreams' change streams open."""

    def __init__(
        self,
        server: Server[Any],
        dispatcher: Dispatcher,
        callers: Callers,
        watcher: ToolListWatcher,
        limits: Callable[[], ClientLimits],
    ) -> None:
        self.server = server
        self.dispatcher = dispatcher
        self.callers = callers
        self.watcher = watcher
        self.limits = limits
        self._upstreams: Mapping[str, tuple[UpstreamSettings, McpSource]] = {}
        self._listings: dict[int, Listing] = {}
        self._prepared: dict[int, Listing] = {}
        """Upstreams a reload connected, read before they are registered."""
        self.subscriptions = Subscriptions(self._owner, self._ask)
        """Who holds which upstream subscription (2025-era sessions, 2026-era streams)."""

    # -- start ----------------------------------------------------------------------------
    async def start(self, upstreams: Mapping[str, tuple[UpstreamSettings, McpSource]]) -> None:
        """Read every upstream's lists, refuse a URI, template or prompt name two upstreams
        offer (:class:`ServeError`), and serve the methods some upstream offers."""
        self._upstreams = upstreams
        listings = await self._fresh()
        self.check()
        caps, subs = [listing.capabilities for listing in listings], self.subscriptions
        handlers: list[tuple[str, type[Any], Any]] = []
        if any(c.resources is not None for c in caps):
            handlers += [
                ("resources/list", types.PaginatedRequestParams, self._list_resources),
                ("resources/templates/list", types.PaginatedRequestParams, self._list_templates),
                ("resources/read", types.ReadResourceRequestParams, self._read),
                ("resources/subscribe", types.SubscribeRequestParams, subs.subscribe),
                ("resources/unsubscribe", types.UnsubscribeRequestParams, subs.unsubscribe),
            ]
        if any(c.prompts is not None for c in caps):
            handlers += [
                ("prompts/list", types.PaginatedRequestParams, self._list_prompts),
                ("prompts/get", types.GetPromptRequestParams, self._get_prompt),
            ]
        if any(c.completions is not None for c in caps):
            handlers.append(("completion/complete", types.CompleteRequestParams, self._complete))
        for method, params, handler in handlers:
            self.server.add_request_handler(method, params, handler)

    async def run(self) -> None:
        """Listen to the 2026-era upstreams' changes until cancelled."""
        async with anyio.create_task_group() as tg:
            for listing in self.listings():
                tg.start_soon(listing.listen)

    async def prepare(self, sources: Iterable[McpSource]) -> None:
        """Read the lists of upstreams a reload is about to register (for :meth:`check`)."""
        self._prepared = {id(source): self._listing(source) for source in sources}
        for listing in self._prepared.values():
            await self._refresh(listing)

    def listings(self) -> list[Listing]:
        """One :class:`Listing` per open upstream, in the config's order."""
        self._listings = {id(s): self._listing(s) for _, s in self._upstreams.values()}
        return list(self._listings.values())

    def _listing(self, source: McpSource) -> Listing:
        listing = self._listings.get(id(source)) or self._prepared.get(id(source))
        if listing is None:
            listing = Listing(source)
            listing.on_event = self._changed
            source.notice = listing.notice
            if source.conn is not None:
                source.conn.notice = listing.notice
        return listing

    def check(self) -> None:
        """Refuse (:class:`ServeError`) a URI, template or prompt name two upstreams offer."""
        seen: dict[tuple[str, str], str] = {}
        for listing in self.listings():
            name = listing.source.name
            owned = {("resource URI", r.uri) for r in listing.resources}
            owned |= {("resource template", t.uri_template) for t in listing.templates}
            owned |= {("prompt", self._prompt_name(listing, p.name)) for p in listing.prompts}
            for key in sorted(owned):
                other = seen.setdefault(key, name)
                if other != name:
                    raise ServeError(
                        f"upstreams {other!r} and {name!r} both offer the {key[0]} {key[1]!r}; "
                        "give one a prefix (prompts) or leave one out"
                    )

    # -- upstream requests ----------------------------------------------------------------
    async def _ask(self, listing: Listing, call: Callable[[Client], Awaitable[T]]) -> T:
        """One request to the upstream, as a tool call runs: its breaker, its deadline."""
        source = listing.source
        breaker = self.dispatcher.breakers.get(source.options.breaker_key)
        token = breaker.admit()
        if token == REJECT:
            wait = max(breaker.retry_after(), 0.0)
            message = f"{source.name} is paused (its breaker is open); try again in {wait:.0f} s"
            raise MCPError(code=types.INTERNAL_ERROR, message=message)
        started = time.perf_counter()
        try:
            result = await listing.request(call, source.options.timeout_s)
        except UpstreamFailure as exc:
            verdict = Verdict.FAILURE if exc.counted else Verdict.IGNORE
            breaker.record(verdict, token, time.perf_counter() - started)
            message = self.dispatcher.redact(str(exc))  # the host's secret patterns too
            raise MCPError(code=exc.code or types.INTERNAL_ERROR, message=message) from None
        except BaseException:
            breaker.release(token)  # a cancellation says nothing about the upstream
            raise
        breaker.record(Verdict.SUCCESS, token, time.perf_counter() - started)
        return result

    async def _refresh(self, listing: Listing) -> None:
        if listing.outdated:
            try:
                await self._ask(listing, listing.fetch)
            except MCPError as exc:  # the last lists stay
                log.info("toolrelay serve: %s: lists not read: %s", listing.source.name, exc)

    def _capped(self, result: T) -> T:
        limit = self.dispatcher.options.limits.max_output_bytes
        if isinstance(result, types.Result) and len(result.model_dump_json()) > limit:
            message = f"the upstream's answer is over the output cap ({limit} bytes)"
            raise MCPError(code=types.INTERNAL_ERROR, message=message)
        return result

    # -- who asks -------------------------------------------------------------------------
    def _profile(self) -> Profile:
        """The caller's profile, once its client's rate limit admits the request."""
        caller = self.callers.current()
        refusal = self.limits().check(caller.name)
        if refusal is not None:
            raise refusal.error()
        return self.dispatcher.profile(caller.profile)

    async def _fresh(self) -> list[Listing]:
        listings = self.listings()
        for listing in listings:
            await self._refresh(listing)
        return listings

    # -- resources ------------------------------------------------------------------------
    async def _list_resources(
        self, ctx: Ctx, params: types.PaginatedRequestParams | None
    ) -> types.ListResourcesResult:
        profile = self._profile()
        items = [r for li in await self._fresh() for r in li.resources]
        permitted = [r for r in items if profile.reaches("resource", r.uri)]
        page, after = _page(permitted, params.cursor if params else None)
        return types.ListResourcesResult(resources=page, next_cursor=after)

    async def _list_templates(
        self, ctx: Ctx, params: types.PaginatedRequestParams | None
    ) -> types.ListResourceTemplatesResult:
        profile = self._profile()
        items = [t for li in await self._fresh() for t in li.templates]
        permitted = [t for t in items if profile.reaches("resource", t.uri_template)]
        page, after = _page(permitted, params.cursor if params else None)
        return types.ListResourceTemplatesResult(resource_templates=page, next_cursor=after)

    def _owner(self, uri: str) -> Listing:
        """The upstream a URI is routed to (refused as unknown when the caller may not read
        it): listed exactly, else the first template matching, else the only upstream
        offering resources."""
        listings = self.listings()
        found = next((li for li in listings if li.lists(uri)), None)
        found = found or next((li for li in listings if li.templated(uri)), None)
        offering = [li for li in listings if li.capabilities.resources is not None]
        if found is None and len(offering) == 1:
            found = offering[0]
        if found is None or not self._profile().reaches("resource", uri):
            raise MCPError(code=RESOURCE_NOT_FOUND, message=f"Resource not found: {uri[:200]}")
        return found

    async def _read(self, ctx: Ctx, params: types.ReadResourceRequestParams) -> types.Result:
        uri = str(params.uri)
        listing = self._owner(uri)
        return self._capped(await self._ask(listing, lambda client: client.read_resource(uri)))

    # -- prompts --------------------------------------------------------------------------
    def _prompt_name(self, listing: Listing, name: str) -> str:
        prefix = listing.source.options.prefix
        return name if prefix is None else f"{prefix}__{name}"

    async def _list_prompts(
        self, ctx: Ctx, params: types.PaginatedRequestParams | None
    ) -> types.ListPromptsResult:
        named = [
            p.model_copy(update={"name": self._prompt_name(li, p.name)})
            for li in await self._fresh()
            for p in li.prompts
        ]
        profile = self._profile()
        permitted = [p for p in named if profile.reaches("prompt", p.name)]
        page, after = _page(permitted, params.cursor if params else None)
        return types.ListPromptsResult(prompts=page, next_cursor=after)

    def _prompt(self, name: str) -> tuple[Listing, str]:
        """The upstream of a prompt and its name there."""
        for listing in self.listings():
            for prompt in listing.prompts:
                if self._prompt_name(listing, prompt.name) == name:
                    if self._profile().reaches("prompt", name):
                        return listing, prompt.name
                    break
        raise MCPError(code=types.INVALID_PARAMS, message=f"Unknown prompt: {name[:200]}")

    async def _get_prompt(self, ctx: Ctx, params: types.GetPromptRequestParams) -> types.Result:
        listing, remote = self._prompt(params.name)
        get = self._ask(listing, lambda client: client.get_prompt(remote, params.arguments))
        return self._capped(await get)

    # -- completions ----------------------------------------------------------------------
    async def _complete(
        self, ctx: Ctx, params: types.CompleteRequestParams
    ) -> types.CompleteResult:
        ref = params.ref
        if isinstance(ref, types.PromptReference):
            listing, remote = self._prompt(ref.name)
            ref = ref.model_copy(update={"name": remote})
        else:
            uri = ref.uri
            owners = (li for li in self.listings() for t in li.templates if t.uri_template == uri)
            found = next(owners, None)
            if found is None or not self._profile().reaches("resource", uri):
                raise MCPError(code=RESOURCE_NOT_FOUND, message=f"Unknown template: {uri[:200]}")
            listing = found
        argument = params.argument.model_dump()
        context = None if params.context is None else params.context.arguments
        return await self._ask(listing, lambda client: client.complete(ref, argument, context))

    # -- changes --------------------------------------------------------------------------
    async def _changed(self, listing: Listing, event: ServerEvent) -> None:
        """An upstream's change, told to the clients it concerns."""
        if isinstance(event, ResourceUpdated):
            uri = event.uri
            await self.subscriptions.updated(listing, uri)
            profiles = self.dispatcher.profile
            await self.watcher.tell(event, lambda p: profiles(p).reaches("resource", uri))
        else:
            await self.watcher.tell(event, lambda p: True)
