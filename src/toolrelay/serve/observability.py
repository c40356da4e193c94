"""The ``[telemetry]`` settings of ``toolrelay.toml`` as ``toolrelay serve`` applies them:
OTLP exporters for spans and histograms, and a plain ``/metrics`` endpoint without a token
for scrapers that cannot send one (``docs/serve.md``)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from prometheus_client import CollectorRegistry

from ..telemetry import serve_metrics
from ..telemetry.otlp import OtlpUnavailable, otlp_meter_provider, otlp_tracer_provider
from .auth import check_bind
from .errors import ServeError


def tracer_provider(telemetry: Mapping[str, Any]) -> Any:
    """An OpenTelemetry SDK tracer provider exporting to ``otlp_endpoint``, or ``None``."""
    return _otlp(telemetry, "otlp_endpoint", otlp_tracer_provider)


def meter_provider(telemetry: Mapping[str, Any]) -> Any:
    """An OpenTelemetry SDK meter provider exporting to ``otlp_metrics_endpoint``, or
    ``None`` (then only a global one the host set up records the histograms)."""
    return _otlp(telemetry, "otlp_metrics_endpoint", otlp_meter_provider)


def _otlp(telemetry: Mapping[str, Any], key: str, provider: Callable[[str, str], Any]) -> Any:
    endpoint = telemetry.get(key)
    if not endpoint:
        return None
    try:
        return provider(str(endpoint), "toolrelay-serve")
    except OtlpUnavailable as exc:
        raise ServeError(f"telemetry.{key}: {exc}") from None


def metrics_endpoint(
    telemetry: Mapping[str, Any], registry: CollectorRegistry, allow_remote: bool
) -> Any:
    """Serve ``registry`` on ``metrics_host:metrics_port`` when the port is set; the
    server (``.shutdown()`` stops it) or ``None``."""
    port = telemetry.get("metrics_port", 0)
    if not port:
        return None
    host = str(telemetry.get("metrics_host", "127.0.0.1"))
    check_bind(host, allow_remote, "metrics endpoint")
    try:
        return serve_metrics(port, host, registry=registry)
    except OSError as exc:
        raise ServeError(f"cannot serve /metrics on {host}:{port}: {exc.strerror or exc}") from None
