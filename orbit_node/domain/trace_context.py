"""W3C Trace Context (https://www.w3.org/TR/trace-context/) as a task carries it.

A producer's ``traceparent`` (and ``tracestate``) request header is kept with the tasks it
submits (``tasks.trace_context``), copied to a retry of them, and sent with every dispatch
of them, so that the Worker's span of an attempt continues the producer's trace. Pure: no
I/O, no OpenTelemetry; ``orbit_node.tracing`` makes spans of it.

A header that does not follow the format is ignored, never refused: tracing is an
observer, and a producer's broken tracer must not cost it its tasks. Only what was
checked is stored, so a Worker never receives a value the node did not validate.
"""

from __future__ import annotations

import re

import attrs

from orbit_protocol.limits import MAX_TRACESTATE_CHARS

# version 00 only (a later version's header is not ours to reinterpret), lowercase hex as
# the format requires; the all-zero ids are invalid (checked below).
_TRACEPARENT = re.compile(r"00-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})")
_ZERO_TRACE_ID = "0" * 32
_ZERO_SPAN_ID = "0" * 16
# The W3C recommends that a tracestate of up to 512 characters be propagated; a longer one
# (or one with characters outside printable ASCII) is dropped, the traceparent kept.
TRACESTATE_MAX_CHARS = MAX_TRACESTATE_CHARS
_TRACESTATE = re.compile(r"[\x20-\x7e]*")
# The stored form: the traceparent (always 55 characters, no space), then, when there is
# one, a space and the tracestate. The column holds at most this.
STORED_MAX_CHARS = 55 + 1 + TRACESTATE_MAX_CHARS


@attrs.frozen
class TraceContext:
    """A validated trace context: what a task keeps and its dispatches carry."""

    traceparent: str
    tracestate: str | None = None

    @property
    def trace_id(self) -> str:
        return self.traceparent[3:35]

    @property
    def span_id(self) -> str:
        return self.traceparent[36:52]

    @property
    def flags(self) -> int:
        return int(self.traceparent[53:55], 16)

    def stored(self) -> str:
        """The column's text (``from_stored`` reads it back)."""
        return self.traceparent if self.tracestate is None else f"{self.traceparent} {self.tracestate}"

    @classmethod
    def from_stored(cls, text: str | None) -> TraceContext | None:
        if not text:
            return None
        traceparent, _, tracestate = text.partition(" ")
        return cls(traceparent, tracestate or None)


def parse(traceparent: str | None, tracestate: str | None = None) -> TraceContext | None:
    """The context of a ``traceparent`` header (and its ``tracestate``), or None when the
    header is absent or malformed (ignored, as the W3C asks of a receiver)."""
    if traceparent is None:
        return None
    # Surrounding whitespace is allowed around a header value; nothing else is.
    traceparent = traceparent.strip()
    match = _TRACEPARENT.fullmatch(traceparent)
    if match is None:
        return None
    trace_id, span_id, _ = match.groups()
    if trace_id == _ZERO_TRACE_ID or span_id == _ZERO_SPAN_ID:
        return None
    return TraceContext(traceparent, _tracestate(tracestate))


def _tracestate(value: str | None) -> str | None:
    if value is None:
        return None
    value = value.strip()
    if not value or len(value) > TRACESTATE_MAX_CHARS or _TRACESTATE.fullmatch(value) is None:
        return None
    return value
