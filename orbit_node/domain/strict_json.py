"""JSON text read strictly (RFC 8259, no extensions), for every JSON a client sends: an
HTTP request body (``rules.parse_json``) and a Worker's protocol message
(``workers.protocol.parse_message``).

Refused, with a ``NotStrictJson`` whose message says why: text that is not UTF-8, syntax
errors, duplicate object keys, ``NaN`` and the infinities, numbers out of the float
range or integer literals too long to read, nesting deeper than ``MAX_JSON_DEPTH``, and
strings holding a lone UTF-16 surrogate. Each caller turns the refusal into its own
error (a 400 naming ``body``, a protocol error frame).
"""

from __future__ import annotations

import json
import math
import re
from typing import Any

# Containers nested deeper than this are refused: far below the interpreter's
# recursion limit, so parsing and re-serialising can never hit it.
MAX_JSON_DEPTH = 64
SURROGATES = re.compile(r"[\ud800-\udfff]")
# What json.loads builds containers as (the object hook returns a plain dict).
CONTAINERS = frozenset({dict, list})


class NotStrictJson(ValueError):
    """The text is not strict JSON; the message says why."""


def show(value: Any) -> str:
    """A short, safe rendering of a client value for an error message."""
    try:
        text = json.dumps(value, ensure_ascii=True)
    except (TypeError, ValueError):
        text = type(value).__name__
    return text if len(text) <= 40 else text[:37] + "..."


def _object(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    result = dict(pairs)
    if len(result) != len(pairs):
        seen: set[str] = set()
        for key, _ in pairs:
            if key in seen:
                raise NotStrictJson(f"duplicate object key {show(key)}")
            seen.add(key)
    return result


def _constant(name: str) -> Any:
    raise NotStrictJson(f"{name} is not a JSON number")


def _float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise NotStrictJson(f"number {text[:40]} is out of range")
    return value


def _int(text: str) -> int:
    try:
        return int(text)
    except ValueError:  # longer than sys.get_int_max_str_digits()
        raise NotStrictJson(f"integer literal of {len(text.lstrip('-'))} digits is too long") from None


def _check_tree(value: Any, *, strings: bool) -> None:
    """Depth limit and (with ``strings``) lone surrogates, a level at a time.

    A surrogate can only come from a ``\\u`` escape (strict UTF-8 decoding refuses encoded
    ones), so a text without one needs only its containers visited.
    """
    level = [value]
    depth = 0
    while level:
        below: list[Any] = []
        for item in level:
            kind = type(item)
            if kind is dict or kind is list:
                if depth >= MAX_JSON_DEPTH:
                    raise NotStrictJson(f"JSON nested deeper than {MAX_JSON_DEPTH} levels")
                children = item.values() if kind is dict else item
                if strings:
                    if kind is dict:
                        below += item
                    below += children
                else:
                    below += [v for v in children if type(v) in CONTAINERS]
            elif strings and kind is str and SURROGATES.search(item):
                raise NotStrictJson("string contains a lone UTF-16 surrogate")
        level = below
        depth += 1


def loads(raw: bytes | str) -> Any:
    """The value of strict JSON text (bytes must be UTF-8); ``NotStrictJson`` otherwise."""
    if isinstance(raw, bytes):
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise NotStrictJson(f"not valid UTF-8 (byte {exc.start})") from None
    else:
        text = raw
    try:
        value = json.loads(
            text, object_pairs_hook=_object, parse_constant=_constant, parse_float=_float, parse_int=_int
        )
    except json.JSONDecodeError as exc:
        raise NotStrictJson(f"not valid JSON ({exc.msg} at line {exc.lineno} column {exc.colno})") from None
    except RecursionError:
        raise NotStrictJson(f"JSON nested deeper than {MAX_JSON_DEPTH} levels") from None
    _check_tree(value, strings="\\u" in text)
    return value
