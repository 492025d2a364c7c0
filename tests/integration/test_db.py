"""The database layer: replay of conflicts, error translation, the UTC database clock."""

from __future__ import annotations

import os
import resource
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import datetime
from unittest import mock

import pytest
import trio
import trio_mysql.connections
from hypothesis import example, given
from hypothesis import strategies as st
from trio_mysql.constants import SERVER_STATUS

from orbit_node.db import QUERIES, Database
from orbit_node.db.driver import DriverConnection, is_dropped
from orbit_node.db.queries import parse_blocks
from orbit_node.db.tx import MULTI_ROW_INSERT, Tx, per_row_statement, positional
from orbit_node.domain.dsn import Dsn
from orbit_node.domain.errors import DatabaseError, Unavailable

from ..helpers import running_statements, wait_until


async def test_deadlock_is_replayed_and_invisible_to_the_caller(db):
    await db.run(lambda tx: tx.execute_raw("CREATE TABLE t (id INT PRIMARY KEY, v INT) ENGINE=InnoDB"))
    await db.run(lambda tx: tx.execute_raw("INSERT INTO t VALUES (1, 0), (2, 0)"))
    first_locked = [trio.Event(), trio.Event()]
    runs = [0, 0]

    def body(me: int, first: int, second: int):
        async def run(tx):
            runs[me] += 1
            await tx.execute_raw("UPDATE t SET v = v + 1 WHERE id = %s", (first,))
            if runs[me] == 1:
                first_locked[me].set()
                await first_locked[1 - me].wait()
            await tx.execute_raw("UPDATE t SET v = v + 1 WHERE id = %s", (second,))
            return runs[me]

        return run

    async with trio.open_nursery() as nursery:
        nursery.start_soon(db.transaction, body(0, 1, 2))
        nursery.start_soon(db.transaction, body(1, 2, 1))
    rows = await db.run(lambda tx: tx.fetchall_raw("SELECT id, v FROM t ORDER BY id"))
    # Both transactions committed exactly once despite the deadlock between them.
    assert [(r["id"], r["v"]) for r in rows] == [(1, 2), (2, 2)]
    assert sum(runs) == 3
    assert db.replays == 1


async def test_statement_errors_are_translated_and_roll_back(db):
    await db.run(lambda tx: tx.execute_raw("CREATE TABLE t (id INT PRIMARY KEY) ENGINE=InnoDB"))

    async def body(tx):
        await tx.execute_raw("INSERT INTO t VALUES (1)")
        await tx.execute_raw("INSERT INTO t VALUES (1)")

    with pytest.raises(DatabaseError) as info:
        await db.transaction(body)
    assert info.value.errno == 1062
    rows = await db.run(lambda tx: tx.fetchall_raw("SELECT COUNT(*) AS n FROM t"))
    assert rows[0]["n"] == 0


async def test_fetchrow_without_a_row_is_a_database_error_naming_the_statement(db):
    params = {"namespace_id": "0" * 32, "task_id": "0" * 32}
    assert await db.run(lambda tx: tx.fetchrow("ping")) == {"ok": 1}
    with pytest.raises(DatabaseError, match="task_get returned no row") as info:
        await db.run(lambda tx: tx.fetchrow("task_get", params))
    assert info.value.errno is None


async def test_unreachable_server_is_unavailable():
    dead = Database(Dsn.parse("mysql://root@127.0.0.1:1/x"), size=1, connect_timeout_s=1)
    with pytest.raises(Unavailable):
        await dead.ping()


async def test_sessions_run_in_utc(db):
    rows = await db.run(
        lambda tx: tx.fetchall_raw("SELECT @@session.time_zone AS tz, NOW(6) = UTC_TIMESTAMP(6) AS utc")
    )
    assert rows[0]["tz"] == "+00:00"
    assert rows[0]["utc"] == 1


async def test_transactions_read_committed_by_default_repeatable_read_when_asked(dsn):
    """The session default is READ COMMITTED (no per-transaction statement for it); a
    REPEATABLE READ transaction does not change what the next one on the connection gets."""
    one = Database(dsn, size=1)
    other = Database(dsn, size=1)
    try:
        await one.run(lambda tx: tx.execute_raw("CREATE TABLE t (id INT PRIMARY KEY, v INT) ENGINE=InnoDB"))
        await one.run(lambda tx: tx.execute_raw("INSERT INTO t VALUES (1, 0)"))

        def reads_twice(tx_values):
            async def body(tx):
                tx_values.append((await tx.fetchall_raw("SELECT v FROM t"))[0]["v"])
                await other.run(lambda o: o.execute_raw("UPDATE t SET v = v + 1"))
                tx_values.append((await tx.fetchall_raw("SELECT v FROM t"))[0]["v"])

            return body

        for isolation, fresh in (("REPEATABLE READ", False), ("READ COMMITTED", True), (None, True)):
            seen: list[int] = []
            if isolation is None:
                await one.transaction(reads_twice(seen))
            else:
                await one.transaction(reads_twice(seen), isolation=isolation)
            assert (seen[1] == seen[0] + 1) is fresh, (isolation, seen)
        assert one.statistics().open == 1  # the same connection throughout
    finally:
        await one.aclose()
        await other.aclose()


async def test_a_transaction_opens_with_its_first_statement_and_costs_one_round_trip_more(dsn):
    """START TRANSACTION (and another isolation level) travel in front of the body's first
    statement: two statements and the commit are three round trips; what the body wrote
    before a failing statement is rolled back, and a body that runs nothing sends nothing."""
    db = Database(dsn, size=1)
    try:
        await opens_with_first_statement(db)
    finally:
        await db.aclose()


async def opens_with_first_statement(db):
    await db.run(lambda tx: tx.execute_raw("CREATE TABLE t (id INT PRIMARY KEY, v INT) ENGINE=InnoDB"))
    counts = {}

    async def two_statements(tx):
        counts["before"] = tx.commands
        await tx.execute_raw("INSERT INTO t VALUES (1, 1)")
        rows = await tx.fetchall_raw("SELECT v FROM t")
        counts["after"] = tx.commands
        return rows

    async def commands(tx):
        return tx.commands

    for isolation in ("READ COMMITTED", "REPEATABLE READ"):
        await db.run(lambda tx: tx.execute_raw("DELETE FROM t"))
        start = await db.run(commands)
        assert await db.transaction(two_statements, isolation=isolation) == [{"v": 1}]
        # The body's two statements, the first carrying the opening; then the commit.
        assert counts["after"] - counts["before"] == 2, isolation
        assert await db.run(commands) - start == 3, isolation

    async def fails_second(tx):
        await tx.execute_raw("INSERT INTO t VALUES (2, 2)")
        await tx.execute_raw("INSERT INTO t VALUES (1, 1)")  # duplicate key

    with pytest.raises(DatabaseError):
        await db.transaction(fails_second)
    assert await db.run(lambda tx: tx.fetchall_raw("SELECT id FROM t ORDER BY id")) == [{"id": 1}]

    async def nothing(tx):
        counts["idle"] = tx.commands
        return "done"

    before = await db.run(commands)
    assert await db.transaction(nothing) == "done"
    # No opening, no commit: only the reads of the figure itself went out.
    assert await db.run(commands) == before


async def test_deferred_writes_go_with_the_commit_and_fail_the_transaction_as_their_own(dsn):
    """A read and two deferred writes are two round trips (the opening with the read, the
    writes with the commit); a deferred write that fails rolls everything back and raises;
    an autocommit body's deferred write runs before the connection goes back."""
    db = Database(dsn, size=1)
    try:
        await db.run(lambda tx: tx.execute_raw("CREATE TABLE t (id INT PRIMARY KEY, v INT) ENGINE=InnoDB"))
        await db.run(lambda tx: tx.execute_raw("INSERT INTO t VALUES (1, 0)"))
        QUERIES["test_bump"] = "UPDATE t SET v = v + %(by)s WHERE id = 1"
        QUERIES["test_insert"] = "INSERT INTO t VALUES (%(id)s, 0)"

        async def commands(tx):
            return tx.commands

        async def read_then_write(tx):
            rows = await tx.fetchall_raw("SELECT v FROM t WHERE id = 1")
            tx.defer("test_bump", {"by": 1})
            tx.defer("test_bump", {"by": 10})
            return rows

        start = await db.run(commands)
        assert await db.transaction(read_then_write) == [{"v": 0}]
        assert await db.run(commands) - start == 2
        assert await db.run(lambda tx: tx.fetchall_raw("SELECT v FROM t WHERE id = 1")) == [{"v": 11}]

        async def fails_late(tx):
            tx.defer("test_bump", {"by": 100})
            tx.defer("test_insert", {"id": 1})  # duplicate key, found at the commit

        with pytest.raises(DatabaseError):
            await db.transaction(fails_late)
        assert await db.run(lambda tx: tx.fetchall_raw("SELECT v FROM t WHERE id = 1")) == [{"v": 11}]

        async def autocommit_write(tx):
            tx.defer("test_insert", {"id": 2})

        await db.run(autocommit_write)
        assert await db.run(lambda tx: tx.fetchall_raw("SELECT id FROM t ORDER BY id")) == [{"id": 1}, {"id": 2}]
    finally:
        QUERIES.pop("test_bump", None)
        QUERIES.pop("test_insert", None)
        await db.aclose()


async def test_independent_reads_share_a_round_trip_and_deferred_counts_are_checked(dsn):
    """``fetchall_each`` returns each read's rows from one packet (the opening in front);
    a deferred write that changes other than the rows it names raises DatabaseError once
    the packet is read, and the connection goes on working."""
    db = Database(dsn, size=1)
    try:
        await db.run(lambda tx: tx.execute_raw("CREATE TABLE t (id INT PRIMARY KEY, v INT) ENGINE=InnoDB"))
        await db.run(lambda tx: tx.execute_raw("INSERT INTO t VALUES (1, 10), (2, 20), (3, 30)"))
        QUERIES["test_read"] = "SELECT id, v FROM t WHERE id IN %(ids)s ORDER BY id"
        QUERIES["test_bump"] = "UPDATE t SET v = v + 1 WHERE id IN %(ids)s"
        counts = {}

        async def reads(tx):
            counts["before"] = tx.commands
            found = await tx.fetchall_each(
                tx.statement("test_read", {"ids": (1, 2)}),
                tx.statement("test_read", {"ids": (9,)}),
                tx.statement("test_read", {"ids": (3,)}),
            )
            counts["after"] = tx.commands
            return found

        assert await db.transaction(reads) == [[{"id": 1, "v": 10}, {"id": 2, "v": 20}], [], [{"id": 3, "v": 30}]]
        assert counts["after"] - counts["before"] == 1
        assert await db.transaction(lambda tx: tx.fetchall_each()) == []

        async def expects(rows):
            async def body(tx):
                await tx.fetchall_each(tx.statement("test_read", {"ids": (1,)}))
                tx.defer("test_bump", {"ids": (1, 2, 9)}, rows=rows)

            return body

        await db.transaction(await expects(2))
        with pytest.raises(DatabaseError, match="test_bump changed 2 rows, not 3"):
            await db.transaction(await expects(3))
        # The packet was read to its end: the next transaction on the one connection works.
        assert await db.run(lambda tx: tx.fetchall_raw("SELECT v FROM t ORDER BY id")) == [
            {"v": 12},
            {"v": 22},
            {"v": 30},
        ]
    finally:
        QUERIES.pop("test_read", None)
        QUERIES.pop("test_bump", None)
        await db.aclose()


async def test_cancelled_transaction_leaves_no_broken_connection_in_the_pool(db):
    await db.run(lambda tx: tx.execute_raw("CREATE TABLE t (id INT PRIMARY KEY) ENGINE=InnoDB"))

    async def slow(tx):
        await tx.execute_raw("INSERT INTO t VALUES (1)")
        await tx.fetchall_raw("SELECT SLEEP(5)")

    async with trio.open_nursery() as nursery:
        nursery.start_soon(db.transaction, slow)
        await wait_until(lambda: running_statements(db, "SELECT SLEEP(5)"))
        nursery.cancel_scope.cancel()  # while the statement runs
    assert db.statistics().in_use == 0
    # The interrupted transaction was rolled back by the server when its connection closed.

    async def rolled_back() -> bool:
        rows = await db.run(lambda tx: tx.fetchall_raw("SELECT COUNT(*) AS n FROM t"))
        return rows[0]["n"] == 0

    assert await wait_until(rolled_back, timeout_s=5)


def _literal(value):
    conn = DriverConnection(host="unused")
    conn.server_status = 0
    return conn.literal(value)


def test_per_row_values_branch_only_for_rows_that_differ_from_the_most_common_value():
    template = "UPDATE t SET a = {a}, b = {b} WHERE id IN %(row_keys)s AND v = %(v)s"
    rows = {"x": {"a": 1, "b": "p"}, "y": {"a": 2, "b": "p"}, "z": {"a": 1}}
    sql, values = per_row_statement(template, rows, {"v": 7}, _literal)
    assert sql == (
        "UPDATE t SET a = CASE id WHEN 'y' THEN 2 ELSE 1 END, "
        "b = CASE id WHEN 'z' THEN NULL ELSE 'p' END WHERE id IN %(row_keys)s AND v = %(v)s"
    )
    assert values == {"v": 7, "row_keys": ("x", "y", "z")}
    same, _ = per_row_statement(template, {"x": {"a": 1, "b": "p"}}, {}, _literal)
    assert same.startswith("UPDATE t SET a = 1, b = 'p' WHERE")
    percent, _ = per_row_statement(template, {"x": {"a": 1, "b": "50% {a}"}, "y": {"a": 1}}, {}, _literal)
    assert "WHEN 'y' THEN NULL ELSE '50%% {a}' END" in percent  # formatted by the driver: 50% {a}
    with pytest.raises(ValueError, match="no per-row column"):
        per_row_statement(template, {"x": {"c": 1}}, {}, _literal)
    with pytest.raises(ValueError, match="row_keys"):
        per_row_statement("UPDATE t SET a = {a} WHERE id = %(id)s", {"x": {"a": 1}}, {}, _literal)


async def test_per_row_values_reach_their_rows(db):
    await db.run(lambda tx: tx.execute_raw("CREATE TABLE t (id CHAR(1) PRIMARY KEY, a INT, b TEXT) ENGINE=InnoDB"))
    await db.run(lambda tx: tx.execute_raw("INSERT INTO t VALUES ('w', 0, 'w'), ('x', 0, 'x'), ('y', 0, 'y')"))
    template = "UPDATE t SET a = {a}, b = {b} WHERE id IN %(row_keys)s"
    sql, values = per_row_statement(template, {"x": {"a": 5, "b": "%s {b}"}, "y": {"a": 5}}, {}, _literal)
    assert await db.run(lambda tx: tx.execute_raw(sql, values)) == 2
    rows = await db.run(lambda tx: tx.fetchall_raw("SELECT id, a, b FROM t ORDER BY id"))
    assert [(r["id"], r["a"], r["b"]) for r in rows] == [("w", 0, "w"), ("x", 5, "%s {b}"), ("y", 5, None)]


def test_named_query_blocks_parse_and_reject_duplicates():
    blocks = parse_blocks("-- name: a\nSELECT 1;\n-- a comment\n-- name: b\nSELECT 2\n")
    assert blocks == {"a": "SELECT 1", "b": "SELECT 2"}
    with pytest.raises(ValueError):
        parse_blocks("-- name: a\nSELECT 1\n-- name: a\nSELECT 2\n")


async def updated_without_waiting(db: Database, row_id: int) -> bool:
    """Row ``row_id`` of ``t`` takes an update within a 2 s lock wait: nobody holds its lock."""

    async def update(tx):
        await tx.execute_raw("SET SESSION innodb_lock_wait_timeout = 2")
        return await tx.execute_raw("UPDATE t SET v = 2 WHERE id = %s", (row_id,))

    with trio.fail_after(10):
        return await db.run(update) == 1


async def test_a_discarded_connection_is_closed_at_once_so_its_locks_go(db):
    """A connection dropped mid-transaction must not keep its row locks until garbage collection."""
    await db.run(lambda tx: tx.execute_raw("CREATE TABLE t (id INT PRIMARY KEY, v INT) ENGINE=InnoDB"))
    await db.run(lambda tx: tx.execute_raw("INSERT INTO t VALUES (1, 0)"))
    held = []

    with trio.CancelScope() as dropped:

        async def lock_then_hang(tx):
            await tx.execute_raw("UPDATE t SET v = 1 WHERE id = 1")
            held.append(tx._conn._sock)  # e.g. a traceback frame keeping the socket stream alive
            dropped.cancel()  # with the row locked
            await trio.sleep_forever()

        await db.transaction(lock_then_hang)
    assert held  # the socket stream object is still referenced here

    assert await updated_without_waiting(db, 1)


async def test_a_transaction_cancelled_while_it_waits_for_the_server_lets_its_locks_go(db, dsn):
    """Cancelled inside a driver read (the server still working on its statement), the
    driver gives the connection up itself; its socket must close then, not when the
    garbage collector finds the stream, or the session keeps its transaction and locks."""
    await db.run(lambda tx: tx.execute_raw("CREATE TABLE t (id INT PRIMARY KEY, v INT) ENGINE=InnoDB"))
    await db.run(lambda tx: tx.execute_raw("INSERT INTO t VALUES (1, 0), (2, 0)"))
    other = Database(dsn, size=1)
    holder_locked, release = trio.Event(), trio.Event()
    held = []

    async def hold_row_one(tx):
        await tx.execute_raw("UPDATE t SET v = 10 WHERE id = 1")
        holder_locked.set()
        await release.wait()

    async def lock_two_then_wait_for_one(tx):
        await tx.execute_raw("UPDATE t SET v = 1 WHERE id = 2")
        held.append(tx._conn._sock)  # e.g. a traceback frame keeping the socket stream alive
        await tx.fetchall_raw("SELECT v FROM t WHERE id = 1 FOR UPDATE")  # waits for the holder

    try:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(other.transaction, hold_row_one)
            await holder_locked.wait()
            with trio.move_on_after(30) as waiting:
                async with trio.open_nursery() as claims:
                    claims.start_soon(db.transaction, lock_two_then_wait_for_one)
                    await wait_until(lambda: running_statements(db, "SELECT v FROM t WHERE id = 1 FOR UPDATE"))
                    claims.cancel_scope.cancel()  # while its statement waits for the lock
            assert not waiting.cancelled_caught
            release.set()  # the server would now grant the lock to the cancelled session
    finally:
        await other.aclose()
    assert held  # the socket stream object is still referenced here

    assert await updated_without_waiting(db, 2)
    assert await db.run(lambda tx: tx.fetchall_raw("SELECT id, v FROM t ORDER BY id")) == [
        {"id": 1, "v": 10},
        {"id": 2, "v": 2},
    ]


async def test_datetimes_read_back_exactly(db):
    rows = await db.run(
        lambda tx: tx.fetchall_raw(
            "SELECT CAST('2026-12-01 10:49:02.000001' AS DATETIME(6)) AS micro, "
            "CAST('2026-12-01 10:49:02' AS DATETIME) AS whole, CAST(NULL AS DATETIME(6)) AS missing, "
            "TIMESTAMP('2026-02-28 23:59:59.5') AS stamp"
        )
    )
    assert rows == [
        {
            "micro": datetime(2026, 12, 1, 10, 49, 2, 1),
            "whole": datetime(2026, 12, 1, 10, 49, 2),
            "missing": None,
            "stamp": datetime(2026, 2, 28, 23, 59, 59, 500000),
        }
    ]


@contextmanager
def descriptors_taken_below(limit: int) -> Iterator[None]:
    """Every descriptor number below ``limit`` is open, so the next one opened is ``limit`` or
    above (the soft RLIMIT_NOFILE is raised for it when needed, and restored after)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    wanted = limit + 64
    if soft < wanted:
        if hard != resource.RLIM_INFINITY and hard < wanted:
            pytest.skip(f"RLIMIT_NOFILE hard limit {hard} is below {wanted}")
        resource.setrlimit(resource.RLIMIT_NOFILE, (wanted, hard))
    taken: list[int] = []
    try:
        while True:
            fd = os.open(os.devnull, os.O_RDONLY)
            if fd >= limit:
                os.close(fd)
                break
            taken.append(fd)
        yield
    finally:
        for fd in taken:
            os.close(fd)
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


async def test_a_connection_on_a_descriptor_above_1023_is_reused_until_the_server_drops_it(dsn, db):
    """``select.select`` refuses descriptors of 1024 and above; the reuse check must not take
    every such live connection for a dropped one, and must still notice a dropped one."""
    high = Database(dsn, size=1)
    try:
        with descriptors_taken_below(1024):
            first = await high.run(lambda tx: tx.fetchall_raw("SELECT CONNECTION_ID() AS id"))
        (conn,) = high._idle
        assert conn._sock.socket.fileno() >= 1024
        assert not is_dropped(conn)
        again = await high.run(lambda tx: tx.fetchall_raw("SELECT CONNECTION_ID() AS id"))
        assert again == first  # the same session, reused
        await db.run(lambda tx: tx.execute_raw(f"KILL {first[0]['id']}"))
        assert await wait_until(lambda: is_dropped(conn))
        after = await high.run(lambda tx: tx.fetchall_raw("SELECT CONNECTION_ID() AS id"))
        assert after != first and high.statistics().open == 1
    finally:
        await high.aclose()


# Values of every type the node passes, each also as an item of a sequence (an IN list, a
# list of pairs): strings, None and integers are written in one step, other types
# (booleans, floats, datetimes) send the value, or the whole sequence, the driver's way.
SCALARS = st.one_of(
    st.text(alphabet="\\'\"\0\n\r\x1a%ab"),
    st.none(),
    st.integers(),
    st.booleans(),
    st.floats(allow_nan=False, allow_infinity=False),
    st.datetimes(),
)
ITEMS = SCALARS | st.tuples(st.text(max_size=4), st.text(alphabet="\\'ab", max_size=4))
VALUES = st.one_of(
    SCALARS,
    st.text(),
    st.datetimes(timezones=st.timezones()),
    st.binary(max_size=8),
    st.lists(st.text(max_size=4), min_size=1, max_size=3).map(tuple),
    st.lists(ITEMS, min_size=1, max_size=4).map(tuple),
    st.lists(ITEMS, min_size=1, max_size=4),
)


@given(value=VALUES, no_backslash=st.booleans())
@example(value='it\'s \\ "q"\0', no_backslash=False)
@example(value="it's \\", no_backslash=True)
@example(value=datetime(2026, 1, 2, 3, 4, 5), no_backslash=False)
@example(value=datetime(5, 1, 2, 3, 4, 5, 6), no_backslash=False)
@example(value=("it's", None, 7, ("a\\b", "t")), no_backslash=True)
@example(value=("x", 1.5), no_backslash=False)
@example(value=2.0, no_backslash=False)
@example(value=-1e-300, no_backslash=False)
@example(value=float("inf"), no_backslash=False)
def test_literals_are_the_drivers_own(value, no_backslash):
    """The connection's one-step literals are the text the driver writes for every value."""
    ours, drivers = DriverConnection(host="unused"), trio_mysql.connections.Connection(host="unused")
    ours.server_status = drivers.server_status = SERVER_STATUS.SERVER_STATUS_NO_BACKSLASH_ESCAPES if no_backslash else 0

    def written(conn):
        try:
            return conn.literal(value)
        except trio_mysql.ProgrammingError as exc:  # inf and nan: refused alike
            return repr(exc)

    assert written(ours) == written(drivers)


@given(
    values=st.lists(VALUES, min_size=3, max_size=3),
    template=st.sampled_from(
        [
            QUERIES["task_insert"],
            QUERIES["idempotency_insert"],
            "INSERT INTO t (a, b, c, d) VALUES (%(a)s, CONCAT(%(b)s, '%%'), %(c)s, %(a)s)",
        ]
    ),
    no_backslash=st.booleans(),
)
def test_insert_rows_writes_the_values_the_drivers_mogrify_writes(values, template, no_backslash):
    """``Tx.insert_rows`` fills a VALUES list by position (``positional``): the same text as
    the driver's ``mogrify`` with the row's mapping, repeated names and ``%%`` included."""
    conn = DriverConnection(host="unused")
    conn.server_status = SERVER_STATUS.SERVER_STATUS_NO_BACKSLASH_ESCAPES if no_backslash else 0
    part = MULTI_ROW_INSERT.match(template).group(2).rstrip()
    form, names = positional(part)
    row = {name: values[i % 3] for i, name in enumerate(dict.fromkeys(names))}
    row["unused"] = object()  # another value of the row is not written, nor escaped
    expected = conn.cursor().mogrify(part, {k: v for k, v in row.items() if k != "unused"})
    assert form % tuple([conn.literal(row[name]) for name in names]) == expected


# A branch and a tail as union_statement joins them: the tail reads a branch's value and a
# shared one, and a percent sign of the text sits before a placeholder's name.
UNION_BRANCH = "(SELECT %(a_{i})s AS a, %(b_{i})s AS b, %(shared)s AS s, '%%(a_{i})s %%' AS p)"
UNION_TAIL = "ORDER BY a LIMIT %(limit)s /* %(b_0)s */"


def _union_by_driver(conn, branches, params) -> str:
    """The union as the driver writes it with every value a parameter (before the texts
    were kept)."""
    sql = " UNION ALL ".join(UNION_BRANCH.replace("{i}", str(i)) for i in range(len(branches)))
    values = dict(params)
    for i, branch in enumerate(branches):
        values.update({f"{key}_{i}": value for key, value in branch.items()})
    return conn.cursor().mogrify(f"{sql} {UNION_TAIL}", values)


@given(
    branches=st.lists(st.fixed_dictionaries({"a": VALUES, "b": VALUES}), min_size=1, max_size=4),
    shared=VALUES,
    no_backslash=st.booleans(),
)
@example(branches=[{"a": "50% %(b_0)s", "b": ["x"]}], shared="%%", no_backslash=False)
def test_union_statements_are_the_drivers_text_when_kept_and_when_written_again(branches, shared, no_backslash):
    """``Tx.union_statement`` keeps the text with its branches' values written in; the text,
    the first time and from what was kept, is the driver's with every value a parameter."""
    conn = DriverConnection(host="unused")
    conn.server_status = SERVER_STATUS.SERVER_STATUS_NO_BACKSLASH_ESCAPES if no_backslash else 0
    params = {"shared": shared, "limit": 7}
    expected = _union_by_driver(conn, branches, params)
    with mock.patch.dict(QUERIES, {"test_branch": UNION_BRANCH, "test_tail": UNION_TAIL}):
        tx = Tx(conn)
        assert tx.union_statement("test_branch", "test_tail", branches, params) == expected
        assert tx.union_statement("test_branch", "test_tail", branches, params) == expected
        # The other escaping mode is not given the kept text.
        conn.server_status ^= SERVER_STATUS.SERVER_STATUS_NO_BACKSLASH_ESCAPES
        again = tx.union_statement("test_branch", "test_tail", branches, params)
        assert again == _union_by_driver(conn, branches, params)


def test_equal_branch_values_of_other_types_are_not_given_each_others_text():
    """0, 0.0 and False (and 1, 1.0 and True) are equal keys of a dict, but not the same
    literal: each union is the driver's text, whichever was written first."""
    conn = DriverConnection(host="unused")
    conn.server_status = 0
    with mock.patch.dict(QUERIES, {"test_branch": UNION_BRANCH, "test_tail": UNION_TAIL}):
        for values in ([0.0, 0, False, 0.0], [1, True, 1.0, (1,), (1.0,), (True,)]):
            for value in values:
                branches = [{"a": value, "b": "x"}]
                got = Tx(conn).union_statement("test_branch", "test_tail", branches, {"shared": 1, "limit": 2})
                assert got == _union_by_driver(conn, branches, {"shared": 1, "limit": 2}), value


class CountingConnection(DriverConnection):
    literals = 0

    def literal(self, obj):
        self.literals += 1
        return super().literal(obj)


def test_a_claims_branches_are_written_once_and_only_its_queue_and_limit_again(monkeypatch):
    """A claim's candidate read (10 branches of 6 values for one capability) writes its
    branches' values once; the next claims of the connection write the queue and the limit."""
    from orbit_node.db import tx as tx_module
    from orbit_node.store.claim import claim_branches

    # Nothing kept by an earlier test (or an earlier run of this one in the same process).
    monkeypatch.setattr(tx_module, "_UNIONS", {})
    conn = CountingConnection(host="unused")
    conn.server_status = 0
    tx = Tx(conn)
    branches = claim_branches((("counted", "1", "1"),), False)
    first = tx.union_statement(
        "claim_candidates_branch", "claim_candidates_order", branches, {"queue_id": "q1", "limit": 16}
    )
    assert conn.literals == 60 + 2
    second = tx.union_statement(
        "claim_candidates_branch", "claim_candidates_order", branches, {"queue_id": "q2", "limit": 8}
    )
    assert conn.literals == 60 + 2 + 2
    assert second == first.replace("'q1'", "'q2'").replace("LIMIT 16", "LIMIT 8")


async def _commands(db) -> int:
    return await db.run(lambda tx: _read_commands(tx))


async def _read_commands(tx) -> int:
    return tx.commands


async def test_short_inserts_travel_with_the_commit_and_long_ones_go_at_once(dsn, monkeypatch):
    """``Tx.insert_rows``: a multi-row INSERT of at most MAX_INSERT_BYTES goes with the
    transaction's COMMIT (one round trip for both); more rows are split into statements of
    at most that many bytes, all but the last sent at once; the rows are the same."""
    import orbit_node.db.tx as tx_module

    one = Database(dsn, size=1)
    try:
        await one.run(lambda tx: tx.execute_raw("CREATE TABLE t (id INT PRIMARY KEY, v VARCHAR(40)) ENGINE=InnoDB"))
        monkeypatch.setitem(QUERIES, "t_insert", "INSERT INTO t (id, v) VALUES (%(id)s, %(v)s)")
        rows = [{"id": i, "v": f"é✓ {i} 'q' \\"} for i in range(50)]

        async def write(tx):
            await tx.insert_rows("t_insert", rows[:25])
            await tx.insert_rows("t_insert", rows[25:])

        before = await _commands(one)
        await one.transaction(write)
        assert await _commands(one) - before == 1  # START TRANSACTION, both INSERTs and COMMIT: one packet
        monkeypatch.setattr(tx_module, "MAX_INSERT_BYTES", 200)
        written: list[tuple[str, int | None]] = []
        defer = tx_module.Tx._defer

        def recording(self, name, text, rows):
            written.append((text, rows))
            defer(self, name, text, rows)

        monkeypatch.setattr(tx_module.Tx, "_defer", recording)
        await one.run(lambda tx: tx.execute_raw("DELETE FROM t"))
        before = await _commands(one)
        await one.transaction(write)
        # Each call's last statement goes with the next packet (the second's with the COMMIT).
        assert await _commands(one) - before == len(written) - 1
        assert len(written) > 4 and all(len(text.encode()) <= 200 for text, _ in written)
        assert sum(rows for _, rows in written) == 50
        got = await one.run(lambda tx: tx.fetchall_raw("SELECT id, v FROM t ORDER BY id"))
        assert got == rows
    finally:
        await one.aclose()


async def test_a_deferred_insert_that_fails_fails_its_transaction(db, monkeypatch):
    """A duplicate key in a deferred INSERT raises at the COMMIT that carries it, with the
    server's error number; nothing of the transaction is kept."""
    await db.run(lambda tx: tx.execute_raw("CREATE TABLE t (id INT PRIMARY KEY) ENGINE=InnoDB"))
    await db.run(lambda tx: tx.execute_raw("CREATE TABLE u (id INT PRIMARY KEY) ENGINE=InnoDB"))
    await db.run(lambda tx: tx.execute_raw("INSERT INTO t VALUES (3)"))
    monkeypatch.setitem(QUERIES, "t_insert", "INSERT INTO t (id) VALUES (%(id)s)")
    monkeypatch.setitem(QUERIES, "u_insert", "INSERT INTO u (id) VALUES (%(id)s)")

    async def write(tx):
        await tx.insert_rows("u_insert", [{"id": 1}])
        await tx.insert_rows("t_insert", [{"id": 2}, {"id": 3}])

    with pytest.raises(DatabaseError) as error:
        await db.transaction(write)
    assert error.value.errno == 1062
    assert await db.run(lambda tx: tx.fetchall_raw("SELECT id FROM u")) == []
    assert await db.run(lambda tx: tx.fetchall_raw("SELECT id FROM t")) == [{"id": 3}]


@pytest.mark.parametrize(
    "sql",
    [
        "INSERT IGNORE INTO t (id) VALUES (%(id)s)",
        "INSERT INTO t (id) VALUES (%(id)s) ON DUPLICATE KEY UPDATE id = id",
        "UPDATE t SET id = %(id)s",
    ],
)
async def test_insert_rows_takes_plain_inserts_only(db, monkeypatch, sql):
    """A row count is checked, so an INSERT that may skip or update rows is refused."""
    monkeypatch.setitem(QUERIES, "t_insert", sql)

    async def write(tx):
        await tx.insert_rows("t_insert", [{"id": 1}])

    with pytest.raises(ValueError, match="plain INSERT"):
        await db.transaction(write)
