"""Logging set-up: one JSON object per line, or plain text on a terminal."""

from __future__ import annotations

import json
import logging
import sys
import time

# Record attributes that carry request context into the JSON line when present.
CONTEXT_FIELDS = ("request_id", "application", "queue_id", "task_id", "connection_id", "node_id")


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        entry = {
            "ts": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created)) + f".{int(record.msecs):03d}Z",
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
        }
        for field in CONTEXT_FIELDS:
            value = getattr(record, field, None)
            if value is not None:
                entry[field] = value
        if record.exc_info:
            entry["exception"] = self.formatException(record.exc_info)
        return json.dumps(entry, ensure_ascii=False, default=str)


def configure_logging(level: str = "info", *, fmt: str | None = None, stream=None) -> None:
    stream = stream or sys.stderr
    if fmt is None:
        fmt = "text" if hasattr(stream, "isatty") and stream.isatty() else "json"
    handler = logging.StreamHandler(stream)
    if fmt == "json":
        handler.setFormatter(JsonFormatter())
    else:
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
