"""The dispatcher: composes the stages once and turns every tool call into a ToolResult."""

from __future__ import annotations

import dataclasses
import functools
import logging
import os
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from time import perf_counter
from typing import Any

import anyio
from opentelemetry.metrics import MeterProvider
from opentelemetry.trace import TracerProvider
from prometheus_client import CollectorRegistry

from .approval import Approver
from .breakers import Breakers, StorageFactory
from .budget import RetryBudgets
from .capabilities import Closeable
from .config import Settings, load_config, load_configured_plugins
from .contract import AuthContext, ErrorType, ToolDeclaration
from .formats import Unavailable, checked_unavailable, formatter
from .isolation import ProcessPools
from .options import DispatcherOptions, KeyPolicy
from .outcome import failure
from .pipeline import Invocation, Observer, Stage, compose
from .pipeline.approve import Approve
from .pipeline.audit import Audit, AuditSink, log_sink
from .pipeline.breaker import Breaker
from .pipeline.bulkhead import Bulkhead
from .pipeline.deadline import Deadline
from .pipeline.decode import Decode
from .pipeline.fallback import Fallback
from .pipeline.fastfail import FastFail
from .pipeline.faults import FaultInjector
from .pipeline.hedge import Hedge
from .pipeline.invoke import Invoke
from .pipeline.join import Join
from .pipeline.resolve import Resolve, find
from .pipeline.retry import Retry
from .pipeline.shape import Shape
from .policy import EVERYTHING, NOTHING, Profile
from .redact import Redactor
from .registry import RegistrationError, ToolRegistry
from .result import ToolCall, ToolResult, safe_call_id
from .slot import ModelSlot, SlotLease
from .storage import RedisLink, SharedStorage
from .telemetry import Telemetry
from .workers import WorkerPools

log = logging.getLogger("toolrelay")

ANONYMOUS = AuthContext()


class Dispatcher:
    """Runs tool calls through the pipeline, in this order (outermost first)::

        audit → resolve + policy → fallback → join (shared storage) → fast-fail (open breaker)
        → decode + validate → approve → shape (on the way out) → deadline → retry → hedge
        → breaker → bulkhead → faults → invoke

    (``telemetry`` wraps all of it when enabled.) Stages before the deadline never touch the
    breaker: a caller's mistake is not a service failure. Dispatchers may share a registry.
    """

    def __init__(
        self,
        registry: ToolRegistry,
        options: DispatcherOptions | None = None,
        *,
        approver: Approver | None = None,
        audit: AuditSink | None = log_sink,
        observers: Iterable[Observer] = (),
        metrics_registry: CollectorRegistry | None = None,
        tracer_provider: TracerProvider | None = None,
        meter_provider: MeterProvider | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        """``options``: the settings (defaults when ``None``). The keyword arguments are live
        objects: who approves, where audit lines go (``None``: nowhere), who observes stage
        events, the metric registry and OpenTelemetry providers telemetry uses, and the
        breakers' ``clock`` (``toolrelay.testing.FrozenClock`` in tests)."""
        self.registry = registry
        self.options = options = DispatcherOptions() if options is None else options
        self.redact = Redactor(options.secret_patterns)
        self.telemetry = (
            Telemetry(
                registry,
                metrics_registry=metrics_registry,
                tracer_provider=tracer_provider,
                capture_content=options.capture_content,
                redact=self.redact,
                meter_provider=meter_provider,
            )
            if options.telemetry
            else None
        )
        tel = self.telemetry
        self.observers: tuple[Observer, ...] = (
            tuple(observers) if tel is None else (tel.observe, *observers)
        )
        self.storage_link: RedisLink | None = None
        factory: StorageFactory | None = None
        self.budgets = budgets = RetryBudgets(lambda key: self.policy(key).budget)
        storage = options.storage
        if storage is not None:
            self.storage_link = link = RedisLink(
                **dataclasses.asdict(storage),
                budgets=budgets,
                on_change=None if tel is None else tel.storage_changed,
                on_reject=None if tel is None else tel.storage_rejected,
            )
            factory = functools.partial(SharedStorage, link)

        def places(key: str) -> int:
            return self.policy(key).bulkhead.max_places

        self.breakers = Breakers(lambda key: self.policy(key).breaker, factory, clock)
        self.workers = WorkerPools(places, None if tel is None else tel.workers_changed)
        if tel is not None:
            self.breakers.add_listener(tel.breaker_transition)
            self.breakers.on_create.append(tel.breaker_seen)
            tel.watch_breakers(self.breakers)
        self.bulkhead = Bulkhead(
            lambda key: self.policy(key).bulkhead, lambda key: self.workers.get(key).abandoned
        )
        join = [] if storage is None else [Join(self.breakers, budgets, storage.join_timeout_s)]
        outer: list[Stage] = []
        if audit is not None and options.audit:
            outer.append(Audit(audit, arguments=options.audit_arguments, redact=self.redact))
        outer.append(Resolve(registry, self.redact))
        limits = options.limits
        self.faults = FaultInjector(options.faults, options.fault_seed, on_change=self._compose)
        self._outer = outer
        self._inner: list[Stage] = [
            *join,
            FastFail(self.breakers),
            Decode(limits.max_argument_bytes, limits.max_argument_depth, self.redact),
            Approve(approver),
            Shape(limits.max_output_bytes, limits.truncate_output),
            Deadline(),
            Retry(lambda key: self.policy(key).retry, self.budgets),
            Hedge(lambda key: self.policy(key).hedge, self.budgets, self.bulkhead.has_place),
            Breaker(self.breakers),
            self.bulkhead,
            self.faults,
        ]
        # a reply frame is pickled: up to twice the JSON cap, and room for a traceback
        frame_cap = 2 * limits.max_output_bytes + 65536
        self.processes = ProcessPools(places, options.isolation_env, frame_cap)
        self._invoke = Invoke(self.workers, self.redact, self.processes)
        self._compose()

    def _compose(self) -> None:
        """Compose the chain (again on reload and when faults come or go), leaving out a
        stage with nothing to do (hedging no key turns on; faults while none is in force)."""
        options = self.options
        left_out: set[type] = set()
        if all(p.hedge.after_s is None for p in (options.default_key, *options.keys.values())):
            left_out.add(Hedge)
        if not self.faults:
            left_out.add(FaultInjector)
        inner = [stage for stage in self._inner if type(stage) not in left_out]
        # a fallback's call runs every stage but telemetry (the call's span and metrics are
        # the primary's) and the fallback stage (a fallback's fallbacks are not followed)
        reenter = compose([*self._outer, *inner], self._invoke)
        fallback = Fallback(reenter, functools.partial(find, self.registry))
        tel = [] if self.telemetry is None else [self.telemetry]
        self._chain = compose([*tel, *self._outer, fallback, *inner], self._invoke)

    @classmethod
    def from_config(
        cls,
        source: str | os.PathLike[str] | Settings,
        *,
        registry: ToolRegistry | None = None,
        overrides: Mapping[str, Any] | None = None,
        **live: Any,
    ) -> Dispatcher:
        """Build a dispatcher (and, unless given, its registry) from a ``toolrelay.toml``.

        Plugins are loaded, tool overrides applied, and the dispatcher's options built
        from the file (:meth:`~toolrelay.config.Settings.dispatcher_options`);
        ``overrides`` replace options (``{"telemetry": False}``) and the other keyword
        arguments are the dispatcher's live ones (``approver=…``, ``audit=None``).
        Raises :class:`~toolrelay.config.ConfigError` or
        :class:`~toolrelay.loading.PluginLoadError` with one clear line.
        """
        config = source if isinstance(source, Settings) else load_config(source)
        if registry is None:
            reserved = config.dispatcher.reserved_properties
            registry = ToolRegistry(
                **({} if reserved is None else {"reserved_properties": reserved})
            )
        load_configured_plugins(registry, config)
        options = config.dispatcher_options()
        if overrides:
            options = options.replace(**overrides)
        return cls(registry, options, **live)

    async def __aenter__(self) -> Dispatcher:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        """Close plugins (``aclose()``), the storage link, worker processes (killed, and
        gone) and sync tools' threads (idle ones now, busy ones when their handler returns)."""
        self.workers.close()
        await self.processes.aclose()
        for plugin in self.registry.plugins():
            if isinstance(plugin, Closeable):
                await plugin.aclose()
        self.close()

    @property
    def storage_up(self) -> bool:
        """False while shared breaker storage is configured but unreachable."""
        return self.storage_link is None or self.storage_link.up

    def close(self) -> None:
        """Release the shared breaker storage's connections, if any."""
        if self.storage_link is not None:
            self.storage_link.close()

    def add_observer(self, observer: Observer) -> None:
        """Add ``observer``: called with ``(invocation, event)`` for every stage event of
        the calls dispatched from now on."""
        self.observers = (*self.observers, observer)

    def model_slot(self, budget_s: float = 30.0) -> ModelSlot:
        """A :class:`ModelSlot` whose holds this dispatcher's telemetry records."""
        listeners = [] if self.telemetry is None else [self.telemetry.slot_released]
        return ModelSlot(budget_s, listeners=listeners)

    def reconfigure(self, options: DispatcherOptions) -> list[str]:
        """Apply new options to later calls (hot reload): ``profiles``, ``keys``,
        ``default_key``, and ``faults`` when they differ (replacing admin-added ones too).
        The rest is kept as built; calls in flight keep their profile, breakers their state,
        and a key's bulkhead and retry budget the options of its first call
        (``RELOADABLE = False``). Returns the keys of the breakers reconfigured."""
        old = self.options
        live = {"profiles", "keys", "default_key", "faults"}
        self.options = old.replace(**{name: getattr(options, name) for name in live})
        if options.faults != old.faults:
            self.faults.clear()
            for fault in options.faults:
                self.faults.add(fault)
        self._compose()
        return self.breakers.reconfigure()

    @property
    def profiles(self) -> Mapping[str, Profile]:
        """The caller profiles in force, by name."""
        return self.options.profiles

    def policy(self, key: str) -> KeyPolicy:
        """The :class:`~toolrelay.options.KeyPolicy` in force for breaker key ``key``."""
        options = self.options
        return options.keys.get(key, options.default_key)

    def profile(self, name: str | None) -> Profile:
        """The profile a caller naming ``name`` gets: every tool for ``None``, none if unknown."""
        if name is None:
            return EVERYTHING
        return self.options.profiles.get(name, NOTHING)

    async def dispatch(
        self,
        name: str,
        raw_args: str | bytes | Mapping[str, Any] | None = "{}",
        ctx: AuthContext | None = None,
        *,
        profile: str | None = None,
        call_id: str | None = None,
        slot: SlotLease | None = None,
    ) -> ToolResult:
        """Run one tool call; always returns a :class:`ToolResult` (cancellation propagates).

        ``call_id`` is kept as :func:`safe_call_id` makes it (at most 128 printable
        characters), and that is what the result, the audit line and the span carry.
        """
        call_id = None if call_id is None else safe_call_id(call_id)
        started = perf_counter()
        try:
            try:  # find(), inline: one call less per call
                tool = self.registry.resolve(name) if isinstance(name, str) else None
            except RegistrationError:  # the resolve stage says why
                tool = None
            inv = Invocation.asked(
                name, raw_args, ANONYMOUS if ctx is None else ctx,
                EVERYTHING if profile is None else self.options.profiles.get(profile, NOTHING),
                call_id, slot, self.observers, tool,
            )  # fmt: skip
            out = await self._chain(inv)
        except Exception:
            log.exception("toolrelay: internal error while dispatching %r", name)
            out = failure(ErrorType.INTERNAL_ERROR, "toolrelay could not run this call")
        duration = perf_counter() - started
        asked = out.request  # the call as it ran (None: no tool by that name)
        return ToolResult(
            out.ok,
            name if isinstance(name, str) else "",
            call_id,
            out.data,
            out.error_type,
            out.message,
            out.retryable,
            out.retry_after_s,
            duration,
            out.attempts or (0 if asked is None else asked.attempts),
            None if asked is None else asked.key,
            out.effect_unknown,
            out.served_by,
        )

    async def dispatch_many(
        self,
        calls: Sequence[ToolCall],
        ctx: AuthContext | None = None,
        *,
        profile: str | None = None,
        slot: SlotLease | None = None,
        on_result: Callable[[int, ToolResult], Any] | None = None,
    ) -> list[ToolResult]:
        """Run calls concurrently, each with its own deadline; results in input order.

        ``on_result(index, result)`` is called as each call is answered, so a host can hand
        a fast answer to the model without waiting for a slow one. An exception it raises is
        logged and does not touch the other calls.
        """
        results: list[ToolResult | None] = [None] * len(calls)

        async def run(index: int, call: ToolCall) -> None:
            result = await self.dispatch(
                call.name, call.arguments, ctx, profile=profile, call_id=call.call_id, slot=slot
            )
            results[index] = result
            if on_result is not None:
                try:
                    on_result(index, result)
                except Exception:
                    log.exception("toolrelay: on_result raised for call %d (%s)", index, call.name)

        async with anyio.create_task_group() as tg:
            for index, call in enumerate(calls):
                tg.start_soon(run, index, call)
        return [r for r in results if r is not None]

    def specs(
        self,
        profile: str | None = None,
        format: str = "openai",
        *,
        unavailable: Unavailable = "hide",
        hide_fallbacks: bool = False,
    ) -> list[dict[str, Any]]:
        """The tools a caller with ``profile`` may call, in ``format``.

        Tools whose breaker is open are hidden, marked unavailable in their description
        ("[unavailable for about N s]", "[unavailable: paused by an operator]") or shown, as
        ``unavailable`` says — unless a fallback can answer for them (:meth:`describe`).
        ``hide_fallbacks`` leaves out every tool another listed tool names as a fallback.
        """
        render = formatter(format)
        checked_unavailable(unavailable)
        chosen = self.profile(profile)
        decls = [tool.decl for tool in self.registry.tools() if chosen.permits(tool.decl)]
        hidden = {name for decl in decls for name in decl.fallback} if hide_fallbacks else set()
        described = (
            (d, self.describe(d, chosen, unavailable)) for d in decls if d.name not in hidden
        )
        return [render(decl, text) for decl, text in described if text is not None]

    def describe(self, decl: ToolDeclaration, chosen: Profile, unavailable: str) -> str | None:
        """The description :meth:`specs` lists ``decl`` with now for the caller with profile
        ``chosen`` (``None``: left out)."""
        wait = None if unavailable == "show" else self.breakers.blocked_for(decl.key)
        if wait is None or self._stands_in(decl, chosen):
            return decl.description
        if unavailable == "hide":
            return None
        if self.breakers.get(decl.key).pinned_open:  # no trial is due
            return f"[unavailable: paused by an operator] {decl.description}"
        return f"[unavailable for about {wait:.0f} s] {decl.description}"

    def _stands_in(self, decl: ToolDeclaration, profile: Profile) -> bool:
        """Can a fallback of ``decl`` answer for it now (known, allowed, breaker not open)?"""
        tools = (find(self.registry, name) for name in decl.fallback)
        return any(
            t is not None
            and profile.permits(t.decl)
            and self.breakers.blocked_for(t.decl.key) is None
            for t in tools
        )
