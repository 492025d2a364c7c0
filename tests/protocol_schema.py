"""Validation of Worker protocol messages against schema/worker-protocol.schema.json."""

from __future__ import annotations

import json
from pathlib import Path

import jsonschema

from orbit_protocol.messages import NODE_MESSAGES, WORKER_MESSAGES

SCHEMA_PATH = Path(__file__).resolve().parent.parent / "schema" / "worker-protocol.schema.json"
SCHEMA = json.loads(SCHEMA_PATH.read_text())
_VALIDATOR = jsonschema.Draft202012Validator(SCHEMA, format_checker=jsonschema.FormatChecker())


def validate_message(message: dict | str, *, direction: str | None = None) -> None:
    """Raise jsonschema.ValidationError unless the message matches exactly one schema branch."""
    if isinstance(message, str):
        message = json.loads(message)
    _VALIDATOR.validate(message)
    if direction is not None:
        allowed = NODE_MESSAGES if direction == "node" else WORKER_MESSAGES
        assert message["type"] in allowed, f"{message['type']} is not sent by the {direction}"
