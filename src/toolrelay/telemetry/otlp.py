"""OpenTelemetry SDK tracer and meter providers exporting over OTLP/HTTP (extra ``otlp``).

For the CLI (``toolrelay demo --otlp-endpoint``, ``toolrelay serve``): a library embedding
toolrelay configures its own SDK; this module is never imported by the dispatch path.
"""

from __future__ import annotations

from typing import Any


class OtlpUnavailable(RuntimeError):
    """The ``otlp`` extra is not installed."""


_NEEDS_EXTRA = "OTLP export needs the otlp extra: pip install 'toolrelay[otlp]'"


def otlp_tracer_provider(endpoint: str, service_name: str) -> Any:
    """A ``TracerProvider`` batching spans to ``endpoint`` (e.g. ``…:4318/v1/traces``)."""
    try:
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor
    except ImportError:
        raise OtlpUnavailable(_NEEDS_EXTRA) from None
    provider = TracerProvider(resource=Resource.create({"service.name": service_name}))
    provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter(endpoint=endpoint)))
    return provider


def otlp_meter_provider(endpoint: str, service_name: str, interval_s: float = 60.0) -> Any:
    """A ``MeterProvider`` exporting to ``endpoint`` (e.g. ``…:4318/v1/metrics``) every
    ``interval_s`` and when it is shut down."""
    try:
        from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter
        from opentelemetry.sdk.metrics import MeterProvider
        from opentelemetry.sdk.metrics.export import PeriodicExportingMetricReader
        from opentelemetry.sdk.resources import Resource
    except ImportError:
        raise OtlpUnavailable(_NEEDS_EXTRA) from None
    reader = PeriodicExportingMetricReader(
        OTLPMetricExporter(endpoint=endpoint), export_interval_millis=interval_s * 1000
    )
    return MeterProvider(
        metric_readers=[reader], resource=Resource.create({"service.name": service_name})
    )
