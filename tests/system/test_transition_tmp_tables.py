"""Transitions write with statements that need no internal temporary table.

A multi-table UPDATE makes the server build an internal temporary table of the rows to
change (with TEXT values, an Aria table on disk in ``tmpdir``), and MariaDB 10.11.19 has
crashed when creating one failed (docs/operations.md). Start, renew, Finish, release and
the recovery sweep write with single-table UPDATEs by primary key instead: none creates a
temporary table, Finish works on a server that cannot create a file in its ``tmpdir``, and
each reads only its own rows, by its index.
"""

from __future__ import annotations

import shutil
from datetime import datetime

from orbit_node.db import QUERIES, Database, migrate
from orbit_node.db.driver import DriverConnection
from orbit_node.db.tx import per_row_statement
from orbit_node.domain.ownership import FinishItem, Outcome

from ..seed import TaskSpec, attempt_rows, claim_request, expire_lease, insert_tasks, lease_store, task_row, tenant


async def tmp_tables(db: Database) -> tuple[int, int]:
    """(connection id, internal temporary tables it created so far)."""

    async def read(tx):
        (conn,) = await tx.fetchall_raw("SELECT CONNECTION_ID() AS id")
        rows = await tx.fetchall_raw("SHOW SESSION STATUS LIKE 'Created_tmp_tables'")
        return conn["id"], int(rows[0]["Value"])

    return await db.run(read)


async def created_by(db: Database, step) -> int:
    """Internal temporary tables created by ``step`` on the one connection of ``db``."""
    before_conn, before = await tmp_tables(db)
    await step
    after_conn, after = await tmp_tables(db)
    assert after_conn == before_conn, "the pool changed connections: the counters are per connection"
    return after - before


async def test_start_renew_finish_release_and_recovery_create_no_temporary_table(dsn):
    db = Database(dsn, size=1)  # every statement on one connection, whose counters we read
    try:
        store = lease_store(db)
        owner = await tenant(db)
        await insert_tasks(db, owner, [TaskSpec(available_in_s=-1, max_attempts=2) for _ in range(8)])
        got = await store.claim(claim_request(owner, limit=8))
        assert len(got) == 8
        pairs = [(r.task_id, r.fencing_token) for r in got]
        assert await created_by(db, store.release_many(pairs[6:])) == 0
        assert await created_by(db, store.start_many(pairs[:6])) == 0
        assert await created_by(db, store.renew_many(pairs[:6])) == 0
        # Text that looks like the statement's own placeholders is stored as it is.
        tricky = '{"n": "%s %(row_0)s {state} WHEN \'x\' THEN"}'
        finishes = [
            FinishItem(pairs[0][0], pairs[0][1], result_json=tricky),
            FinishItem(pairs[1][0], pairs[1][1], result_json='{"n": 1}'),
            FinishItem(pairs[2][0], pairs[2][1], error={"code": "E"}, retryable=True),
            FinishItem(pairs[3][0], pairs[3][1], error={"code": "E"}, retryable=False),
        ]
        assert await created_by(db, store.finish_many(finishes)) == 0
        for task_id, _ in pairs[4:6]:
            await expire_lease(db, task_id)
        assert await created_by(db, store.recover()) == 0
        assert (await task_row(db, pairs[0][0]))["result"] == tricky
        states = [(await task_row(db, task_id))["state"] for task_id, _ in pairs]
        assert states == ["succeeded", "succeeded", "queued", "failed", "queued", "queued", "queued", "queued"]
    finally:
        await db.aclose()


async def test_start_and_finish_work_when_the_server_cannot_create_a_temporary_file(private_mariadb):
    db = Database(private_mariadb.dsn(), size=2)
    try:
        await migrate.up(db)
        store = lease_store(db)
        owner = await tenant(db)
        await insert_tasks(db, owner, [TaskSpec(available_in_s=-1, max_attempts=2) for _ in range(3)])
        got = await store.claim(claim_request(owner, limit=3))
        assert len(got) == 3
        # From now on every on-disk temporary table or file of the server fails to be created.
        shutil.rmtree(private_mariadb.tmpdir)

        started = await store.start_many([(r.task_id, r.fencing_token) for r in got])
        assert [s.outcome for s in started] == [Outcome.STARTED] * 3
        ok, retry, failed = got
        results = await store.finish_many(
            [
                FinishItem(ok.task_id, ok.fencing_token, result_json='{"text": "d\u00e9j\u00e0 \U0001f600"}'),
                FinishItem(retry.task_id, retry.fencing_token, error={"code": "BUSY"}, retryable=True),
                FinishItem(failed.task_id, failed.fencing_token, error={"code": "BAD"}, retryable=False),
            ]
        )
        assert [r.outcome for r in results] == [Outcome.SUCCEEDED, Outcome.RETRY, Outcome.FAILED]
        row = await task_row(db, ok.task_id)
        assert (row["state"], row["result"]) == ("succeeded", '{"text": "d\u00e9j\u00e0 \U0001f600"}')
        assert (await task_row(db, retry.task_id))["state"] == "queued"
        assert (await task_row(db, failed.task_id))["state"] == "failed"
        outcomes = [(await attempt_rows(db, r.task_id))[0]["outcome"] for r in got]
        assert outcomes == ["succeeded", "retry", "failed"]
    finally:
        await db.aclose()


async def test_transition_writes_read_only_their_rows_by_their_index(db):
    """With an IN list covering most of a small table the optimizer would scan all of it
    (and under load, every row of task_attempts, which only grows); each write names its index."""
    store = lease_store(db)
    owner = await tenant(db)
    await insert_tasks(db, owner, [TaskSpec(available_in_s=-1) for _ in range(16)])
    got = await store.claim(claim_request(owner, limit=16))
    assert len(got) == 16
    task_ids = tuple(r.task_id for r in got)
    named = tuple(f"{r.task_id} {r.fencing_token}" for r in got)
    now = datetime(2030, 1, 1)
    one_each = {r.task_id: {"state": "succeeded", "result": f'{{"n": {i}}}'} for i, r in enumerate(got)}
    offline = DriverConnection(host="unused")  # literals of the server's default mode
    offline.server_status = 0
    literal = offline.literal
    statements = {
        "start_tasks": (QUERIES["start_tasks"], {"task_ids": task_ids, "now": now, "lease_expires_at": now}),
        "start_attempts": (QUERIES["start_attempts"], {"task_ids": task_ids, "now": now, "attempts": named}),
        "settle_terminal": per_row_statement(QUERIES["settle_terminal"], one_each, {}, literal),
        "settle_requeue": per_row_statement(
            QUERIES["settle_requeue"], {t: {"available_at": now} for t in task_ids}, {}, literal
        ),
        "settle_attempts": per_row_statement(
            QUERIES["settle_attempts"], {t: {"outcome": "succeeded"} for t in task_ids}, {"attempts": named}, literal
        ),
    }
    plans = {}
    for name, (sql, params) in statements.items():
        (plan,) = await db.run(lambda tx, sql=sql, params=params: tx.fetchall_raw("EXPLAIN " + sql, params))
        plans[name] = (plan["type"], plan["key"])
    assert plans == {
        "start_tasks": ("range", "PRIMARY"),
        "start_attempts": ("range", "uq_attempts_token"),
        "settle_terminal": ("range", "PRIMARY"),
        "settle_requeue": ("range", "PRIMARY"),
        "settle_attempts": ("range", "uq_attempts_token"),
    }
