"""OpenTelemetry spans of a turn, on each side of the queue (the ``otel`` extra).

Three spans per turn, in one trace:

- ``agentkernel enqueue`` (producer): the front putting the turn on INPUT, a child of the
  caller's ``traceparent`` header when it sent one;
- ``agentkernel run`` (consumer): the Agent Runner handling the INPUT message, a child of the
  enqueue span; an agent's own spans nest under it;
- ``agentkernel deliver`` (consumer): the response handler storing the reply.

They are joined by the ``traceparent`` message attribute the turn already carries: the front sets
it to the enqueue span's context, and the reply carries it on to OUTPUT. With ``opentelemetry``
not installed, or installed with no tracer provider set, nothing is recorded and the attribute
travels as it came. ``opentelemetry`` is imported on first use, never by importing agentkernel.

Export: :func:`export_if_configured` (called by the process entry points) installs the SDK with
an OTLP/HTTP exporter when ``OTEL_EXPORTER_OTLP_ENDPOINT`` or
``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`` is set and nothing installed a provider before (as
``opentelemetry-instrument`` does). The usual ``OTEL_*`` variables apply (service name, headers).
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Iterator, Mapping
from typing import Any

__all__ = ["export_if_configured", "failed", "flush", "recording", "span"]

logger = logging.getLogger(__name__)

TRACER_NAME = "agentkernel"
ENDPOINT_VARIABLES = ("OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
#: Seconds a stopping process waits for its last spans to be exported.
FLUSH_SECONDS = 5.0

otel_context: Any = None  # opentelemetry.context, once imported
_otel: tuple[Any, Any] | None = None  # (opentelemetry.trace, the W3C propagator), once imported
_missing = False
#: ``OTEL_PYTHON_TRACER_PROVIDER`` was set when the API was imported: the API loads that provider
#: on its first ``get_tracer_provider()``, so that call is made every time.
_provider_by_name = False
_UNREAD = object()


def _api() -> tuple[Any, Any] | None:
    """``(opentelemetry.trace, propagator)`` when spans would be recorded, else ``None``."""
    global _otel, _missing, otel_context, _provider_by_name
    if _otel is None and not _missing:
        try:
            from opentelemetry import context, trace
            from opentelemetry.trace.propagation.tracecontext import (
                TraceContextTextMapPropagator,
            )
        except ImportError:
            _missing = True
            return None
        _otel = (trace, TraceContextTextMapPropagator())
        otel_context = context
        _provider_by_name = "OTEL_PYTHON_TRACER_PROVIDER" in os.environ
    if _otel is None:
        return None
    trace = _otel[0]
    # get_tracer_provider() looks its variable up in os.environ on every call (three times a
    # turn); the API's global says the same (None until a provider is set, which is once).
    provider = _UNREAD if _provider_by_name else getattr(trace, "_TRACER_PROVIDER", _UNREAD)
    if provider is _UNREAD:
        provider = trace.get_tracer_provider()
    if provider is None or isinstance(provider, trace.ProxyTracerProvider):
        return None  # no provider set: the API would only make no-op spans
    return _otel


def recording() -> bool:
    """Whether :func:`span` records anything (a tracer provider is set): a caller on a hot path
    asks first, so a turn with tracing off builds no span attributes at all."""
    return _api() is not None


@contextlib.contextmanager
def span(
    name: str,
    traceparent: str | None,
    kind: str,
    attributes: Mapping[str, str | int],
    in_span: bool = False,
) -> Iterator[str | None]:
    """Record span ``agentkernel <name>`` around the block, as a child of ``traceparent``.

    Args:
        kind: ``PRODUCER`` or ``CONSUMER``.
        attributes: span attributes (request id, session, queue, delivery).
        in_span: a child of the span already current, when there is one (the HTTP server's,
            which instrumentation made from the caller's header), rather than of ``traceparent``.

    Yields:
        the ``traceparent`` of the new span, to carry on (``traceparent`` itself when no span
        is recorded).
    """
    api = _api()
    if api is None:
        yield traceparent
        return
    trace, propagator = api
    if in_span and trace.get_current_span().get_span_context().is_valid:
        parent = None  # the current context
    else:
        parent = propagator.extract({"traceparent": traceparent} if traceparent else {})
    current = trace.get_tracer(TRACER_NAME).start_span(
        f"agentkernel {name}",
        context=parent,
        kind=getattr(trace.SpanKind, kind),
        attributes=dict(attributes),
    )
    context = trace.set_span_in_context(current, parent)
    token = otel_context.attach(context)
    try:
        carrier: dict[str, str] = {}
        propagator.inject(carrier)
        yield carrier.get("traceparent", traceparent)
    except BaseException as exc:
        if not isinstance(exc, GeneratorExit):
            failed(exc)
        raise
    finally:
        current.end()
        # Detached only where it was attached: a coroutine closed late (collected after its
        # loop stopped) ends in another context, where detaching would fail and log an ERROR.
        if otel_context.get_current() is context:
            otel_context.detach(token)


def failed(exc: BaseException) -> None:
    """Mark the current span failed with ``exc`` (an error handled inside the span)."""
    api = _api()
    if api is not None:
        current = api[0].get_current_span()
        current.record_exception(exc)
        current.set_status(api[0].Status(api[0].StatusCode.ERROR, type(exc).__name__))


def export_if_configured() -> bool:
    """Install the SDK with an OTLP exporter when an OTLP endpoint is configured; returns whether
    it did. Nothing happens without the ``otel`` extra, with ``OTEL_SDK_DISABLED=true``, without
    an endpoint variable, or when a tracer provider is already set."""
    if not any(os.environ.get(name) for name in ENDPOINT_VARIABLES):
        return False
    if os.environ.get("OTEL_SDK_DISABLED", "").lower() == "true":
        return False
    try:
        from opentelemetry import trace
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor
    except ImportError:
        logger.warning("an OTLP endpoint is set but the 'otel' extra is not installed: no spans")
        return False
    if not isinstance(trace.get_tracer_provider(), trace.ProxyTracerProvider):
        return False
    defaults = {} if os.environ.get("OTEL_SERVICE_NAME") else {"service.name": "agentkernel"}
    provider = TracerProvider(resource=Resource.create(defaults))
    provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
    trace.set_tracer_provider(provider)
    logger.info("exporting turn spans over OTLP")
    return True


def flush() -> None:
    """Export the spans still buffered (the process exits without running its cleanups)."""
    api = _api()
    if api is not None:
        force_flush = getattr(api[0].get_tracer_provider(), "force_flush", None)
        if force_flush is not None:
            with contextlib.suppress(Exception):
                force_flush(int(FLUSH_SECONDS * 1000))
