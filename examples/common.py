"""What the examples share: a Worker served for the length of a block, a unique name per
run, and the way a scenario ends (its lines on stdout and status 0, or one error line on
stderr and status 1).

Each example is ``examples/<name>/main.py``, run from the repository root against a
node (``make run``) with ``ORBIT_CREDENTIALS_FILE`` naming the credentials file it
wrote (``ORBIT_URL`` overrides the file's url). Each creates its own queue and handler
names, so runs never see each other's tasks; history is kept.
"""

from __future__ import annotations

import secrets
import sys
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager

import trio

from orbit_sdk import Worker

# Bound on draining the Worker when a scenario ends (well or not).
CLEANUP_S = 3


class ScenarioFailed(Exception):
    """The scenario saw something other than what it demonstrates."""


def run_id() -> str:
    """A short random suffix that makes this run's queue and handler names its own."""
    return secrets.token_hex(4)


@asynccontextmanager
async def serving(worker: Worker) -> AsyncIterator[Worker]:
    """Run ``worker`` (once the node welcomed it) for the block, then drain it (bounded)."""
    async with trio.open_nursery() as nursery:
        await nursery.start(worker.run)
        try:
            yield worker
        finally:
            with trio.CancelScope(shield=True), trio.move_on_after(CLEANUP_S):
                await worker.drain()
            nursery.cancel_scope.cancel()


def main(scenario: Callable[[], Awaitable[tuple[list[str], bool]]], *, limit_s: float) -> int:
    """Run ``scenario`` within ``limit_s``; it returns its lines and whether they are the
    expected outcome. Prints the lines and returns 0 (or 1 when not as expected); on an
    error prints one line on stderr, never a traceback, and returns 1."""

    async def bounded() -> tuple[list[str], bool]:
        with trio.fail_after(limit_s):
            return await scenario()

    try:
        lines, as_expected = trio.run(bounded)
    except trio.TooSlowError:
        print(f"error: the scenario did not finish within {limit_s} s", file=sys.stderr)
        return 1
    except Exception as exc:
        while isinstance(exc, ExceptionGroup) and len(exc.exceptions) == 1:
            exc = exc.exceptions[0]  # what a nursery wrapped
        print(f"error: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 1
    for line in lines:
        print(line)
    return 0 if as_expected else 1
