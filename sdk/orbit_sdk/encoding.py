"""JSON as the SDK sends it, and where a value that is not JSON sits.

``dumps`` is the one encoding of every body the client sends and of every result a
Worker reports: compact, UTF-8 as is, and strict (NaN and the infinities are refused,
and so are strings holding a lone surrogate, as the node refuses them). When it fails,
``not_json`` walks the value to name the first part that is not JSON by its path
(``payload.tags[2]``), so the error says what to fix instead of Python's "Object of type
set is not JSON serializable".
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping
from typing import Any

# An id of the node's: 32 lowercase hex characters.
from orbit_protocol.messages import HEX32

# What a JSON value may be, as the error messages say it.
JSON_KINDS = "null, true/false, a number, a string, a list or an object with string keys"


def is_id(value: object) -> bool:
    """``value`` has the form of an id of the node's (a task's, a queue's)."""
    return isinstance(value, str) and HEX32.fullmatch(value) is not None


# U+D800-U+DFFF: in a str each is a lone surrogate (Python keeps even a "pair" as two
# code points), which UTF-8, and so the node, cannot carry. Such text comes from bytes
# decoded with errors="surrogateescape" (file names, os.environ) or from "\\ud800" escapes.
SURROGATE = re.compile("[\ud800-\udfff]")


def clean_text(text: str) -> str:
    """``text`` with every lone surrogate replaced by U+FFFD, for text that only has to be
    read (an error's message, a traceback)."""
    return SURROGATE.sub("\ufffd", text)


def dumps(value: Any) -> str:
    """The compact, strict JSON text of ``value``; TypeError / ValueError when it is not JSON."""
    text = json.dumps(value, separators=(",", ":"), ensure_ascii=False, allow_nan=False)
    if SURROGATE.search(text) is not None:
        raise ValueError("a string holds a lone surrogate")
    return text


class NotJson(ValueError):
    """A value ``dumps`` refuses: ``field`` is the path of its first part that is not
    JSON, ``why`` says what that part is."""

    def __init__(self, field: str, why: str):
        super().__init__(f"{field}: {why}")
        self.field = field
        self.why = why


def encode(value: Any, path: str) -> str:
    """``dumps(value)``, or ``NotJson`` naming the first part that is not JSON (``path``
    names ``value`` itself; empty for a request body, whose keys then start the path)."""
    try:
        return dumps(value)
    except (TypeError, ValueError, RecursionError) as exc:
        try:
            found = not_json(value, path)
        except RecursionError:
            found = None
        raise NotJson(*(found or (path or "body", f"not JSON ({exc})"))) from None


def _child(path: str, key: str | int) -> str:
    if isinstance(key, int):
        return f"{path}[{key}]"
    return f"{path}.{key}" if path else key


def not_json(value: Any, path: str) -> tuple[str, str] | None:
    """The first part of ``value`` that ``dumps`` refuses, as (path, why), or None.

    ``path`` names ``value`` itself (``payload``; empty for a whole body, whose keys
    then start the path). Mirrors what ``json.dumps`` accepts: tuples are lists; int,
    float, bool and None keys become strings; any other key, a float that is not
    finite, an object of another type or a container that holds itself is refused."""
    return _walk(value, path, set())


def _walk(value: Any, path: str, open_containers: set[int]) -> tuple[str, str] | None:
    where = path or "the value"
    if isinstance(value, str):
        return _surrogate_in(value, where, "")
    if value is None or isinstance(value, (bool, int)):
        return None
    if isinstance(value, float):
        return None if math.isfinite(value) else (where, f"{value!r} is not a JSON number (NaN and infinities are not)")
    if not isinstance(value, (list, tuple, Mapping)):
        return (where, f"a {type(value).__name__} is not a JSON value (expected {JSON_KINDS})")
    if id(value) in open_containers:
        return (where, "the value contains itself")
    open_containers.add(id(value))
    try:
        if isinstance(value, Mapping):
            if not isinstance(value, dict):
                return (where, f"a {type(value).__name__} is not a JSON value (expected {JSON_KINDS})")
            for key, item in value.items():
                if not isinstance(key, (str, int, float, bool)) and key is not None:
                    return (where, f"key {key!r} is a {type(key).__name__}; JSON object keys are strings")
                if isinstance(key, str) and (found := _surrogate_in(key, where, f"key {key!r}: ")) is not None:
                    return found
                found = _walk(item, _child(path, str(key)), open_containers)
                if found is not None:
                    return found
            return None
        for index, item in enumerate(value):
            found = _walk(item, _child(path, index), open_containers)
            if found is not None:
                return found
        return None
    finally:
        open_containers.discard(id(value))


def _surrogate_in(text: str, where: str, what: str) -> tuple[str, str] | None:
    found = SURROGATE.search(text)
    if found is None:
        return None
    return (
        where,
        f"{what}character {found.start()} is a lone surrogate (U+{ord(found.group()):04X}), which is not "
        "Unicode text: JSON strings are UTF-8",
    )
