"""A time cap on every async test: one that runs longer fails, and says where it waits.

The cap is ``DEFAULT_CAP_S``; a long scenario raises its own with
``@pytest.mark.time_cap(seconds)``. It covers the test function, not its fixtures
(fixtures bound their own waits, e.g. ``NODE_START_TIMEOUT_S``); ``faulthandler_timeout``
in pyproject.toml stays the last resort for a hang nothing can cancel.

The cap counts real seconds whatever clock the test runs on. A deadline on a test's
``MockClock`` would be wrong both ways: with ``autojump_clock`` the clock jumps to the
next deadline whenever every task waits (on the database, a thread, a socket), so the
cap would fire at the first real wait; and an hour of virtual time is legitimate. So a
timer thread counts the seconds and cancels the test from outside (``TrioToken``), which
leaves the test's clock and its deadlines alone.

When the cap fires, the test is cancelled (its ``finally`` blocks and ``async with``
exits run as usual) and fails with ``TimeCapExceeded``, listing where each task of the
run was waiting at that moment.
"""

from __future__ import annotations

import functools
import threading
from pathlib import Path

import pytest
import trio

import orbit_node

# Longer than any test takes on a busy 2-core machine, short enough that a hang fails
# the run in minutes rather than at the CI deadline.
DEFAULT_CAP_S = 120.0
# Tasks listed in the failure message, at most (a node serving many connections has hundreds).
MAX_TASKS_LISTED = 40

THIS_FILE = Path(__file__).resolve()
REPO = THIS_FILE.parent.parent
# Frames listed when the cap fires: the tests' and the node's, not trio's or a library's.
OWN_CODE = (REPO / "tests", REPO / "harness", Path(orbit_node.__file__).resolve().parent)


class TimeCapExceeded(Exception):
    """The test ran longer than its time cap."""


def pytest_configure(config):
    config.addinivalue_line(
        "markers", f"time_cap(seconds): cap of an async test in real seconds (default {DEFAULT_CAP_S:g})"
    )


def cap_of(item: pytest.Item) -> float:
    marker = item.get_closest_marker("time_cap")
    return DEFAULT_CAP_S if marker is None else float(marker.args[0])


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_runtest_call(item):
    # Runs before pytest-trio's own wrapper, which then runs the capped function with trio.
    # (A Hypothesis-driven async test would need its inner test wrapped; there is none.)
    if item.get_closest_marker("trio") is not None and not hasattr(item.obj, "hypothesis"):
        if not getattr(item.obj, "_time_capped", False):
            item.obj = capped(item.obj, cap_of(item))
    return (yield)


def capped(test, cap_s: float):
    @functools.wraps(test)
    async def run_capped(**kwargs):
        await run_under_cap(test, kwargs, cap_s)

    run_capped._time_capped = True
    return run_capped


async def run_under_cap(test, kwargs, cap_s: float) -> None:
    token = trio.lowlevel.current_trio_token()
    scope = trio.CancelScope()
    waiting: list[str] = []  # where the tasks waited when the cap fired
    test_dir = Path(test.__code__.co_filename).resolve().parent

    def fire() -> None:  # in the trio thread
        if not scope.cancel_called:
            waiting.extend(where_tasks_wait(also=test_dir))
            scope.cancel()

    def expire() -> None:  # in the timer thread
        try:
            token.run_sync_soon(fire)
        except trio.RunFinishedError:
            pass

    timer = threading.Timer(cap_s, expire)
    timer.daemon = True
    timer.start()
    try:
        with scope:
            await test(**kwargs)
    except BaseException as exc:
        if waiting:  # what the cancellation made the test raise on its way out
            raise TimeCapExceeded(message(cap_s, waiting)) from exc
        raise
    finally:
        timer.cancel()
    if waiting and scope.cancelled_caught:
        raise TimeCapExceeded(message(cap_s, waiting))


def message(cap_s: float, waiting: list[str]) -> str:
    return (
        f"the test ran longer than its time cap of {cap_s:g} s (real time) and was cancelled; "
        "raise the cap with @pytest.mark.time_cap(seconds) if it is a long scenario.\n"
        "Tasks were waiting at:\n" + "\n".join(waiting)
    )


def where_tasks_wait(also: Path) -> list[str]:
    """One line per task that waits in this project's code (or under ``also``, the test's
    directory): its name and its await chain there."""
    lines: list[str] = []
    own = (*OWN_CODE, also)

    def visit(task: trio.lowlevel.Task) -> None:
        frames = [(frame.f_code, lineno) for frame, lineno in task.iter_await_frames()]
        mine = [i for i, (code, _) in enumerate(frames) if is_own(code.co_filename, own)]
        if mine:
            # The project's frames, then the library call the innermost of them waits in.
            shown = [frame_text(*frames[i]) for i in mine]
            if mine[-1] + 1 < len(frames):
                shown.append(frame_text(*frames[mine[-1] + 1]))
            lines.append(f"  {task.name}: {' > '.join(shown)}")
        for nursery in task.child_nurseries:
            for child in sorted(nursery.child_tasks, key=lambda t: t.name):
                visit(child)

    root = trio.lowlevel.current_root_task()
    if root is not None:
        visit(root)
    if len(lines) > MAX_TASKS_LISTED:
        lines[MAX_TASKS_LISTED:] = [f"  ... and {len(lines) - MAX_TASKS_LISTED} more tasks"]
    return lines


def is_own(filename: str, own) -> bool:
    path = Path(filename)
    return path != THIS_FILE and any(path.is_relative_to(directory) for directory in own)


def frame_text(code, lineno: int) -> str:
    """``path:line function``; the path relative to the repository or to site-packages."""
    path = Path(code.co_filename)
    if path.is_relative_to(REPO) and ".venv" not in path.parts:
        path = path.relative_to(REPO)
    elif "site-packages" in path.parts:
        path = Path(*path.parts[path.parts.index("site-packages") + 1 :])
    return f"{path}:{lineno} {code.co_name}"
