"""Retention rules: how long a finished task is kept, and which rows have expired.

Pure functions, so the rules can be tested without a database. The database applies
the same rule in the pruner's statements (``db/sql/retention.sql``): a task is expired
when its state is terminal and ``finished_at < NOW(6) - retention``, the retention
being its application's for its outcome (``retain_succeeded_s`` for ``succeeded``,
``retain_failed_s`` for ``failed``, ``cancelled`` and ``expired``), or the node's
default where the application sets none. A queued, reserved or running task never
expires, whatever its age.
"""

from __future__ import annotations

import enum
import re
from collections.abc import Mapping
from datetime import datetime, timedelta
from typing import Any

import attrs

from .errors import InvalidArgument

# Units a duration may be written in, and their length in seconds.
UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}
# The shortest retention (a task is never deleted in the second it finished) and the
# longest (the columns are INT seconds: about 68 years).
MIN_RETENTION_S = 1
MAX_RETENTION_S = 2**31 - 1
# What the anchors keep by default: River's job cleaner deletes completed jobs after 24 h
# and cancelled or discarded ones after 7 days; solid_queue clears finished jobs after a
# day. Failures are kept longer because someone has to look at them.
DEFAULT_SUCCEEDED_S = 86400
DEFAULT_FAILED_S = 7 * 86400
# Audit records answer "who did this?" months later: a year, as audit logs usually keep.
DEFAULT_AUDIT_S = 365 * 86400

_DURATION = re.compile(r"([0-9]+)([smhd]?)")


class RetentionClass(enum.IntEnum):
    """The outcome classes a retention is set for."""

    SUCCEEDED = 1
    FAILED = 2

    @property
    def option(self) -> str:
        """The name of its setting on an application (``--succeeded``, ``--failed``)."""
        return self.name.lower()


# Terminal state -> its class; every other state is live and never expires.
CLASS_OF_STATE = {
    "succeeded": RetentionClass.SUCCEEDED,
    "failed": RetentionClass.FAILED,
    "cancelled": RetentionClass.FAILED,
    "expired": RetentionClass.FAILED,
}


# Class -> its terminal states, in the order the pruner reads them.
STATES_OF_CLASS = {cls: tuple(s for s, c in CLASS_OF_STATE.items() if c is cls) for cls in RetentionClass}


def class_of(state: str) -> RetentionClass | None:
    """The retention class of a task in ``state``; None for a live state."""
    return CLASS_OF_STATE.get(state)


def parse_duration(text: Any, field: str) -> int:
    """Seconds of a duration written ``90s``, ``15m``, ``12h``, ``7d`` or plain seconds
    (``3600``); at least 1 s. Raises ``InvalidArgument`` naming ``field``."""
    if isinstance(text, bool):
        raise InvalidArgument(f"{field}: expected a duration such as 90s, 15m, 12h or 7d", field=field)
    if isinstance(text, int):
        seconds = text
    else:
        found = _DURATION.fullmatch(str(text).strip().lower())
        if found is None:
            raise InvalidArgument(
                f"{field}: expected a duration such as 90s, 15m, 12h, 7d or plain seconds, got {text!r}",
                field=field,
            )
        seconds = int(found.group(1)) * UNITS[found.group(2) or "s"]
    if seconds < MIN_RETENTION_S:
        raise InvalidArgument(f"{field}: a retention is at least {MIN_RETENTION_S} s, got {text!r}", field=field)
    if seconds > MAX_RETENTION_S:
        raise InvalidArgument(f"{field}: a retention is at most {MAX_RETENTION_S} s (about 68 years)", field=field)
    return seconds


def format_duration(seconds: int) -> str:
    """The shortest way ``parse_duration`` reads back as ``seconds``: ``7d``, ``36h``, ``90s``."""
    for unit in ("d", "h", "m"):
        if seconds and seconds % UNITS[unit] == 0:
            return f"{seconds // UNITS[unit]}{unit}"
    return f"{seconds}s"


@attrs.frozen
class Retention:
    """How long an application's finished tasks are kept, per outcome class, in seconds."""

    succeeded_s: int = DEFAULT_SUCCEEDED_S
    failed_s: int = DEFAULT_FAILED_S

    def of(self, cls: RetentionClass) -> int:
        return self.succeeded_s if cls is RetentionClass.SUCCEEDED else self.failed_s

    def applied_to(self, row: Mapping[str, Any]) -> Retention:
        """An application's retention: its row's ``retain_succeeded_s`` / ``retain_failed_s``
        where set, these values (the node's defaults) where NULL."""
        succeeded, failed = row.get("retain_succeeded_s"), row.get("retain_failed_s")
        return Retention(
            self.succeeded_s if succeeded is None else int(succeeded),
            self.failed_s if failed is None else int(failed),
        )


def cutoff(now: datetime, seconds: int) -> datetime:
    """Tasks of a class that finished before this instant have expired."""
    return now - timedelta(seconds=seconds)


def is_expired(state: str, finished_at: datetime | None, now: datetime, retention: Retention) -> bool:
    """Whether a task in ``state`` that finished at ``finished_at`` is deleted at ``now``."""
    cls = class_of(state)
    if cls is None or finished_at is None:
        return False
    return finished_at < cutoff(now, retention.of(cls))
