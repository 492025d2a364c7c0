"""OpenTelemetry in the SDK: a producer's trace goes through the node to the handler.

``OrbitClient`` sends the active span's W3C trace context (``traceparent``, ``tracestate``)
with each submit; the node keeps it with the task and sends it with each dispatch; the
Worker runs each attempt inside a span ``orbit.task`` whose parent is that context.

Through the OpenTelemetry API only (``opentelemetry-api``). Without an SDK installed
(``orbit-sdk[otel]``, or your program's own set-up) nothing here makes a span: the
header is sent only when a valid span is active, and the Worker's span is skipped.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from opentelemetry import trace
from opentelemetry.trace import INVALID_SPAN, Span, SpanKind, Status, StatusCode
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from orbit_protocol import __version__

from .handlers import WorkerTask

_tracer = trace.get_tracer("orbit.sdk", __version__)
# The node reads W3C Trace Context whatever propagators the program configured for its
# own calls, so both ends use this one.
_propagator = TraceContextTextMapPropagator()
# The providers the API falls back to when no SDK is installed: their spans record nothing.
_NO_PROVIDER = (trace.ProxyTracerProvider, trace.NoOpTracerProvider)


def enabled() -> bool:
    """Whether a tracer provider is installed (checked each time: a program may install
    one after importing the SDK)."""
    return not isinstance(trace.get_tracer_provider(), _NO_PROVIDER)


def context_headers() -> dict[str, str]:
    """The ``traceparent`` (and ``tracestate``) of the active span, for a submit; empty
    when no span is active."""
    headers: dict[str, str] = {}
    _propagator.inject(headers)
    return headers


@contextmanager
def attempt_span(task: WorkerTask, *, application: str | None = None) -> Iterator[Span]:
    """The span ``orbit.task`` of one attempt, current while the handler runs (so the
    handler's own spans are its children), child of the producer's context when the task
    carries one, else the root of a trace of its own. An exception leaving the block
    (a cancellation) is recorded on it; ``failed`` records a handler's failure that the
    Worker catches and reports."""
    if not enabled():
        yield INVALID_SPAN
        return
    parent = None
    if task.traceparent is not None:
        carrier = {"traceparent": task.traceparent}
        if task.tracestate is not None:
            carrier["tracestate"] = task.tracestate
        parent = _propagator.extract(carrier)
    with _tracer.start_as_current_span("orbit.task", context=parent, kind=SpanKind.CONSUMER) as span:
        if span.is_recording():
            span.set_attributes(
                {
                    "orbit.task_id": task.task_id,
                    "orbit.handler": task.handler,
                    "orbit.handler_version": task.handler_version,
                    "orbit.attempt": task.attempt,
                    "orbit.priority": task.priority,
                    "orbit.queue_id": task.queue_id,
                }
            )
            if application is not None:
                span.set_attribute("orbit.application", application)
        yield span


def failed(span: Span, exc: BaseException) -> None:
    """Record a handler's exception on its attempt's span, with an error status."""
    if span.is_recording():
        span.record_exception(exc)
        span.set_status(Status(StatusCode.ERROR, f"{type(exc).__name__}: {exc}"))
