"""Result sets read in fewer steps (``orbit_node.db.results``) hold the driver's values:
the same rows, descriptions, warnings and errors as trio-mysql's own reader."""

from __future__ import annotations

from contextlib import asynccontextmanager
from datetime import datetime

import pytest
import trio_mysql
import trio_mysql.connections
import trio_mysql.cursors
from hypothesis import example, given
from hypothesis import strategies as st
from trio_mysql.connections import MySQLResult
from trio_mysql.protocol import MysqlPacket

from orbit_node.db import results
from orbit_node.db.driver import DriverConnection, decode_datetime
from orbit_node.db.pool import connection_settings
from orbit_node.db.results import Result, Rows, row_values


def length_coded(value: bytes | None) -> bytes:
    """A value as the text protocol sends it in a row."""
    if value is None:
        return b"\xfb"
    n = len(value)
    if n < 251:
        head = bytes([n])
    elif n < 1 << 16:
        head = b"\xfc" + n.to_bytes(2, "little")
    elif n < 1 << 24:
        head = b"\xfd" + n.to_bytes(3, "little")
    else:
        head = b"\xfe" + n.to_bytes(8, "little")
    return head + value


# A column: how its bytes decode, its converter, and values it may hold.
COLUMNS = {
    "text": ("utf8", None, st.text(max_size=40).map(lambda s: s.encode())),
    "bytes": (None, None, st.binary(max_size=40)),
    "int": ("ascii", int, st.integers(-(2**63), 2**64 - 1).map(lambda i: str(i).encode())),
    "datetime": ("ascii", decode_datetime, st.datetimes().map(lambda d: d.isoformat(" ").encode())),
}
LONG = st.sampled_from([250, 251, 252, 65535, 65536, 70000]).map(lambda n: b"x" * n)


@st.composite
def rows_of(draw):
    kinds = draw(st.lists(st.sampled_from(sorted(COLUMNS)), min_size=1, max_size=8))
    columns = [COLUMNS[kind][:2] for kind in kinds]
    values = [
        draw(st.none() | COLUMNS[kind][2] | (LONG if kind in ("text", "bytes") else st.nothing())) for kind in kinds
    ]
    return columns, values


def drivers_row(data: bytes, columns) -> tuple:
    result = MySQLResult.__new__(MySQLResult)
    result.converters, result.unbuffered_active = columns, False
    return result._read_row_from_packet(MysqlPacket(data, "utf8"))


@given(rows_of())
@example(([("utf8", None)], [b"x" * 251]))
@example(([("ascii", int), (None, None)], [None, b""]))
def test_a_row_reads_as_the_drivers_reads_it(row):
    columns, values = row
    data = b"".join(length_coded(v) for v in values)
    assert row_values(data, columns) == drivers_row(data, columns)


def test_a_row_shorter_than_its_columns_stops_where_the_driver_stops():
    columns = [("ascii", int)] * 3
    data = length_coded(b"7")
    assert row_values(data, columns) == drivers_row(data, columns) == (7,)


@asynccontextmanager
async def connections(empty_dsn):
    """Ours (``DriverConnection``, ``Rows``) and the driver's own, on one new database, both
    with the settings the node's pool opens its connections with."""
    settings = connection_settings(empty_dsn, empty_dsn.hosts[0], connect_timeout_s=10)
    ours, drivers = DriverConnection(**settings), trio_mysql.connections.Connection(**settings)
    await ours.connect()
    await drivers.connect()
    try:
        yield ours, drivers
    finally:
        ours.close()
        drivers.close()


async def every_result(conn, cursor_class, sql: str):
    """Each result of ``sql`` (one or several statements): rows, description, count, warnings."""
    async with conn.cursor(cursor_class) as cursor:
        await cursor.execute(sql)
        out = []
        while True:
            out.append(
                (
                    await cursor.fetchall(),
                    cursor.description,
                    cursor.rowcount,
                    cursor._result.warning_count,
                    cursor._result.has_next,
                )
            )
            if not await cursor.nextset():
                return out


SCHEMA = """
CREATE TABLE kinds (
  id INT PRIMARY KEY, name VARCHAR(300), body MEDIUMTEXT, raw VARBINARY(300), doc JSON,
  amount DECIMAL(12, 4), ratio DOUBLE, at DATETIME(6), stamp TIMESTAMP(3) NULL, flag TINYINT(1),
  big BIGINT UNSIGNED, state ENUM('queued', 'running'), day DATE
) ENGINE=InnoDB
"""
ROWS = """
INSERT INTO kinds VALUES
  (1, 'héllo ✓', REPEAT('a', 70000), x'00ff10', '{"a": [1, 2]}', 12.5, 0.25, '2026-01-02 03:04:05.123456',
   '2026-01-02 03:04:05.120', 1, 18446744073709551615, 'queued', '2026-12-02'),
  (2, REPEAT('b', 251), REPEAT('c', 300), '', 'null', -0.0001, -1e300, '2026-01-02 03:04:05', NULL, 0, 0,
   'running', '1000-01-01'),
  (3, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL)
"""
STATEMENTS = [
    "SELECT * FROM kinds ORDER BY id",
    "SELECT a.id, b.id, a.name, b.name FROM kinds a JOIN kinds b ON b.id = a.id + 1 ORDER BY a.id",
    "SELECT * FROM kinds WHERE id < 0",
    "SELECT 1; SELECT name FROM kinds ORDER BY id; UPDATE kinds SET flag = flag WHERE id = 1; SELECT NOW(6) > '2000-01-01'",
    "SELECT CAST('x1' AS SIGNED) AS warned",
    "SELECT seq, REPEAT('r', seq) AS pad FROM seq_1_to_3000",
]


async def test_results_hold_the_drivers_values(empty_dsn):
    async with connections(empty_dsn) as (ours, drivers):
        await ours.query(SCHEMA)
        await ours.query(ROWS)
        for sql in STATEMENTS:
            for _ in range(2):  # the second time the columns come from what the connection kept
                got = await every_result(ours, Rows, sql)
                assert got == await every_result(drivers, trio_mysql.cursors.DictCursor, sql), sql
        assert isinstance(ours._result, Result)
        # 'warned' was read with a warning, as the driver reads it.
        [(rows, _, _, warnings, _)] = await every_result(ours, Rows, STATEMENTS[4])
        assert rows == [{"warned": 0}] and warnings == 1


async def test_a_connection_parses_a_statements_columns_once(empty_dsn, monkeypatch):
    parsed = []
    real = results.FieldDescriptorPacket

    def counting(data, encoding):
        parsed.append(data)
        return real(data, encoding)

    monkeypatch.setattr(results, "FieldDescriptorPacket", counting)
    sql = "SELECT 1 AS a, 'x' AS b"
    async with connections(empty_dsn) as (ours, drivers):
        expected = await every_result(drivers, trio_mysql.cursors.DictCursor, sql)
        assert expected[0][0] == [{"a": 1, "b": "x"}]
        for _ in range(3):
            assert await every_result(ours, Rows, sql) == expected
        assert len(parsed) == 2
        monkeypatch.setattr(results, "MAX_DESCRIPTIONS", 1)
        await every_result(ours, Rows, "SELECT 2 AS c")
        assert len(ours.known_columns) == 1  # the bound: what was kept is let go


async def test_errors_are_the_drivers(empty_dsn):
    async with connections(empty_dsn) as (ours, drivers):
        caught, after = [], []
        for conn, cursor_class in ((ours, Rows), (drivers, trio_mysql.cursors.DictCursor)):
            with pytest.raises(trio_mysql.MySQLError) as error:
                await every_result(conn, cursor_class, "SELECT 1; SELECT * FROM missing_table")
            caught.append((type(error.value), error.value.args))
            # The connection stays usable.
            after.append(await every_result(conn, cursor_class, "SELECT 5 AS five"))
        assert caught[0] == caught[1] and caught[0][1][0] == 1146
        assert after[0] == after[1] and after[0][0][0] == [{"five": 5}]


async def test_a_plain_driver_connection_still_reads_with_rows(empty_dsn):
    """``Rows`` on the driver's own connection reads the driver's way."""
    sql = "SELECT 'z' AS z, NOW(6) > '2000-01-01' AS later"
    async with connections(empty_dsn) as (_, drivers):
        got = await every_result(drivers, Rows, sql)
        assert got == await every_result(drivers, trio_mysql.cursors.DictCursor, sql)
        assert got[0][0] == [{"z": "z", "later": 1}]


def test_now_reads_as_a_datetime():
    assert row_values(length_coded(b"2026-12-02 10:11:12.5"), [("ascii", decode_datetime)]) == (
        datetime(2026, 12, 2, 10, 11, 12, 500000),
    )
