"""The node's OpenTelemetry spans: submit, dispatch, Start and Finish of a task, in the
trace its producer started (``orbit_node.domain.trace_context``).

Through the OpenTelemetry API only: an SDK (``orbit-node[otel]``) and its exporters, set
up by the standard ``OTEL_*`` variables or by the program that embeds the node, make the
spans real. Without one the node does no span work at all: ``enabled`` is one isinstance
check, and every helper here returns before it builds a context or an attribute.
"""

from __future__ import annotations

from collections.abc import Container, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

import attrs
from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.trace import INVALID_SPAN, Span, SpanKind, Status, StatusCode
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from orbit_protocol import __version__

from .domain.trace_context import TraceContext

if TYPE_CHECKING:
    from .domain.ownership import Reservation, TransitionResult

_tracer = trace.get_tracer("orbit.node", __version__)
_propagator = TraceContextTextMapPropagator()
# The providers the API falls back to when no SDK has been installed: their spans record
# nothing, so the node makes none.
_NO_PROVIDER = (trace.ProxyTracerProvider, trace.NoOpTracerProvider)


def enabled() -> bool:
    """Whether a tracer provider is installed (checked each time: a program may install
    one after the node's modules were imported)."""
    return not isinstance(trace.get_tracer_provider(), _NO_PROVIDER)


def parent(context: TraceContext | None) -> Context | None:
    """The remote parent a task's spans continue, or None (a trace of their own)."""
    if context is None:
        return None
    carrier = {"traceparent": context.traceparent}
    if context.tracestate is not None:
        carrier["tracestate"] = context.tracestate
    return _propagator.extract(carrier)


@contextmanager
def span(name: str, context: TraceContext | None, *, kind: SpanKind = SpanKind.INTERNAL) -> Iterator[Span]:
    """A span around the block, child of ``context`` (the producer's), current inside it;
    an exception leaving the block is recorded on it. Off: the invalid span, which records
    nothing (test ``is_recording()`` before building attributes)."""
    if not enabled():
        yield INVALID_SPAN
        return
    with _tracer.start_as_current_span(name, context=parent(context), kind=kind) as current:
        yield current


def task_events(name: str, tasks: Iterable[Mapping[str, Any]], *, failed: Iterable[str] = ()) -> None:
    """One span per task for a step the node took for many tasks at once (a dispatch, the
    Starts or Finishes of one message): each ``{"task_id", "trace_context", ...}`` item's
    span is a child of its own producer's context and carries the item's other values as
    ``orbit.*`` attributes; the ids in ``failed`` get an error status."""
    if not enabled():
        return
    errors = set(failed)
    for item in tasks:
        context = TraceContext.from_stored(item.get("trace_context"))
        current = _tracer.start_span(name, context=parent(context), kind=SpanKind.INTERNAL)
        if current.is_recording():
            for key, value in item.items():
                if key != "trace_context" and value is not None:
                    current.set_attribute(f"orbit.{key}", value)
            if item["task_id"] in errors:
                current.set_status(Status(StatusCode.ERROR))
        current.end()


@attrs.define
class ConnectionTraces:
    """The trace context of each task one Worker connection was dispatched, kept only
    while a tracer provider is installed, so that the node's span of its Start and Finish
    joins its producer's trace. Bounded by what the connection holds: an entry goes with
    the task's Finish or release, and ``keep_only`` drops the ones the connection no
    longer holds (lost, recovered)."""

    connection_id: str
    _contexts: dict[str, str | None] = attrs.field(factory=dict, init=False)

    def dispatched(self, reservations: Sequence[Reservation]) -> None:
        if not enabled():
            return
        for r in reservations:
            self._contexts[r.task_id] = r.trace_context
        task_events(
            "orbit.dispatch",
            (
                {
                    "task_id": r.task_id,
                    "trace_context": r.trace_context,
                    "queue_id": r.queue_id,
                    "handler": r.handler,
                    "handler_version": r.handler_version,
                    "attempt": r.attempt,
                    "priority": r.priority,
                    "connection_id": self.connection_id,
                }
                for r in reservations
            ),
        )

    def transitioned(self, name: str, results: Sequence[TransitionResult], refs: Sequence[object]) -> None:
        """Spans ``orbit.start`` / ``orbit.finish`` of the tasks of one message (``refs``,
        its task references or Finish reports) the store decided; a refused one
        (ownership lost, ...) and a Finish that reports a failure get an error status."""
        if not enabled():
            return
        contexts = self._contexts
        ended = name in ("finish", "release")
        items = []
        for result in results:
            context = contexts.pop(result.task_id, None) if ended else contexts.get(result.task_id)
            if name != "release":
                items.append({"task_id": result.task_id, "trace_context": context, "state": result.state})
        if items:
            failed = [getattr(ref, "task_id", "") for ref in refs if getattr(ref, "outcome", None) == "failed"]
            refused = [r.task_id for r in results if not r.ok]
            task_events(f"orbit.{name}", items, failed=[*failed, *refused])

    def keep_only(self, held: Container[str]) -> None:
        if len(self._contexts) > 0:
            for task_id in [t for t in self._contexts if t not in held]:
                del self._contexts[task_id]
