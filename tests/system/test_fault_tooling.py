"""The fault tools themselves: the proxy's faults reach a real MariaDB session as intended."""

from __future__ import annotations

import pytest
import trio

from harness.clock import LaterDatabase
from harness.proxy import Direction, open_fault_proxy
from orbit_node.db import Database
from orbit_node.db.driver import is_dropped
from orbit_node.domain.errors import Unavailable

from ..helpers import running_statements, wait_until


async def thread_id(tx) -> int:
    return tx.thread_id


async def now(db: Database):
    return (await db.run(lambda tx: tx.fetchall_raw("SELECT NOW(6) AS now")))[0]["now"]


async def test_proxy_latency_stall_blackhole_reset_and_half_close(dsn, db):
    async with open_fault_proxy(dsn.host, dsn.port) as proxy:
        direct, db = db, Database(proxy.dsn_for(dsn), size=1)
        try:
            with trio.fail_after(10):
                await now(db)
                assert proxy.open_links == 1
                # Latency: a round trip takes at least the added delay (both directions).
                proxy.latency_s = 0.05
                started = trio.current_time()
                await now(db)
                assert trio.current_time() - started >= 0.1
                proxy.heal()
                # Stall: the statement waits for as long as the stall lasts, then completes.
                proxy.stall()
                with trio.move_on_after(0.3) as stalled:
                    await now(db)
                assert stalled.cancelled_caught  # (the cancelled use closed that connection)
                async with trio.open_nursery() as nursery:
                    done = trio.Event()

                    async def query():
                        await now(db)
                        done.set()

                    held_before = proxy.holding  # (the cancelled statement's bytes are still held)
                    nursery.start_soon(query)
                    await wait_until(lambda: proxy.holding > held_before)  # the new connection is held
                    assert not done.is_set()
                    proxy.heal()
                    await done.wait()
                # Black hole: the bytes are gone; healing does not bring the answer back.
                proxy.blackhole(Direction.DOWN)
                with trio.move_on_after(0.3) as lost:
                    await now(db)
                assert lost.cancelled_caught
                proxy.heal()
                await now(db)  # a new connection works
                # Reset: the session breaks at once.
                async with trio.open_nursery() as nursery:

                    async def sleeper():
                        with pytest.raises(Unavailable):
                            await db.run(lambda tx: tx.execute_raw("DO SLEEP(5)"))

                    nursery.start_soon(sleeper)
                    await wait_until(lambda: running_statements(direct, "DO SLEEP(5)"))
                    assert proxy.reset() == 1
                # Half-close towards the server: it sees the client leave and ends the session;
                # its FIN reaches the idle pooled connection, which the pool drops before reuse.
                first = await db.run(thread_id)
                await proxy.half_close(Direction.UP)
                await wait_until(lambda: is_dropped(db._idle[-1]))
                assert await db.run(thread_id) != first
                # Refusing new connections looks like a server that is down.
                proxy.refuse_new = True
                proxy.reset()
                for _ in range(2):  # the dead idle connection, then a refused new one
                    with pytest.raises(Unavailable):
                        await now(db)
                assert db.statistics().open == 0
        finally:
            await db.aclose()


async def test_a_later_database_session_sees_a_later_now(dsn, db):
    later = LaterDatabase(dsn, size=1, ahead_s=3600)
    try:
        ahead = (await now(later)) - (await now(db))
        assert 3599 <= ahead.total_seconds() <= 3601
    finally:
        await later.aclose()
