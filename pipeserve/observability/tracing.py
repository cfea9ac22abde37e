"""OpenTelemetry traces of each request through the DAG, exported over OTLP when an endpoint is configured.

Off unless ``OTEL_EXPORTER_OTLP_ENDPOINT`` (or ``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT``) is set and the
``tracing`` extra is installed; then every request gets a span, every node a child span, and every call to a
remote node a client span whose context travels in the W3C ``traceparent`` header (HTTP) or metadata (gRPC), so
the inference server's spans join the same trace. Every span carries the request id
(``pipeserve.request_id``), as every log line does. The standard ``OTEL_*`` variables configure the exporter
(``OTEL_SERVICE_NAME``, ``OTEL_BSP_SCHEDULE_DELAY``, ...). When off, each hook costs one attribute check.
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Iterator, Mapping, MutableMapping
from typing import Any

from pipeserve.observability.context import request_id_var

logger = logging.getLogger(__name__)


class _State:
    tracer: Any = None
    propagate: Any = None
    extract: Any = None
    status: Any = None


_state = _State()


def enabled() -> bool:
    return _state.tracer is not None


def configure_tracing(service_name: str) -> bool:
    """Set up OTLP export if an endpoint is configured; return whether tracing is on. Safe to call twice."""
    if _state.tracer is not None:
        return True
    if not (os.environ.get("OTEL_EXPORTER_OTLP_ENDPOINT") or os.environ.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")):
        return False
    try:
        from opentelemetry import propagate, trace
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor
        from opentelemetry.trace import Status, StatusCode
    except ImportError:
        logger.warning(
            "OTEL_EXPORTER_OTLP_ENDPOINT is set but OpenTelemetry is not installed: pip install 'pipeserve[tracing]'"
        )
        return False
    name = os.environ.get("OTEL_SERVICE_NAME") or service_name
    provider = TracerProvider(resource=Resource.create({"service.name": name}))
    provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
    trace.set_tracer_provider(provider)
    _state.tracer = trace.get_tracer("pipeserve")
    _state.propagate = propagate.inject
    _state.extract = propagate.extract
    _state.status = (Status, StatusCode)
    logger.info("Tracing on: spans of %s exported over OTLP", name)
    return True


def shutdown_tracing() -> None:
    """Flush the spans still buffered (at process exit)."""
    if _state.tracer is None:
        return
    from opentelemetry import trace

    provider = trace.get_tracer_provider()
    if hasattr(provider, "shutdown"):
        provider.shutdown()


@contextlib.contextmanager
def span(
    name: str, *, kind: str = "internal", carrier: Mapping[str, str] | None = None, **attributes: Any
) -> Iterator[Any]:
    """A span named ``name`` (a child of the current one, or of the context in ``carrier``), with the request id.

    ``kind``: ``server`` (a request arriving), ``client`` (a call to another service), ``internal``.
    """
    tracer = _state.tracer
    if tracer is None:
        yield None
        return
    from opentelemetry.trace import SpanKind

    context = _state.extract(carrier) if carrier is not None else None
    attributes = dict(attributes or {})
    request_id = request_id_var.get()
    if request_id:
        attributes["pipeserve.request_id"] = request_id
    span_kind = {"server": SpanKind.SERVER, "client": SpanKind.CLIENT}.get(kind, SpanKind.INTERNAL)
    with tracer.start_as_current_span(name, context=context, kind=span_kind, attributes=attributes) as current:
        try:
            yield current
        except BaseException as exc:
            status, code = _state.status
            current.set_status(status(code.ERROR, f"{type(exc).__name__}: {exc}"))
            raise


def inject(headers: MutableMapping[str, str]) -> None:
    """Add the current span's ``traceparent`` to outgoing headers (or gRPC metadata) when tracing is on."""
    if _state.propagate is not None:
        _state.propagate(headers)
