"""A plan version's ``definition``: the task template and the schedule, validated.

``definition.task`` goes through the same validator as ``POST /v1/tasks``
(``api.rules.task_template``: same fields, same rules, priority a JSON integer 0-9),
without the fields that belong to each created task (queue, available_at, delay_s,
deadline). ``definition.schedule`` is checked here. Every refusal is
``InvalidArgument`` naming the dotted field (``definition.schedule.cron``).
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

import attrs
from croniter import CroniterError, croniter

from ..errors import InvalidArgument
from ..rules import NewTask, canonical_json, integer, reject_unknown, require, task_template, timestamp
from ..strict_json import show
from .schedule import CATCH_UP_POLICIES, DEFAULT_GRACE_S, DEFAULT_TIME_ZONE, Schedule

DEFINITION_FIELDS = ("task", "schedule")
SCHEDULE_FIELDS = ("interval_s", "cron", "time_zone", "start_at", "end_at", "catch_up", "grace_s")
# One fire time a second at most; a year (366 days) at the longest.
INTERVAL_S_MAX = 366 * 24 * 3600
# A fire time may be a day late and still count as on time, no more.
GRACE_S_MAX = 24 * 3600
# Exactly five fields (minute hour day-of-month month day-of-week) of printable ASCII;
# croniter's seconds/year columns and @nicknames are not part of the contract.
CRON_MAX_LENGTH = 200
CRON_TEXT = re.compile(r"[\x21-\x7e]+(?: +[\x21-\x7e]+){4}")
# Where the "can it ever fire" check of a cron expression starts looking.
CRON_CHECK_FROM = datetime(2000, 1, 1, tzinfo=UTC)
# IANA zone names: letters, digits and _ + - / only (no paths such as ../).
TIME_ZONE_NAME = re.compile(r"[A-Za-z0-9_+-]+(?:/[A-Za-z0-9_+-]+)*")


@attrs.frozen
class Definition:
    """A validated definition; ``document`` is the JSON value as the client gave it."""

    document: Mapping[str, Any]
    # The NewTask fields of the template (queue_id excluded).
    task_fields: Mapping[str, Any]
    schedule: Schedule

    def task_for(self, queue_id: str, fire_at: datetime) -> NewTask:
        """The task of one fire time: the template, in the plan's queue, available at the fire time."""
        return NewTask(queue_id=queue_id, available_at=fire_at, **self.task_fields)

    @property
    def priority(self) -> int:
        return int(self.task_fields.get("priority", 0))

    def text(self) -> str:
        """The stored form: canonical JSON (sorted keys), integers exact."""
        return canonical_json(self.document)


def parse_definition(value: Any, field: str = "definition") -> Definition:
    """Validate a definition (from a request body, or as stored in plan_versions)."""
    if not isinstance(value, dict):
        raise InvalidArgument(f"{field}: must be an object, got {show(value)}", field=field)
    prefix = field + "."
    reject_unknown(value, DEFINITION_FIELDS, prefix)
    task = task_template(require(value, "task", prefix), prefix + "task")
    schedule = parse_schedule(require(value, "schedule", prefix), prefix + "schedule")
    return Definition(value, task, schedule)


def parse_stored(text: str) -> Definition:
    """A definition as plan_versions stores it (it was validated when the version was created)."""
    return parse_definition(json.loads(text))


def parse_schedule(value: Any, field: str) -> Schedule:
    if not isinstance(value, dict):
        raise InvalidArgument(f"{field}: must be an object, got {show(value)}", field=field)
    prefix = field + "."
    reject_unknown(value, SCHEDULE_FIELDS, prefix)
    if "interval_s" not in value and "cron" not in value:
        raise InvalidArgument(f"{field}: give interval_s and/or cron", field=field)
    interval_s = None
    if "interval_s" in value:
        interval_s = integer(value["interval_s"], prefix + "interval_s", 1, INTERVAL_S_MAX)
    time_zone = DEFAULT_TIME_ZONE
    if "time_zone" in value:
        if "cron" not in value:
            raise InvalidArgument(
                f"{prefix}time_zone: only a cron schedule has a time zone (intervals are absolute)",
                field=prefix + "time_zone",
            )
        time_zone = _time_zone(value["time_zone"], prefix + "time_zone")
    start_at = timestamp(value["start_at"], prefix + "start_at") if "start_at" in value else None
    end_at = timestamp(value["end_at"], prefix + "end_at") if "end_at" in value else None
    if start_at is not None and end_at is not None and end_at < start_at:
        raise InvalidArgument(f"{prefix}end_at: must not be before start_at", field=prefix + "end_at")
    catch_up = value.get("catch_up", CATCH_UP_POLICIES[0])
    if not isinstance(catch_up, str) or catch_up not in CATCH_UP_POLICIES:
        raise InvalidArgument(
            f"{prefix}catch_up: must be one of {', '.join(CATCH_UP_POLICIES)}, got {show(catch_up)}",
            field=prefix + "catch_up",
        )
    grace_s = DEFAULT_GRACE_S
    if "grace_s" in value:
        grace_s = integer(value["grace_s"], prefix + "grace_s", 1, GRACE_S_MAX)
    cron = None
    if "cron" in value:
        cron = _cron(value["cron"], prefix + "cron", time_zone)
    return Schedule(
        interval_s=interval_s,
        cron=cron,
        time_zone=time_zone,
        start_at=start_at,
        end_at=end_at,
        catch_up=catch_up,
        grace_s=grace_s,
    )


def _time_zone(value: Any, field: str) -> str:
    rule = "an IANA time zone name such as Europe/Berlin or UTC"
    if not isinstance(value, str) or len(value) > 64 or not TIME_ZONE_NAME.fullmatch(value):
        raise InvalidArgument(f"{field}: must be {rule}, got {show(value)}", field=field)
    try:
        ZoneInfo(value)
    except (ZoneInfoNotFoundError, ValueError, OSError):
        raise InvalidArgument(f"{field}: unknown time zone {show(value)}; must be {rule}", field=field) from None
    return value


def _cron(value: Any, field: str, time_zone: str) -> str:
    rule = 'a 5-field cron expression "minute hour day-of-month month day-of-week"'
    if not isinstance(value, str) or len(value) > CRON_MAX_LENGTH or not CRON_TEXT.fullmatch(value.strip()):
        raise InvalidArgument(f"{field}: must be {rule}, got {show(value)}", field=field)
    expression = " ".join(value.split())
    try:
        # Expanding checks every field; a first match proves the expression can fire at all
        # (croniter looks 50 years ahead, more than the 28-year cycle of the calendar:
        # "0 0 30 2 *" never matches).
        croniter(expression, CRON_CHECK_FROM.astimezone(ZoneInfo(time_zone))).get_next(datetime)
    except (CroniterError, ValueError, KeyError, OverflowError) as exc:
        reason = str(exc).strip() or type(exc).__name__
        raise InvalidArgument(f"{field}: not a valid cron expression {show(value)} ({reason})", field=field) from None
    return expression
