"""Fire times and catch-up decisions: pure functions, no database, no clock."""

from __future__ import annotations

import itertools
from datetime import datetime, timedelta

import pytest

from orbit_node.domain.plans.definition import parse_schedule
from orbit_node.domain.plans.schedule import LATEST, Schedule, due_fire_times


def at(text: str) -> datetime:
    """A naive UTC instant from 'YYYY-MM-DD HH:MM[:SS[.ffffff]]'."""
    return datetime.fromisoformat(text)


def s(n: float) -> timedelta:
    return timedelta(seconds=n)


def fire_times(schedule: Schedule, start: datetime, count: int) -> list[datetime]:
    result, current = [], schedule.first_at_or_after(start)
    while current is not None and len(result) < count:
        result.append(current)
        current = schedule.next_after(current)
    return result


# -- fixed intervals -------------------------------------------------------------------


def test_an_interval_without_start_is_aligned_to_the_unix_epoch():
    hourly = Schedule(interval_s=3600)
    assert hourly.first_at_or_after(at("2030-05-06 10:20:00.5")) == at("2030-05-06 11:00")
    assert hourly.first_at_or_after(at("2030-05-06 11:00")) == at("2030-05-06 11:00")
    assert hourly.next_after(at("2030-05-06 11:00")) == at("2030-05-06 12:00")
    assert hourly.last_at_or_before(at("2030-05-06 10:59:59.999999")) == at("2030-05-06 10:00")
    # 7 s does not divide a day: the grid still runs from 1970-01-01T00:00:00Z.
    seven = Schedule(interval_s=7)
    first = seven.first_at_or_after(at("2030-05-06 00:00"))
    assert (first - at("1970-01-01 00:00")).total_seconds() % 7 == 0
    assert first - at("2030-05-06 00:00") < s(7)


def test_an_interval_with_start_at_is_anchored_there_to_the_microsecond():
    schedule = Schedule(interval_s=90, start_at=at("2030-01-01 00:00:00.250000"))
    assert schedule.first_at_or_after(at("2020-01-01 00:00")) == at("2030-01-01 00:00:00.25")
    assert fire_times(schedule, at("2030-01-01 00:00:01"), 3) == [
        at("2030-01-01 00:01:30.25"),
        at("2030-01-01 00:03:00.25"),
        at("2030-01-01 00:04:30.25"),
    ]
    assert schedule.last_at_or_before(at("2030-01-01 00:00:00.249999")) is None


def test_start_and_end_bound_the_fire_times_inclusively():
    schedule = Schedule(interval_s=60, start_at=at("2030-01-01 00:00"), end_at=at("2030-01-01 00:03"))
    assert fire_times(schedule, at("2000-01-01 00:00"), 10) == [
        at("2030-01-01 00:00"),
        at("2030-01-01 00:01"),
        at("2030-01-01 00:02"),
        at("2030-01-01 00:03"),
    ]
    assert schedule.next_after(at("2030-01-01 00:03")) is None
    assert schedule.last_at_or_before(at("2031-01-01 00:00")) == at("2030-01-01 00:03")
    assert schedule.last_at_or_before(at("2029-12-31 23:59")) is None


def test_no_fire_time_lies_beyond_what_the_database_can_store():
    schedule = Schedule(interval_s=366 * 86400)
    last = schedule.last_at_or_before(LATEST)
    assert last is not None and schedule.next_after(last) is None
    assert schedule.next_after(LATEST) is None


# -- cron --------------------------------------------------------------------------------


def test_cron_fires_at_wall_clock_times_of_its_time_zone():
    nine_in_berlin = Schedule(cron="0 9 * * *", time_zone="Europe/Berlin")
    # Winter: UTC+1; summer: UTC+2.
    assert nine_in_berlin.first_at_or_after(at("2030-01-15 00:00")) == at("2030-01-15 08:00")
    assert nine_in_berlin.first_at_or_after(at("2030-07-15 00:00")) == at("2030-07-15 07:00")
    assert nine_in_berlin.last_at_or_before(at("2030-07-15 06:59:59")) == at("2030-07-14 07:00")
    assert Schedule(cron="0 9 * * *").first_at_or_after(at("2030-01-15 00:00")) == at("2030-01-15 09:00")


def test_cron_across_daylight_saving_changes():
    # 2030-03-31: Berlin skips 02:00-03:00. A skipped wall time fires once, right after the gap.
    daily = Schedule(cron="30 2 * * *", time_zone="Europe/Berlin")
    assert fire_times(daily, at("2030-03-30 00:00"), 3) == [
        at("2030-03-30 01:30"),
        at("2030-03-31 01:00"),
        at("2030-04-01 00:30"),
    ]
    # 2030-10-27: 02:00-03:00 happens twice; both instants of 02:30 fire, an hour apart.
    assert fire_times(daily, at("2030-10-26 12:00"), 3) == [
        at("2030-10-27 00:30"),
        at("2030-10-27 01:30"),
        at("2030-10-28 01:30"),
    ]
    # Fire times always increase, whatever the zone does.
    quarterly = Schedule(cron="*/15 * * * *", time_zone="Europe/Berlin")
    times = fire_times(quarterly, at("2030-10-26 22:00"), 20)
    assert all(b - a == s(900) for a, b in itertools.pairwise(times))


def test_interval_and_cron_together_are_the_union_and_a_shared_time_fires_once():
    schedule = Schedule(interval_s=1800, cron="10 * * * *")
    assert fire_times(schedule, at("2030-01-01 00:00"), 5) == [
        at("2030-01-01 00:00"),
        at("2030-01-01 00:10"),
        at("2030-01-01 00:30"),
        at("2030-01-01 01:00"),
        at("2030-01-01 01:10"),
    ]
    both = Schedule(interval_s=3600, cron="0 * * * *")
    assert fire_times(both, at("2030-01-01 00:00"), 3) == [
        at("2030-01-01 00:00"),
        at("2030-01-01 01:00"),
        at("2030-01-01 02:00"),
    ]


def test_cron_extensions_croniter_reads():
    last_day = Schedule(cron="0 0 L * *")
    assert last_day.first_at_or_after(at("2030-02-01 00:00")) == at("2030-02-28 00:00")
    third_friday = Schedule(cron="0 12 * * 5#3")
    assert third_friday.first_at_or_after(at("2030-01-01 00:00")) == at("2030-01-18 12:00")


# -- what a trigger transaction creates ---------------------------------------------------


def test_every_fire_time_within_the_grace_window_is_created_in_order():
    schedule = Schedule(interval_s=10, grace_s=60)
    now = at("2030-01-01 00:01:05")
    firing = due_fire_times(schedule, at("2030-01-01 00:00:10"), now, limit=100)
    assert firing.fire_times == tuple(at("2030-01-01 00:00:10") + s(10 * k) for k in range(6))
    assert firing.next_fire_at == at("2030-01-01 00:01:10")
    assert (firing.skipped_missed, firing.caught_up) == (False, None)


def test_a_fire_time_exactly_at_now_is_due_and_one_grace_s_old_is_still_on_time():
    schedule = Schedule(interval_s=60, grace_s=60)
    now = at("2030-01-01 00:02")
    firing = due_fire_times(schedule, at("2030-01-01 00:01"), now, limit=100)
    assert firing.fire_times == (at("2030-01-01 00:01"), at("2030-01-01 00:02"))
    late = due_fire_times(schedule, at("2030-01-01 00:01"), now + timedelta(microseconds=1), limit=100)
    assert late.fire_times == (at("2030-01-01 00:02"),) and late.skipped_missed


def test_a_limit_cuts_the_batch_and_the_plan_stays_due():
    schedule = Schedule(interval_s=1, grace_s=3600)
    now = at("2030-01-01 01:00")
    firing = due_fire_times(schedule, at("2030-01-01 00:59:00"), now, limit=7)
    assert len(firing.fire_times) == 7
    assert firing.next_fire_at == at("2030-01-01 00:59:07") <= now


def test_not_yet_due_creates_nothing():
    schedule = Schedule(interval_s=60)
    firing = due_fire_times(schedule, at("2030-01-01 00:01"), at("2030-01-01 00:00:59"), limit=10)
    assert firing.fire_times == () and firing.next_fire_at == at("2030-01-01 00:01")


def test_skip_after_an_outage_creates_only_what_is_still_on_time():
    schedule = Schedule(interval_s=600, grace_s=60, catch_up="skip")
    now = at("2030-01-02 00:25:30")
    firing = due_fire_times(schedule, at("2030-01-01 00:00"), now, limit=100)
    assert firing.fire_times == ()
    assert firing.next_fire_at == at("2030-01-02 00:30")
    assert firing.skipped_missed is True
    # With the last fire time 30 s ago (within the grace window), that one is still created.
    firing = due_fire_times(schedule, at("2030-01-01 00:00"), at("2030-01-02 00:20:30"), limit=100)
    assert firing.fire_times == (at("2030-01-02 00:20"),)


def test_fire_once_after_an_outage_creates_one_task_for_the_latest_missed_time():
    schedule = Schedule(interval_s=600, grace_s=60, catch_up="fire_once")
    now = at("2030-01-02 00:25:30")
    firing = due_fire_times(schedule, at("2030-01-01 00:00"), now, limit=100)
    assert firing.fire_times == (at("2030-01-02 00:20"),)
    assert firing.caught_up == at("2030-01-02 00:20")
    assert firing.next_fire_at == at("2030-01-02 00:30")
    # Missed times and on-time ones: one task for all missed, then each on-time one.
    dense = Schedule(interval_s=20, grace_s=60, catch_up="fire_once")
    firing = due_fire_times(dense, at("2030-01-01 00:00"), at("2030-01-02 00:00:30"), limit=100)
    assert firing.fire_times == (
        at("2030-01-01 23:59:20"),  # the latest missed (more than 60 s late)
        at("2030-01-01 23:59:40"),
        at("2030-01-02 00:00:00"),
        at("2030-01-02 00:00:20"),
    )
    assert firing.caught_up == at("2030-01-01 23:59:20")


def test_a_single_missed_fire_time_under_fire_once_is_created_and_nothing_was_skipped():
    schedule = Schedule(interval_s=3600, grace_s=60, catch_up="fire_once")
    firing = due_fire_times(schedule, at("2030-01-01 00:00"), at("2030-01-01 00:05"), limit=100)
    assert firing.fire_times == (at("2030-01-01 00:00"),)
    assert firing.skipped_missed is False and firing.caught_up == at("2030-01-01 00:00")


def test_a_next_fire_at_written_off_the_grid_counts_as_a_fire_time():
    schedule = Schedule(interval_s=60, grace_s=3600)
    firing = due_fire_times(schedule, at("2030-01-01 00:00:30"), at("2030-01-01 00:02"), limit=100)
    assert firing.fire_times == (at("2030-01-01 00:00:30"), at("2030-01-01 00:01"), at("2030-01-01 00:02"))
    # ... also as the only missed one.
    once = Schedule(interval_s=3600, grace_s=60, catch_up="fire_once")
    firing = due_fire_times(once, at("2030-01-01 00:00:30"), at("2030-01-01 00:30"), limit=100)
    assert firing.fire_times == (at("2030-01-01 00:00:30"),) and firing.next_fire_at == at("2030-01-01 01:00")


def test_a_year_long_outage_of_a_minutely_cron_is_decided_without_walking_the_year():
    schedule = Schedule(cron="* * * * *", catch_up="fire_once", grace_s=1)
    firing = due_fire_times(schedule, at("2029-01-01 00:00"), at("2030-01-01 00:00:30"), limit=100)
    assert firing.fire_times == (at("2030-01-01 00:00"),)
    assert firing.next_fire_at == at("2030-01-01 00:01")


# -- parsing ---------------------------------------------------------------------------------


def test_a_parsed_schedule_has_the_documented_defaults():
    schedule = parse_schedule({"cron": "  0   9 * * 1-5 "}, "schedule")
    assert schedule == Schedule(cron="0 9 * * 1-5", time_zone="UTC", catch_up="skip", grace_s=60)
    timed = parse_schedule({"interval_s": 60, "start_at": "2030-01-01T01:00:00+01:00"}, "schedule")
    assert timed.start_at == at("2030-01-01 00:00")


@pytest.mark.parametrize(
    "schedule",
    [{}, {"interval_s": 60, "catch_up": "never"}, {"cron": "0 9 * * *", "time_zone": "Nowhere/City"}],
)
def test_schedule_refusals_name_the_field(schedule):
    from orbit_node.domain.errors import InvalidArgument

    with pytest.raises(InvalidArgument) as caught:
        parse_schedule(schedule, "definition.schedule")
    assert caught.value.field.startswith("definition.schedule")
    assert caught.value.message.startswith(caught.value.field)
