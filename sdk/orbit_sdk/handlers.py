"""What a handler sees and what its end becomes: the ``WorkerTask`` it receives, the
``PermanentError`` it may raise, the Finish report of an attempt that failed
(``failed``), that the node stopped (``stopped``) or whose result is not JSON
(``check_result``), and the counter an accepted Finish goes to (``task_end``). Pure:
nothing here does I/O.
"""

from __future__ import annotations

import inspect
import traceback
from collections.abc import Awaitable, Callable, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

import attrs

from orbit_protocol.limits import MAX_ERROR_MESSAGE_CHARS, MAX_TRACEBACK_CHARS
from orbit_protocol.messages import DispatchedTask, FinishReport

from .encoding import NotJson, clean_text, encode

if TYPE_CHECKING:
    from .models import Task


class PermanentError(Exception):
    """Raise from a handler to fail the task at once, without retry.

    The stored error is ``{"message": "<TypeName>: <message>", "code": code}`` (the
    type name is the raised class, so a subclass names itself; an exception chained
    with ``raise ... from exc`` is appended as ``(caused by <TypeName>: <message>)``).
    ``code`` is optional, at most 128 characters.
    """

    def __init__(self, message: str, *, code: str | None = None):
        super().__init__(message)
        self.code = code


@attrs.frozen
class WorkerTask:
    """What a handler receives: one attempt of a task, as accepted, frozen."""

    #: The task's 32-hex id.
    task_id: str
    #: The 32-hex id of the queue it was submitted to.
    queue_id: str
    #: The (handler, handler_version, payload_version) the handler was registered for.
    handler: str
    handler_version: str
    payload_version: str
    #: The submitted payload (any JSON value; integers of any size are exact).
    payload: Any
    #: This attempt's number, from 1; ``max_attempts`` is the task's limit.
    attempt: int
    max_attempts: int
    #: 0 (default) to 9.
    priority: int = 0
    #: RFC 3339 UTC time after which the task no longer runs, or None.
    deadline: str | None = None
    #: The task's resource key (at most one task per key runs at a time), or None.
    resource_key: str | None = None
    #: The W3C trace context the task was submitted with (``traceparent``, ``tracestate``),
    #: or None; the Worker's span ``orbit.task`` continues it (``orbit_sdk.tracing``).
    traceparent: str | None = None
    tracestate: str | None = None
    #: The ids of its parents (``depends_on``), each of which succeeded before it was
    #: released; empty for a task without any. ``await task.parents()`` reads them.
    parent_ids: tuple[str, ...] = ()
    # Reads tasks by id (the Worker's, set when the attempt starts).
    _read_tasks: Callable[[Sequence[str]], Awaitable[list[Task]]] | None = attrs.field(
        default=None, eq=False, repr=False, alias="read_tasks"
    )

    async def parents(self) -> list[Task]:
        """The parents, read from the node on demand with their results (``Task.result``),
        in the order of ``parent_ids``: one ``GET /v1/tasks/{id}`` each, a few at once
        (docs/sdk.md, "Dependencies"). Each one succeeded; a parent that retention deleted
        since raises ``NotFoundError`` (retention keeps a parent while its child runs)."""
        if not self.parent_ids:
            return []
        if self._read_tasks is None:
            raise RuntimeError("parents(): this WorkerTask was not handed to a handler by a Worker")
        return await self._read_tasks(self.parent_ids)


def task_of(dispatched: DispatchedTask) -> WorkerTask:
    """The attempt a handler sees of a dispatched task."""
    d = dispatched
    return WorkerTask(
        d.task_id,
        d.queue_id,
        d.handler,
        d.handler_version,
        d.payload_version,
        d.payload,
        d.attempt,
        d.max_attempts,
        d.priority,
        d.deadline,
        d.resource_key,
        d.traceparent,
        d.tracestate,
        d.parents,
    )


#: A handler: ``async def`` or plain ``def``, taking a ``WorkerTask``, returning the result.
Handler = Callable[[WorkerTask], Any]
H = TypeVar("H", bound=Handler)


def is_async(fn: Callable[..., Any]) -> bool:
    """An ``async def`` function, a partial of one, or an object whose ``__call__`` is one."""
    return inspect.iscoroutinefunction(fn) or inspect.iscoroutinefunction(type(fn).__call__)


def describe(exc: BaseException) -> str:
    """``TypeName: message`` (and its cause), cut to the protocol's bound."""
    text = f"{type(exc).__name__}: {exc}"
    cause = exc.__cause__
    if cause is not None:
        text += f" (caused by {type(cause).__name__}: {cause})"
    return text[:MAX_ERROR_MESSAGE_CHARS]


def check_result(result: Any) -> None:
    """A handler's result must be JSON: a ``ValueError`` naming the part that is not (the
    handler's failure, retryable like any other)."""
    try:
        encode(result, "result")
    except NotJson as exc:
        raise ValueError(str(exc)) from None


# What a traceback cut to the protocol's bound begins with: its end is kept.
CUT_MARK = "...\n"


def traceback_text(exc: BaseException) -> str:
    """``exc``'s traceback as Python prints it (its causes included), cut to the protocol's
    bound by dropping the beginning: the end says where it was raised."""
    text = "".join(traceback.format_exception(exc))
    if len(text) <= MAX_TRACEBACK_CHARS:
        return text
    return CUT_MARK + text[-(MAX_TRACEBACK_CHARS - len(CUT_MARK)) :]


def failed(exc: BaseException) -> dict[str, Any]:
    """The report fields of an attempt a handler ended by raising ``exc``; the error
    carries its traceback (bounded), stored with the attempt."""
    error: dict[str, Any] = {"message": clean_text(describe(exc))}
    if isinstance(exc, PermanentError) and exc.code:
        error["code"] = clean_text(exc.code)
    # A lone surrogate in the text (a file name decoded with surrogateescape, say) would
    # have the node refuse the whole finish: it is shown as U+FFFD instead.
    error["traceback"] = clean_text(traceback_text(exc))
    return {"outcome": "failed", "retryable": not isinstance(exc, PermanentError), "error": error}


@attrs.define
class FailureLog:
    """Which handler failures the Worker logs whole: the first of each kind (handler, type
    and message) in a window of ``window_s``, with its traceback; the repeats in the window
    are counted and summed up in one line when the kind fails again after it. Pure: the
    caller gives the time and logs what ``failure`` returns."""

    window_s: float = 60.0
    # kind -> (start of its window, repeats counted in it)
    _seen: dict[tuple[str, str, str], tuple[float, int]] = attrs.field(factory=dict)

    def failure(self, handler: str, exc: BaseException, now: float) -> tuple[bool, int]:
        """(log this one whole, repeats of its kind not logged since its last whole line)."""
        kind = (handler, type(exc).__name__, str(exc)[:200])
        seen = self._seen.get(kind)
        if seen is not None and now - seen[0] < self.window_s:
            self._seen[kind] = (seen[0], seen[1] + 1)
            return False, 0
        if len(self._seen) > 1000:
            self._seen.clear()  # bounded: a handler failing with ever-new messages
        self._seen[kind] = (now, 0)
        return True, 0 if seen is None else seen[1]


def stopped(reason: str | None) -> dict[str, Any]:
    """The report fields of an attempt the node stopped (``reason`` from its ``cancel``)."""
    if reason == "deadline":
        # Retryable: the node settles a task past its deadline as expired.
        error = {"message": "stopped: the task's deadline passed", "code": "DEADLINE_EXCEEDED"}
        return {"outcome": "failed", "retryable": True, "error": error}
    # The node settles a failed attempt of a task whose cancel was requested as cancelled.
    return {"outcome": "failed", "retryable": False, "error": {"message": "cancelled by the node", "code": "CANCELLED"}}


# Where a Finish the node accepted left the task, by counter name.
ENDS = ("completed", "failed", "cancelled", "expired", "retried")
TERMINAL_ENDS = ("completed", "failed", "cancelled", "expired")
# The counter of each state a Finish can leave a task in (``queued``: retried).
END_OF_STATE = {"succeeded": "completed", "failed": "failed", "cancelled": "cancelled", "expired": "expired"}


def task_end(report: FinishReport, state: str | None, attempt: int, max_attempts: int) -> str:
    """The counter of an accepted Finish: from the task's ``state`` in the ack, else (a node
    that does not say) from the report and the attempt."""
    if state is not None:
        return END_OF_STATE.get(state, "retried")
    if report.outcome == "succeeded":
        return "completed"
    if (report.error or {}).get("code") == "CANCELLED":
        return "cancelled"
    return "failed" if not report.retryable or attempt >= max_attempts else "retried"
