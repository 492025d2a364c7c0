"""The time cap of async tests (tests/timecap.py), shown on test files run by pytester."""

from __future__ import annotations

HANGING = """
import pytest
import trio


@pytest.mark.time_cap(0.5)
async def test_hangs():
    await trio.sleep_forever()


@pytest.mark.time_cap(0.5)
async def test_hangs_on_virtual_time(autojump_clock):
    await trio.Event().wait()


@pytest.mark.time_cap(0.5)
async def test_cleanup_runs_when_cancelled():
    try:
        await trio.sleep_forever()
    finally:
        with open("cleaned-up", "w"):
            pass
"""

WITHIN = """
import time

import pytest
import trio


@pytest.mark.time_cap(5)
async def test_virtual_time_beyond_the_cap_while_waiting_on_real_work(autojump_clock):
    # An hour of the test's clock, and real waits in a thread, during which autojump
    # would jump straight to any deadline on this clock: the cap must not fire.
    for _ in range(3):
        await trio.sleep(1200)
        await trio.to_thread.run_sync(time.sleep, 0.2)
    assert trio.current_time() >= 3600


@pytest.mark.time_cap(5)
async def test_finishes_inside_a_raised_cap():
    await trio.sleep(0.6)  # real time longer than the hanging tests' cap, inside the one its marker names


@pytest.mark.time_cap(0.3)
def test_sync_tests_are_not_capped():
    time.sleep(0.5)  # longer than the cap its marker names
"""


def run(pytester, source: str):
    pytester.makeini("[pytest]\ntrio_mode = true\n")
    pytester.makepyfile(test_capped=source)
    return pytester.runpytest("-p", "tests.timecap", "-p", "no:cacheprovider", "-rA")


def test_a_hanging_async_test_is_failed_by_its_cap_and_says_where_it_waits(pytester):
    result = run(pytester, HANGING)
    result.assert_outcomes(failed=3)
    result.stdout.fnmatch_lines(
        [
            "FAILED test_capped.py::test_hangs - *TimeCapExceeded*",
            "FAILED test_capped.py::test_hangs_on_virtual_time - *TimeCapExceeded*",
            "FAILED test_capped.py::test_cleanup_runs_when_cancelled - *TimeCapExceeded*",
        ]
    )
    # The failure says why, and names the line the test's task was waiting on.
    result.stdout.fnmatch_lines(
        [
            "*TimeCapExceeded: the test ran longer than its time cap of 0.5 s (real time) and was cancelled;*",
            "*Tasks were waiting at:",
            "*<test 'test_hangs'>: *test_capped.py:7 test_hangs > trio/*sleep_forever",
        ]
    )
    # Cancelled, not abandoned: the test's finally block ran.
    assert (pytester.path / "cleaned-up").exists()


def test_virtual_time_raised_caps_and_sync_tests_do_not_trip_it(pytester):
    result = run(pytester, WITHIN)
    result.assert_outcomes(passed=3)
