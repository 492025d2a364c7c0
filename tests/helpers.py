"""Small helpers shared by tests (running CLI commands, waiting for a condition)."""

from __future__ import annotations

import inspect
import os
import subprocess
import sys
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import trio

from orbit_node.domain.dsn import Dsn

REPO = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent


def cli(command: str, *args: str, dsn: Dsn | None = None, env: dict | None = None, check: bool = False):
    """Run an installed console script (orbit, orbit-migrate, orbit-admin)."""
    full_env = {k: v for k, v in os.environ.items() if not k.startswith("ORBIT_")}
    if dsn is not None:
        full_env["ORBIT_MYSQL_DSN"] = dsn.url()
    full_env.update(env or {})
    return subprocess.run(
        [str(BIN / command), *args], capture_output=True, text=True, env=full_env, check=check, timeout=60
    )


def bootstrap_args(output: Path | str, *, application: str = "dev") -> list[str]:
    """``orbit-admin bootstrap`` as ``make run`` calls it (namespace ``default``, queue
    ``initial``, Worker access), writing the credentials file ``output``."""
    return [
        "bootstrap",
        "--application",
        application,
        "--namespace",
        "default",
        "--environment",
        "test",
        "--queue",
        "initial",
        "--worker-access",
        "--output",
        str(output),
    ]


async def bootstrap(dsn: Dsn, output: Path, *, application: str = "dev", env: dict | None = None) -> Path:
    """Write the credentials file of a development application (``bootstrap_args``); returns ``output``."""
    result = await trio.to_thread.run_sync(
        lambda: cli("orbit-admin", *bootstrap_args(output, application=application), dsn=dsn, env=env)
    )
    assert result.returncode == 0, result.stderr
    return output


# How often wait_until asks again: often enough that a wait ends soon after its condition
# holds, rarely enough that polling the database costs nothing worth measuring.
POLL_S = 0.02


async def wait_until(
    predicate: Callable[[], Any | Awaitable[Any]], *, timeout_s: float = 10, poll_s: float = POLL_S
) -> Any:
    """Ask ``predicate`` (a function or an async function) until its answer is truthy; returns it.

    For conditions no event announces: what another process or the database does, or a
    counter of the node under test. Fails with ``trio.TooSlowError`` after ``timeout_s``
    (of the trio clock: meant for tests on the real clock), with the last answer.
    """
    answer = None
    try:
        with trio.fail_after(timeout_s):
            while True:
                answer = predicate()
                if inspect.isawaitable(answer):
                    answer = await answer
                if answer:
                    return answer
                await trio.sleep(poll_s)
    except trio.TooSlowError:
        name = getattr(predicate, "__qualname__", repr(predicate))
        raise trio.TooSlowError(f"{name} did not hold within {timeout_s} s (last answer: {answer!r})") from None


async def running_statements(db, text: str) -> int:
    """Sessions of other connections to ``db``'s database running the statement ``text`` now."""
    found = await db.run(
        lambda tx: tx.fetchall_raw(
            "SELECT COUNT(*) AS n FROM information_schema.PROCESSLIST "
            "WHERE DB = DATABASE() AND ID <> CONNECTION_ID() AND INFO = %s",
            (text,),
        )
    )
    return found[0]["n"]


@asynccontextmanager
async def application_rows_locked(dsn: Dsn, application_ids: Sequence[str]) -> AsyncIterator[None]:
    """Hold ``SELECT ... FOR UPDATE`` on these applications' rows (another session's
    transaction) for the block: a claim of an application with a quota waits on its row,
    so the block sees that claim in flight. Released (rolled back) on exit."""
    from orbit_node.db import Database

    blocker = Database(dsn, size=1)
    locked, done = trio.Event(), trio.Event()

    async def hold(tx: Any) -> None:
        for application_id in application_ids:
            await tx.execute_raw("SELECT * FROM applications WHERE application_id = %s FOR UPDATE", (application_id,))
        locked.set()
        await done.wait()

    try:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(blocker.transaction, hold)
            await locked.wait()
            try:
                yield
            finally:
                done.set()
    finally:
        await blocker.aclose()
