"""The console shows a task's error as people read it: ``CODE: message``, its other
fields, then the handler's traceback with its line breaks, its end kept when the preview
has no room for all of it."""

from __future__ import annotations

import json

from orbit_node.api.console.values import CUT, error_preview
from orbit_node.store.console import Head

TRACEBACK = 'Traceback (most recent call last):\n  File "w.py", line 3, in resize\nRuntimeError: bad image\n'


def head(error: dict) -> Head:
    text = json.dumps(error)
    return Head(text, len(text.encode()))


def test_the_traceback_follows_the_message_with_its_line_breaks():
    shown = error_preview(head({"message": "RuntimeError: bad image", "traceback": TRACEBACK}), 4096)
    assert shown.text == f"ERROR: RuntimeError: bad image\n\n{TRACEBACK}"
    assert not shown.truncated


def test_a_traceback_too_long_for_the_preview_keeps_its_end():
    long = "x" * 5000 + "\nRuntimeError: bad image\n"
    shown = error_preview(head({"code": "E1", "message": "m", "traceback": long}), 1024)
    assert shown.truncated and len(shown.text) <= 1024
    assert shown.text.startswith("E1: m\n\n" + CUT) and shown.text.endswith("RuntimeError: bad image\n")


def test_an_error_without_a_traceback_reads_as_before():
    shown = error_preview(head({"code": "E1", "message": "m", "details": {"n": 1}}), 4096)
    assert shown.text == 'E1: m\n{\n  "details": {\n    "n": 1\n  }\n}'
