"""The console's task filters: a page's query (or a form) as a ``TaskFilter`` with the
API's rules, and back as query parameters for links, forms and the audit. Pure.

The filters are ``GET /v1/tasks``'s (``task_query.filter_from_query``: every refusal names
its field), plus ``task_id``, an id or its beginning (``store/console.py``), and
``cursor``, where the page starts. Times may be given as the browser's
``datetime-local`` inputs send them (``2026-03-01T12:30``), read as UTC.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence

import attrs

from ...domain.errors import InvalidArgument
from ...domain.task_query import FILTER_FIELDS, TaskCursor, TaskFilter, filter_from_query
from ...domain.wire import rfc3339

# The filters the console's forms offer (task_ids, a list of exact ids, is the API's only).
FIELDS = tuple(name for name in FILTER_FIELDS if name != "task_ids")
TIME_FIELDS = ("created_after", "created_before", "finished_after", "finished_before")
# What a datetime-local input sends: minutes, or seconds, without a zone.
LOCAL_TIME = re.compile(r"[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9]{2}:[0-9]{2}(:[0-9]{2})?")
HEX = frozenset("0123456789abcdef")


@attrs.frozen
class Query:
    """What a task page shows: the filter, an id or its beginning, where the page starts."""

    filter: TaskFilter
    # An id's beginning, 1 to 31 hex digits ("" for none); a whole id opens its task.
    prefix: str = ""
    cursor: TaskCursor | None = None

    @property
    def is_empty(self) -> bool:
        return self.filter.is_empty and not self.prefix


def query_of(args: Mapping[str, Sequence[str]], *, defaults: Mapping[str, Sequence[str]] | None = None) -> Query:
    """The console's query parameters (name -> values; other names are ignored, as a
    browser may add its own). Empty values count as absent."""
    values = {name: [v.strip() for v in args.get(name, ()) if v.strip()] for name in (*FIELDS, "task_id", "cursor")}
    for name, given in (defaults or {}).items():
        values[name] = values[name] or list(given)
    for name in TIME_FIELDS:
        values[name] = [
            v + ("Z" if v.count(":") == 2 else ":00Z") if LOCAL_TIME.fullmatch(v) else v for v in values[name]
        ]
    found = filter_from_query({name: values[name] for name in FIELDS if values[name]})
    if found.matches_nothing:
        raise InvalidArgument("priority: these priority bounds leave no level", field="priority")
    prefix = ""
    if values["task_id"]:
        if len(values["task_id"]) > 1:
            raise InvalidArgument("task_id: given more than once", field="task_id")
        prefix = values["task_id"][0].lower()
        if not 1 <= len(prefix) <= 32 or not set(prefix) <= HEX:
            raise InvalidArgument(
                "task_id: a task id is 32 hexadecimal digits; give all of them, or its first ones", field="task_id"
            )
    cursor = None
    if values["cursor"]:
        cursor = TaskCursor.decode(values["cursor"][0])
    return Query(found, prefix, cursor)


def filter_params(found: TaskFilter) -> list[tuple[str, str]]:
    """The filter as query parameters (``filter_from_query`` reads them back the same)."""
    params: list[tuple[str, str]] = []
    if found.queue_id:
        params.append(("queue_id", found.queue_id))
    params += [("state", state) for state in found.states]
    if found.handler:
        params.append(("handler", found.handler))
    if found.priorities is not None:
        params += [("priority", str(p)) for p in found.priorities]
    for name in TIME_FIELDS:
        value = getattr(found, name)
        if value is not None:
            params.append((name, rfc3339(value) or ""))
    params += [("task_ids", task_id) for task_id in found.task_ids]
    return params


def filter_json(found: TaskFilter) -> dict[str, object]:
    """The filter as the API's bulk actions take it (``{"filter": {...}}``): the audit's."""
    lists: dict[str, list[object]] = {}
    document: dict[str, object] = {}
    for name, value in filter_params(found):
        if name in ("state", "priority", "task_ids"):
            lists.setdefault(name, []).append(int(value) if name == "priority" else value)
        else:
            document[name] = value
    return {**document, **lists}


def query_params(query: Query, *, cursor: TaskCursor | None = None) -> list[tuple[str, str]]:
    """A page's query parameters: its filter and id prefix, and ``cursor`` (where it starts)."""
    params = ([("task_id", query.prefix)] if query.prefix else []) + filter_params(query.filter)
    return params + ([("cursor", cursor.encode())] if cursor is not None else [])
