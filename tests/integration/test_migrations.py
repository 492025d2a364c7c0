"""Forward-only migrations on a real database, including the P3 upgrade path."""

from __future__ import annotations

import pytest

from orbit_node.db import Database, migrate
from orbit_node.domain.errors import DatabaseError, SchemaMismatch


async def schema_dump(db: Database) -> list[tuple]:
    rows = await db.run(
        lambda tx: tx.fetchall_raw(
            "SELECT table_name AS t, column_name AS c, column_type AS ty FROM information_schema.columns"
            " WHERE table_schema = DATABASE() ORDER BY table_name, ordinal_position"
        )
    )
    return [(r["t"], r["c"], r["ty"]) for r in rows]


async def test_up_from_empty_then_status_then_up_again_changes_nothing(empty_dsn):
    db = Database(empty_dsn, size=1)
    try:
        assert await migrate.current_version(db) == 0
        applied = await migrate.up(db)
        assert [m.version for m in applied] == list(range(1, migrate.HEAD + 1))
        assert migrate.HEAD == 28
        status = await migrate.status(db)
        assert [(s.version, s.state) for s in status] == [(v, "applied") for v in range(1, migrate.HEAD + 1)]
        before = await schema_dump(db)
        assert await migrate.up(db) == []
        assert await schema_dump(db) == before
        assert await migrate.current_version(db) == migrate.HEAD
    finally:
        await db.aclose()


async def test_refuses_database_with_newer_unknown_version(dsn):
    db = Database(dsn, size=1)
    try:
        await db.run(
            lambda tx: tx.execute_raw(
                "INSERT INTO orbit_schema_migrations (version, name, checksum) VALUES (%s, 'future', REPEAT('0', 64))",
                (migrate.HEAD + 1,),
            )
        )
        with pytest.raises(SchemaMismatch, match="newer"):
            await migrate.up(db)
        assert [s.state for s in await migrate.status(db)][-1] == "unknown"
    finally:
        await db.aclose()


async def test_refuses_when_an_applied_file_changed(dsn):
    db = Database(dsn, size=1)
    try:
        await db.run(
            lambda tx: tx.execute_raw("UPDATE orbit_schema_migrations SET checksum = REPEAT('1', 64) WHERE version = 3")
        )
        with pytest.raises(SchemaMismatch, match="changed"):
            await migrate.up(db)
    finally:
        await db.aclose()


INSERT_OLD_TASK = (
    "INSERT INTO tasks (task_id, application_id, namespace_id, queue_id, handler, handler_version,"
    " payload_version, payload, state, available_at, attempts)"
    " VALUES (%s, 'a', 'n', 'q', 'h', 'v1', 'v1', %s, %s, %s, %s)"
)


async def test_p3_upgrade_path_keeps_every_task_and_orders_them_by_available_at(empty_dsn):
    db = Database(empty_dsn, size=1)
    try:
        await migrate.up(db, target=11)
        assert await migrate.current_version(db) == 11
        big = '{"n": 123456789012345678901234567890}'
        tasks = [
            (f"{i:032x}", big, state, f"2026-01-01 00:00:{i:02d}.123456", i % 3)
            for i, state in enumerate(["queued", "running", "succeeded", "failed", "queued", "reserved"])
        ]

        async def seed(tx):
            for row in tasks:
                await tx.execute_raw(INSERT_OLD_TASK, row)
                await tx.execute_raw(
                    "INSERT INTO task_attempts (task_id, attempt, fencing_token, reserved_at, outcome)"
                    " VALUES (%s, 1, %s, %s, 'succeeded')",
                    (row[0], "1-" + row[0][:16], row[3]),
                )

        await db.transaction(seed)
        await migrate.up(db)
        rows = await db.run(
            lambda tx: tx.fetchall_raw(
                "SELECT task_id, payload, state, attempts, priority, available_at, dispatch_at FROM tasks ORDER BY task_id"
            )
        )
        assert len(rows) == len(tasks)
        for row, original in zip(rows, tasks, strict=True):
            assert row["task_id"] == original[0]
            assert row["payload"] == big
            assert row["state"] == original[2]
            assert row["attempts"] == original[4]
            assert row["priority"] == 0
            assert row["dispatch_at"] == row["available_at"]
        attempts = await db.run(lambda tx: tx.fetchall_raw("SELECT COUNT(*) AS n FROM task_attempts"))
        assert attempts[0]["n"] == len(tasks)
        for bad in (10, -1):
            with pytest.raises(DatabaseError) as info:
                await db.run(
                    lambda tx: tx.execute_raw("UPDATE tasks SET priority = %s WHERE task_id = %s", (bad, tasks[0][0]))  # noqa: B023 - awaited within the iteration
                )
            assert info.value.errno in (4025, 3819)  # MariaDB / MySQL CHECK constraint violation
        await db.run(lambda tx: tx.execute_raw("UPDATE tasks SET priority = 9 WHERE task_id = %s", (tasks[0][0],)))
        row = (
            await db.run(
                lambda tx: tx.fetchall_raw(
                    "SELECT TIMESTAMPDIFF(SECOND, dispatch_at, available_at) AS lead_s FROM tasks WHERE task_id = %s",
                    (tasks[0][0],),
                )
            )
        )[0]
        assert row["lead_s"] == 270
    finally:
        await db.aclose()


async def test_existing_applications_get_weight_1_and_the_database_refuses_a_weight_out_of_range(empty_dsn):
    db = Database(empty_dsn, size=1)
    try:
        await migrate.up(db, target=16)
        await db.run(lambda tx: tx.execute_raw("INSERT INTO applications (application_id, name) VALUES ('a', 'old')"))
        await migrate.up(db)
        read = "SELECT fairness_weight AS w FROM applications WHERE application_id = 'a'"
        assert (await db.run(lambda tx: tx.fetchall_raw(read)))[0]["w"] == 1
        for bad in (0, 101):
            with pytest.raises(DatabaseError) as info:
                await db.run(
                    lambda tx: tx.execute_raw("UPDATE applications SET fairness_weight = %s", (bad,))  # noqa: B023 - awaited within the iteration
                )
            assert info.value.errno in (4025, 3819)  # MariaDB / MySQL CHECK constraint violation
        await db.run(lambda tx: tx.execute_raw("UPDATE applications SET fairness_weight = 100"))
        assert (await db.run(lambda tx: tx.fetchall_raw(read)))[0]["w"] == 100
    finally:
        await db.aclose()


async def test_dispatch_columns_are_documented_in_the_schema(dsn):
    db = Database(dsn, size=1)
    try:
        rows = await db.run(
            lambda tx: tx.fetchall_raw(
                "SELECT column_name AS c, column_comment AS comment, extra, column_default AS d, is_nullable AS n"
                " FROM information_schema.columns WHERE table_schema = DATABASE() AND table_name = 'tasks'"
                " AND column_name IN ('priority', 'dispatch_at')"
            )
        )
        by_name = {r["c"]: r for r in rows}
        assert "STORED GENERATED" in by_name["dispatch_at"]["extra"].upper()
        assert "grants no execution right" in by_name["dispatch_at"]["comment"]
        assert by_name["priority"]["n"] == "NO" and by_name["priority"]["d"] == "0"
        fks = await db.run(
            lambda tx: tx.fetchall_raw(
                "SELECT COUNT(*) AS n FROM information_schema.referential_constraints WHERE constraint_schema = DATABASE()"
            )
        )
        assert fks[0]["n"] == 0
    finally:
        await db.aclose()


async def test_the_marked_migrations_are_the_expand_only_ones():
    """The mark is read from the file's first line; 000024 carries it, 000023 (which
    drops an index older nodes name) does not."""
    marked = {m.version for m in migrate.MIGRATIONS if m.compatible}
    assert 24 in marked and 23 not in marked and 21 not in marked


@pytest.mark.parametrize("compatible", [True, False])
async def test_a_node_serves_a_newer_schema_only_when_every_unknown_version_is_compatible(node_config, dsn, compatible):
    from ..nodeutil import run_node

    db = Database(dsn, size=1)
    try:
        await db.run(
            lambda tx: tx.execute_raw(
                "INSERT INTO orbit_schema_migrations (version, name, checksum, compatible)"
                " VALUES (%s, 'future', REPEAT('0', 64), %s)",
                (migrate.HEAD + 1, int(compatible)),
            )
        )
        async with run_node(node_config) as node, node.client(None) as http:
            ready = await http.get("/readyz")
        if compatible:
            assert ready.status_code == 200 and ready.json()["data"]["schema_version"] == migrate.HEAD + 1
        else:
            assert ready.status_code == 503 and ready.json()["error"]["cause"] == "schema_ahead"
    finally:
        await db.aclose()


async def test_up_refuses_a_contracting_step_while_an_older_node_is_live(empty_dsn):
    db = Database(empty_dsn, size=1)
    try:
        await migrate.up(db, target=22)

        async def node(tx, node_id: str, stopped: bool) -> None:
            await tx.execute_raw(
                "INSERT INTO nodes (node_id, hostname, http_addr, version, stopped_at)"
                " VALUES (%s, 'old-host', '10.0.0.1:8080', '0.1', IF(%s, NOW(6), NULL))",
                (node_id, stopped),
            )

        await db.run(lambda tx: node(tx, "a" * 32, False))
        await db.run(lambda tx: node(tx, "b" * 32, True))
        # 000023 drops an index the older node reads: refused, naming the live node only.
        with pytest.raises(SchemaMismatch, match="000023") as refused:
            await migrate.up(db)
        assert "a" * 32 in refused.value.message and "b" * 32 not in refused.value.message
        assert await migrate.current_version(db) == 22
        # Once it has stopped (or been upgraded), the step goes on; a compatible step
        # never waits for anyone.
        await db.run(lambda tx: tx.execute_raw("UPDATE nodes SET stopped_at = NOW(6) WHERE node_id = %s", ("a" * 32,)))
        assert [m.version for m in await migrate.up(db)] == [23, 24, 25, 26, 27, 28]
        await db.run(lambda tx: node(tx, "c" * 32, False))
        rows = await db.run(lambda tx: tx.fetchall_raw("SELECT version, compatible FROM orbit_schema_migrations"))
        assert {r["version"]: r["compatible"] for r in rows}[24] == 1
    finally:
        await db.aclose()
