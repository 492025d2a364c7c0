"""Logging set-up: one JSON object per line, or plain text on a terminal.

Context: ``bind(request_id=..., application=...)`` attaches fields to every line logged
afterwards by the current trio task and the tasks it starts later (a ``ContextVar``;
trio gives every task a copy of its parent's context). The HTTP app binds the request
id, the credential's application and the ids in the path; a Worker connection binds its
connection id and application. ``extra={...}`` on a single call adds fields to that line.

Secrets: nothing logs a credential on purpose. As defence in depth every handler this
module installs redacts anything shaped like an Orbit token (``orb_`` + hex) and the
value of a ``Bearer`` authorization, in the message, the arguments, the fields and the
formatted traceback.
"""

from __future__ import annotations

import contextvars
import json
import logging
import re
import sys
import time
import types
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any, TextIO

# Fields that identify what a line is about; printed first (JSON) or in brackets (text).
CONTEXT_FIELDS = (
    "request_id",
    "application",
    "application_id",
    "namespace_id",
    "queue_id",
    "task_id",
    "plan_id",
    "connection_id",
    "node_id",
)
# Attributes every LogRecord has; anything else on a record came from ``extra=`` or the context.
_RECORD_ATTRIBUTES = frozenset(vars(logging.LogRecord("", 0, "", 0, "", (), None))) | {"message", "asctime"}

# An Orbit credential is orb_ + 32-hex id + 64-hex secret; any orb_ followed by 8 or more
# token characters is treated as one (a cut or mangled token is still a secret).
TOKEN_PATTERN = re.compile(r"orb_[0-9A-Za-z]{8,}")
# A bearer value long enough to be a credential (prose such as "the Bearer scheme" stays).
BEARER_PATTERN = re.compile(r"(?i)\b(bearer\s+)[A-Za-z0-9._~+/=-]{16,}")
REDACTED_TOKEN = "orb_[redacted]"

_context: contextvars.ContextVar[Mapping[str, Any]] = contextvars.ContextVar(
    "orbit_log_context", default=types.MappingProxyType({})
)


def redact(text: str) -> str:
    """``text`` with every token-shaped string and bearer value replaced."""
    if "orb_" not in text and "earer" not in text:
        return text
    text = TOKEN_PATTERN.sub(REDACTED_TOKEN, text)
    return BEARER_PATTERN.sub(r"\1[redacted]", text)


def bind(**fields: Any) -> None:
    """Add fields to the current task's log context (None values are dropped)."""
    current = dict(_context.get())
    current.update({k: v for k, v in fields.items() if v is not None})
    _context.set(current)


def new_context(**fields: Any) -> None:
    """Start a fresh log context for the current task (a new request or connection)."""
    _context.set({k: v for k, v in fields.items() if v is not None})


@contextmanager
def bound(**fields: Any) -> Iterator[None]:
    """``bind`` for the duration of a block."""
    token = _context.set({**_context.get(), **{k: v for k, v in fields.items() if v is not None}})
    try:
        yield
    finally:
        _context.reset(token)


def context() -> Mapping[str, Any]:
    return _context.get()


class ContextFilter(logging.Filter):
    """Copies the bound context onto each record (fields given with ``extra=`` win)."""

    def filter(self, record: logging.LogRecord) -> bool:
        for name, value in _context.get().items():
            if not hasattr(record, name):
                setattr(record, name, value)
        return True


class RedactingFilter(logging.Filter):
    """Replaces token-shaped strings in the message and in string fields of a record."""

    def filter(self, record: logging.LogRecord) -> bool:
        try:
            message = record.getMessage()
        except Exception:  # a bad format string: keep the raw parts, redacted
            message = f"{record.msg} {record.args!r}"
        cleaned = redact(message)
        if cleaned != message or record.args:
            record.msg, record.args = cleaned, None
        for name, value in list(vars(record).items()):
            if name not in _RECORD_ATTRIBUTES and isinstance(value, str):
                setattr(record, name, redact(value))
        return True


def _fields(record: logging.LogRecord) -> dict[str, Any]:
    """Context and ``extra`` fields of a record, context fields first."""
    found = {name: getattr(record, name) for name in CONTEXT_FIELDS if getattr(record, name, None) is not None}
    for name, value in vars(record).items():
        if name not in _RECORD_ATTRIBUTES and name not in found and not name.startswith("_") and value is not None:
            found[name] = value
    return found


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        entry = {
            "ts": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created)) + f".{int(record.msecs):03d}Z",
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
        }
        for name, value in _fields(record).items():
            entry.setdefault(name, value)
        if record.exc_info:
            entry["exception"] = self.formatException(record.exc_info)
        elif record.exc_text:
            entry["exception"] = record.exc_text
        return redact(json.dumps(entry, ensure_ascii=False, default=str))


class TextFormatter(logging.Formatter):
    """``time LEVEL logger: message [field=value ...]`` for people at a terminal."""

    def __init__(self) -> None:
        super().__init__("%(asctime)s %(levelname)s %(name)s: %(message)s")

    def format(self, record: logging.LogRecord) -> str:
        line = super().format(record)
        fields = _fields(record)
        if fields:
            extra = " ".join(f"{name}={value}" for name, value in fields.items())
            head, sep, tail = line.partition("\n")
            line = f"{head} [{extra}]{sep}{tail}"
        return redact(line)


def make_handler(fmt: str = "auto", stream: TextIO | None = None) -> logging.Handler:
    """A stream handler with the context and redaction filters and the chosen format."""
    stream = stream or sys.stderr
    if fmt == "auto":
        fmt = "text" if hasattr(stream, "isatty") and stream.isatty() else "json"
    if fmt not in ("json", "text"):
        raise ValueError(f"unknown log format {fmt!r}")
    handler = logging.StreamHandler(stream)
    handler.addFilter(ContextFilter())
    handler.addFilter(RedactingFilter())
    handler.setFormatter(JsonFormatter() if fmt == "json" else TextFormatter())
    return handler


def configure_logging(level: str = "info", *, fmt: str | None = None, stream: TextIO | None = None) -> None:
    """Send every logger's records to one handler on ``stream`` (stderr) at ``level``."""
    handler = make_handler(fmt or "auto", stream)
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
