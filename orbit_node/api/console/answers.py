"""What the console answers after a write: the page it returns to, and the line that
says what the write did there. Pure.

A write redirects (303) to the console page it came from with a fixed word
(``?done=cancelled``) and, for an action on many tasks, its counts; the page renders the
word's sentence (``done_text``), never text taken from the request.
"""

from __future__ import annotations

import re
import urllib.parse
from collections.abc import Mapping, Sequence

# A page a write returns to: a console path, with a query of its own (the task list's filter).
BACK_PATH = re.compile(r"/console(/[A-Za-z0-9/_.-]*)?(\?[A-Za-z0-9_.~%+=&:-]*)?")
# What a page reached after a write says it did (?done=WORD: a fixed word, never echoed text).
DONE_PARAM = "done"
DONE = {
    "cancelled": "Task cancelled: it will not run.",
    "cancel-requested": "Cancellation requested: the Worker holding the task is told now, and the task ends as "
    "cancelled when its handler stops (unless it finishes first).",
    "already-cancel-requested": "Cancellation was already requested: nothing changed.",
    "already-cancelled": "The task was already cancelled: nothing changed.",
    "paused": "Queue paused: none of its tasks is dispatched until it is resumed; tasks already running go on.",
    "already-paused": "The queue was already paused: nothing changed.",
    "resumed": "Queue resumed: its due tasks are dispatched again.",
    "already-open": "The queue was not paused: nothing changed.",
    "retried": "Retried: this is the new task that runs it again (the old one keeps its state).",
    "already-retried": "The task had been retried before: this is the task that retried it; nothing was created.",
    "bulk-cancel": "{changed} tasks cancelled (or, running, asked to stop); {unchanged} had been already; "
    "{refused} could not be (they had finished otherwise).",
    "bulk-retry": "{changed} tasks retried as new tasks; {unchanged} had been retried before; {refused} could not be "
    "(only failed, cancelled and expired tasks can).",
}
# The counts a bulk action's answer carries (?changed=N&unchanged=N&refused=N).
COUNT_PARAMS = ("changed", "unchanged", "refused")
# Set (?unrecorded=1) when the write was done but its audit record could not be written.
UNRECORDED_PARAM = "unrecorded"
UNRECORDED = "Its audit record could not be written (the node's log says why)."
# A bulk action that left tasks matching: which one (?more=cancel) and its cursor.
MORE_PARAMS = ("more", "more_cursor")
# Parameters of a write's answer: not part of what the page shows, nor of its refresh.
ANSWER_PARAMS = (DONE_PARAM, UNRECORDED_PARAM, *COUNT_PARAMS, *MORE_PARAMS)


def back_path(value: str | None, default: str) -> str:
    """The console page a write returns to (its path and query), ``default`` for anything else."""
    return value if value and BACK_PATH.fullmatch(value) else default


def answer_url(back: str, params: Sequence[tuple[str, str]]) -> str:
    """``back`` with a write's answer added to its query."""
    return back + ("&" if "?" in back else "?") + urllib.parse.urlencode(params)


def done_text(args: Mapping[str, str]) -> str | None:
    """What a page reached after a write says it did (``DONE``, with its counts)."""
    done = DONE.get(args.get(DONE_PARAM, ""))
    if done is None:
        return None
    counts = {name: int(args[name]) if args.get(name, "").isdecimal() else 0 for name in COUNT_PARAMS}
    done = done.format(**counts)
    if args.get(UNRECORDED_PARAM):
        done += " " + UNRECORDED
    return done
