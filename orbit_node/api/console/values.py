"""How the console shows a task's stored values (payload, result, errors): the beginning,
laid out with indentation, its size, and whether there is more. Pure: no I/O.

The layout re-indents JSON text as it reads it, character by character, and never
parses the whole: it works on the beginning of a value the page did not read whole, so a
1 MB payload costs the page its first few KiB (``store/console.py`` reads only those).
Keys keep their stored order, and numbers and strings their stored text.
"""

from __future__ import annotations

import json

import attrs

from ...domain.wire import stored_json
from ...store.console import Head

# Characters of a payload, result or task error shown on a task's page ("the first 4 KiB").
PREVIEW_CHARS = 4096
# Characters of each attempt's error shown in the attempts table.
ATTEMPT_PREVIEW_CHARS = 1024
# Errors are TEXT columns (64 KiB at most): read whole, and shown as people read them.
ERROR_READ_CHARS = 65535
INDENT = "  "
# How a JSON text starts (anything else, as an older row's plain text, is shown as it is).
JSON_START = frozenset('{["-0123456789tfn')
WHITESPACE = frozenset(" \t\r\n")


@attrs.frozen
class Preview:
    text: str
    # True when ``text`` is not the whole value (the page links to the whole).
    truncated: bool
    # Bytes of the whole stored value.
    size: int


def preview(head: Head, limit: int) -> Preview:
    text, cut = layout(head.text, limit)
    return Preview(text, cut or not head.whole, head.size)


# What begins a traceback shown by its end.
CUT = "...\n"


def error_preview(head: Head, limit: int) -> Preview:
    """An error as people read it: ``CODE: message``, the message's line breaks kept, then
    its other fields laid out; the first ``limit`` characters. An error of another shape
    (or not read whole) is laid out as any value."""
    error = stored_json(head.text) if head.whole else None
    if not isinstance(error, dict) or not isinstance(error.get("message"), str):
        return preview(head, limit)
    text = f"{error.get('code', 'ERROR')}: {error['message']}"
    rest = {key: value for key, value in error.items() if key not in ("code", "message", "traceback")}
    if rest:
        text += "\n" + json.dumps(rest, indent=2, ensure_ascii=False)
    traceback = error.get("traceback")
    if isinstance(traceback, str) and traceback:
        # The handler's traceback as Python prints it, its end kept when it does not fit:
        # the end says where it failed (the whole value is a link away).
        room = limit - len(text) - 2
        if room > len(CUT):
            shown = traceback if len(traceback) <= room else CUT + traceback[-(room - len(CUT)) :]
            return Preview(f"{text}\n\n{shown}", len(traceback) > room, head.size)
    return Preview(text[:limit], len(text) > limit, head.size)


def layout(text: str, limit: int) -> tuple[str, bool]:
    """The first ``limit`` characters of JSON ``text`` laid out two spaces per level (as
    ``json.dumps(indent=2)`` would), and True when that is not all of it. ``text`` may be
    the beginning of a longer value."""
    if not text.lstrip()[:1] or text.lstrip()[0] not in JSON_START:
        return text[:limit], len(text) > limit
    out: list[str] = []
    size = depth = 0
    in_string = escaped = False
    # A bracket was just opened: its line break waits for what follows ("[]" stays one).
    opened = False
    for ch in text:
        if in_string:
            piece = ch
            if escaped:
                escaped = False
            elif ch == "\\":
                escaped = True
            elif ch == '"':
                in_string = False
        elif ch in WHITESPACE:
            continue
        elif ch in "}]":
            depth -= 1
            piece = ch if opened else "\n" + INDENT * depth + ch
            opened = False
        else:
            piece = "\n" + INDENT * depth if opened else ""
            opened = False
            if ch in "{[":
                depth += 1
                opened = True
                piece += ch
            elif ch == ",":
                piece = ",\n" + INDENT * depth
            elif ch == ":":
                piece = ": "
            else:
                in_string = ch == '"'
                piece += ch
        out.append(piece)
        size += len(piece)
        if size > limit:
            return "".join(out)[:limit], True
    return "".join(out), False


def size_text(size: int) -> str:
    """``850 bytes``, ``4.0 KiB``, ``1.0 MiB``."""
    if size < 1024:
        return f"{size} bytes"
    if size < 1024 * 1024:
        return f"{size / 1024:.1f} KiB"
    return f"{size / (1024 * 1024):.1f} MiB"
