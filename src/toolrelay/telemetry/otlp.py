"""An OpenTelemetry SDK tracer provider exporting over OTLP/HTTP (extra ``otlp``).

For the CLI (``toolrelay demo --otlp-endpoint``, ``toolrelay serve``): a library embedding
toolrelay configures its own SDK; this module is never imported by the dispatch path.
"""

from __future__ import annotations

from typing import Any

__all__ = ["OtlpUnavailable", "otlp_tracer_provider"]


class OtlpUnavailable(RuntimeError):
    """The ``otlp`` extra is not installed."""


def otlp_tracer_provider(endpoint: str, service_name: str) -> Any:
    """A ``TracerProvider`` batching spans to ``endpoint`` (e.g. ``…:4318/v1/traces``)."""
    try:
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor
    except ImportError:
        raise OtlpUnavailable(
            "OTLP export needs the otlp extra: pip install 'toolrelay[otlp]'"
        ) from None
    provider = TracerProvider(resource=Resource.create({"service.name": service_name}))
    provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter(endpoint=endpoint)))
    return provider
