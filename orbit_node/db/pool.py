"""A small trio-native connection pool over trio-mysql, and the transaction runner.

* Every connection runs in UTC (``time_zone='+00:00'``) with strict SQL modes, so
  ``NOW(6)`` is the single clock every ownership decision uses.
* ``Database.transaction(fn)`` runs ``fn(tx)`` inside one transaction and replays it
  from the start on deadlock (1213), lock-wait timeout (1205) and MariaDB's
  "record has changed since last read" (1020). ``fn`` must therefore be safe to
  run again: it may only touch the database through ``tx``.
* A connection that saw a connection-level failure, or whose use was interrupted
  by cancellation, is closed rather than returned: its protocol state is unknown. An
  idle connection the server has closed meanwhile (restart, ``wait_timeout``) is noticed
  before reuse, without a round trip, so it never costs a request.
* Driver errors are translated at this boundary into ``orbit_node.errors`` types.
"""

from __future__ import annotations

import math
import random
import select
import warnings
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from contextlib import asynccontextmanager
from datetime import datetime
from typing import Any, TypeVar

import attrs
import trio
import trio_mysql
import trio_mysql.converters
import trio_mysql.cursors
from trio_mysql.constants import FIELD_TYPE

from ..config import Dsn
from ..errors import DatabaseError, OrbitError, SchemaNotReady, Unavailable
from .queries import QUERIES

T = TypeVar("T")

# Server notes such as "table already exists" (CREATE ... IF NOT EXISTS) are not errors.
warnings.filterwarnings("ignore", category=trio_mysql.Warning)

# Errors after which the same transaction may simply be run again.
REPLAYABLE_ERRNOS = frozenset({1213, 1205, 1020})
# Client/server errors meaning the connection (or the server) is gone.
CONNECTION_ERRNOS = frozenset({1040, 1053, 1152, 1158, 1159, 1160, 1161, 1927, 2002, 2003, 2006, 2013, 2014, 2055})
# Server refusals of the configured user: access denied (to the server, the database, a
# table or column), host not allowed.
ACCESS_DENIED_ERRNOS = frozenset({1044, 1045, 1130, 1142, 1143})
UNKNOWN_DATABASE_ERRNO = 1049
# A table or column the node's statements need is missing: the schema is not the node's.
SCHEMA_ERRNOS = frozenset({1054, 1146})
# Replays of one transaction before the conflict is reported as an error.
MAX_REPLAYS = 8
# Base of the jittered pause between replays; small, conflicts clear in milliseconds.
REPLAY_BACKOFF_S = 0.005
# A rollback that takes longer than this means the connection is stuck; close it.
ROLLBACK_TIMEOUT_S = 2.0

# Transactions run at READ COMMITTED unless they ask otherwise; set once per session so
# a transaction costs no extra round trip for it.
DEFAULT_ISOLATION = "READ COMMITTED"

# The statements the driver's executemany joins into multi-row INSERTs (any other is run
# once per row, which Tx.execute_rows refuses).
MULTI_ROW_INSERT = trio_mysql.cursors.RE_INSERT_VALUES

SESSION_SETUP = (
    "SET time_zone = '+00:00', "
    "sql_mode = 'STRICT_ALL_TABLES,NO_ZERO_DATE,NO_ZERO_IN_DATE,ERROR_FOR_DIVISION_BY_ZERO,NO_ENGINE_SUBSTITUTION'"
)


def decode_datetime(text: str | bytes) -> datetime | str | None:
    """A DATETIME/TIMESTAMP column value: ``datetime.fromisoformat`` (C) reads the server's
    text form; anything it does not know goes to the driver's own (slower) converter."""
    if isinstance(text, (bytes, bytearray)):
        text = text.decode("ascii")
    try:
        return datetime.fromisoformat(text)
    except ValueError:
        return trio_mysql.converters.convert_datetime(text)


# The driver's conversions, with the fast DATETIME reader: rows carry several timestamps
# each, and parsing them was the largest single cost of reading a row.
CONVERSIONS = {
    **trio_mysql.converters.conversions,
    FIELD_TYPE.DATETIME: decode_datetime,
    FIELD_TYPE.TIMESTAMP: decode_datetime,
}


def hard_close(conn) -> None:
    """Close a driver connection's socket now.

    trio-mysql's own ``close()`` calls ``close()`` on a ``trio.SocketStream`` (which has
    none) and swallows the error, leaving the socket to the garbage collector: the
    server would keep the session, its open transaction and its locks alive. Closing
    the underlying socket makes the server roll back at once.
    """
    stream = getattr(conn, "_sock", None)
    if stream is not None:
        try:
            stream.socket.close()
        except Exception:
            pass
    conn.close()


def is_dropped(conn) -> bool:
    """An idle connection whose socket has anything to read is not fit for reuse.

    A healthy idle MySQL session never sends unprompted, so readable means the server
    closed it (restart, ``wait_timeout``, ``KILL``: EOF, RST or a farewell error packet).
    Checked without a round trip, before every reuse.
    """
    stream = getattr(conn, "_sock", None)
    if stream is None:
        return True
    try:
        readable, _, _ = select.select([stream.socket.fileno()], [], [], 0)
    except (OSError, ValueError):
        return True
    return bool(readable)


def errno_of(exc: BaseException) -> int | None:
    if isinstance(exc, trio_mysql.MySQLError) and exc.args and isinstance(exc.args[0], int):
        return exc.args[0]
    return None


def translate(exc: BaseException) -> Exception:
    """Turn a driver or socket error into the node's own error type.

    What an operator must fix (the server unreachable, the user refused, the database
    missing, the schema not migrated) becomes ``Unavailable`` with its ``cause``; the
    driver's words stay in the message, which goes to the log and never to a caller."""
    errno = errno_of(exc)
    if errno in CONNECTION_ERRNOS or isinstance(exc, (OSError, trio.BrokenResourceError, trio.ClosedResourceError)):
        return Unavailable(f"database unavailable: {exc}", cause="unreachable")
    if errno in ACCESS_DENIED_ERRNOS:
        return Unavailable(f"database refused the configured user: {exc}", cause="access_denied")
    if errno == UNKNOWN_DATABASE_ERRNO:
        return Unavailable(f"database does not exist: {exc}", cause="unknown_database")
    if errno in SCHEMA_ERRNOS:
        return SchemaNotReady(f"database schema is not the one this node needs (run orbit-migrate up): {exc}")
    if isinstance(exc, trio_mysql.MySQLError):
        message = exc.args[1] if len(exc.args) > 1 else str(exc)
        return DatabaseError(f"database error {errno}: {message}", errno=errno)
    return DatabaseError(f"database error: {exc!r}")


@attrs.define(eq=False)
class Tx:
    """The handle a transaction body (or a single autocommit statement) works through."""

    _conn: Any

    async def _run(self, name: str, params: Mapping[str, Any] | Sequence[Any] | None):
        sql = QUERIES[name]
        cursor = self._conn.cursor(trio_mysql.cursors.DictCursor)
        await cursor.execute(sql, params)
        return cursor

    async def fetchall(self, name: str, params: Mapping[str, Any] | None = None) -> list[dict[str, Any]]:
        cursor = await self._run(name, params)
        return list(await cursor.fetchall())

    async def fetchone(self, name: str, params: Mapping[str, Any] | None = None) -> dict[str, Any] | None:
        cursor = await self._run(name, params)
        return await cursor.fetchone()

    async def fetchrow(self, name: str, params: Mapping[str, Any] | None = None) -> dict[str, Any]:
        """The row of a statement that always returns one (an aggregate, or a row this
        transaction wrote or locked); no row is a DatabaseError naming the statement."""
        row = await self.fetchone(name, params)
        if row is None:
            raise DatabaseError(f"database error: {name} returned no row")
        return row

    async def execute(self, name: str, params: Mapping[str, Any] | None = None) -> int:
        """Run a named statement and return the number of rows it affected."""
        cursor = await self._run(name, params)
        return cursor.rowcount

    async def execute_rows(self, name: str, rows: Sequence[Mapping[str, Any]]) -> int:
        """Run a named ``INSERT ... VALUES (%(a)s, ...)`` for every row, as multi-row INSERTs.

        The driver escapes each row's parameters like any other statement's and joins the
        value lists into as few statements as its size limit allows (all inside the
        caller's transaction). A statement that is not a plain INSERT with a VALUES list of
        placeholders only would be run row by row: it is refused instead. Returns the rows
        affected.
        """
        if not rows:
            return 0
        sql = QUERIES[name]
        if not MULTI_ROW_INSERT.match(sql):
            raise ValueError(f"query {name!r} is not an INSERT whose VALUES list holds only placeholders")
        cursor = self._conn.cursor(trio_mysql.cursors.DictCursor)
        await cursor.executemany(sql, rows)
        return cursor.rowcount

    async def fetchall_union(
        self, branch: str, tail: str, branches: Sequence[Mapping[str, Any]], params: Mapping[str, Any]
    ) -> list[dict[str, Any]]:
        """Named query ``branch`` once per item of ``branches`` joined with UNION ALL, then
        ``tail``. ``{i}`` in the branch's text numbers its own parameters: the keys of
        ``branches[i]`` are passed as ``<key>_<i>``; ``params`` are shared by all."""
        template = QUERIES[branch]
        sql = " UNION ALL ".join(template.replace("{i}", str(i)) for i in range(len(branches)))
        values = dict(params)
        for i, branch_params in enumerate(branches):
            values.update({f"{key}_{i}": value for key, value in branch_params.items()})
        cursor = self._conn.cursor(trio_mysql.cursors.DictCursor)
        await cursor.execute(f"{sql} {QUERIES[tail]}", values)
        return list(await cursor.fetchall())

    async def execute_raw(self, sql: str, params: Any = None) -> int:
        """Run literal SQL. Only the migration runner and test fixtures use this."""
        cursor = self._conn.cursor(trio_mysql.cursors.DictCursor)
        await cursor.execute(sql, params)
        return cursor.rowcount

    async def fetchall_raw(self, sql: str, params: Any = None) -> list[dict[str, Any]]:
        cursor = self._conn.cursor(trio_mysql.cursors.DictCursor)
        await cursor.execute(sql, params)
        return list(await cursor.fetchall())

    @property
    def thread_id(self) -> int:
        """The server's id of this connection (for ``KILL`` in fault tests)."""
        return self._conn.server_thread_id[0]


@attrs.frozen
class PoolStatistics:
    size: int
    open: int
    idle: int
    in_use: int
    replays: int


@attrs.define(eq=False)
class Database:
    """A bounded pool of connections to one database."""

    dsn: Dsn
    size: int = 10
    connect_timeout_s: float = 5.0
    # A borrowed connection whose use takes longer than this is closed (the server rolls
    # back its transaction) and the caller gets Unavailable: an answer lost in the network
    # (no RST, no FIN) must not hold a caller, or its pool slot, forever. None: no bound
    # (migrations, whose statements may legitimately run long).
    operation_timeout_s: float | None = None
    _idle: list[Any] = attrs.field(factory=list, init=False)
    _slots: trio.Semaphore = attrs.field(init=False)
    _open: int = attrs.field(default=0, init=False)
    replays: int = attrs.field(default=0, init=False)
    # Called with the errno of each replayed conflict (metrics hook).
    on_replay: Callable[[int], None] | None = attrs.field(default=None)

    def __attrs_post_init__(self):
        self._slots = trio.Semaphore(self.size)

    def statistics(self) -> PoolStatistics:
        in_use = self.size - self._slots.value
        return PoolStatistics(self.size, self._open, len(self._idle), in_use, self.replays)

    async def _connect(self):
        conn = trio_mysql.connect(
            host=self.dsn.host,
            port=self.dsn.port,
            user=self.dsn.user,
            password=self.dsn.password,
            database=self.dsn.database,
            unix_socket=self.dsn.unix_socket,
            charset="utf8mb4",
            use_unicode=True,
            autocommit=True,
            connect_timeout=self.connect_timeout_s,
            init_command=SESSION_SETUP,
            conv=CONVERSIONS,
        )
        try:
            with trio.fail_after(self.connect_timeout_s):
                await conn.connect()
                await conn.query(f"SET SESSION TRANSACTION ISOLATION LEVEL {DEFAULT_ISOLATION}")
        except trio.TooSlowError:
            hard_close(conn)
            raise Unavailable("database unavailable: connect timed out", cause="unreachable") from None
        except BaseException as exc:
            hard_close(conn)
            if isinstance(exc, (trio_mysql.MySQLError, OSError)):
                raise translate(exc) from exc
            raise
        self._open += 1
        return conn

    def _discard(self, conn) -> None:
        hard_close(conn)
        self._open -= 1

    @asynccontextmanager
    async def connection(self) -> AsyncIterator[Any]:
        """Borrow a raw connection (autocommit on). It is closed instead of returned on any failure."""
        async with self._slots:
            conn = None
            while self._idle:
                conn = self._idle.pop()
                if not is_dropped(conn):
                    break
                self._discard(conn)
                conn = None
            if conn is None:
                conn = await self._connect()
            keep = False
            timeout = math.inf if self.operation_timeout_s is None else self.operation_timeout_s
            with trio.move_on_after(timeout) as bound:
                try:
                    yield conn
                    keep = conn.open
                except (trio_mysql.MySQLError, OrbitError) as exc:
                    # A refused statement leaves the connection usable (transactions have
                    # been rolled back by then); a connection-level failure does not.
                    keep = conn.open and errno_of(exc) not in CONNECTION_ERRNOS
                    raise
                finally:
                    if keep:
                        self._idle.append(conn)
                    else:
                        self._discard(conn)
            if bound.cancelled_caught:
                raise Unavailable(f"database unavailable: no answer within {timeout:g} s", cause="unreachable")

    async def run(self, fn: Callable[[Tx], Awaitable[T]]) -> T:
        """Run ``fn`` with autocommit statements (no transaction)."""
        try:
            async with self.connection() as conn:
                return await fn(Tx(conn))
        except (trio_mysql.MySQLError, OSError, trio.BrokenResourceError) as exc:
            raise translate(exc) from exc

    async def fetchall(self, name: str, params: Mapping[str, Any] | None = None) -> list[dict[str, Any]]:
        return await self.run(lambda tx: tx.fetchall(name, params))

    async def fetchone(self, name: str, params: Mapping[str, Any] | None = None) -> dict[str, Any] | None:
        return await self.run(lambda tx: tx.fetchone(name, params))

    async def execute(self, name: str, params: Mapping[str, Any] | None = None) -> int:
        return await self.run(lambda tx: tx.execute(name, params))

    async def transaction(
        self,
        fn: Callable[[Tx], Awaitable[T]],
        *,
        isolation: str = DEFAULT_ISOLATION,
        replays: int = MAX_REPLAYS,
    ) -> T:
        """Run ``fn(tx)`` in one transaction; replay it on deadlock or lock-wait errors."""
        if isolation not in ("READ COMMITTED", "REPEATABLE READ"):
            raise ValueError(f"unsupported isolation level {isolation!r}")
        attempt = 0
        while True:
            attempt += 1
            try:
                async with self.connection() as conn:
                    try:
                        if isolation != DEFAULT_ISOLATION:
                            # For the next transaction only; the session default stays.
                            await conn.query(f"SET TRANSACTION ISOLATION LEVEL {isolation}")
                        await conn.begin()
                        result = await fn(Tx(conn))
                        await conn.commit()
                        return result
                    except (trio_mysql.MySQLError, OrbitError) as exc:
                        # A statement failed or the body gave up: roll back before the
                        # connection goes back to the pool. If the connection itself broke,
                        # or the rollback does not finish quickly, close it instead (the
                        # server rolls back a closed connection's transaction).
                        if conn.open and errno_of(exc) not in CONNECTION_ERRNOS:
                            with trio.CancelScope(shield=True), trio.move_on_after(ROLLBACK_TIMEOUT_S) as scope:
                                try:
                                    await conn.rollback()
                                except Exception:
                                    hard_close(conn)
                            if scope.cancelled_caught:
                                hard_close(conn)
                        else:
                            hard_close(conn)
                        raise
                    except BaseException:
                        # Cancelled or crashed mid-protocol: the connection state is unknown.
                        hard_close(conn)
                        raise
            except (trio_mysql.MySQLError, OSError, trio.BrokenResourceError) as exc:
                errno = errno_of(exc)
                if errno in REPLAYABLE_ERRNOS and attempt <= replays:
                    self.replays += 1
                    if self.on_replay is not None:
                        self.on_replay(errno)
                    await trio.sleep(random.uniform(0, REPLAY_BACKOFF_S * attempt))
                    continue
                raise translate(exc) from exc

    async def ping(self) -> None:
        await self.run(lambda tx: tx.fetchall("ping"))

    async def aclose(self) -> None:
        while self._idle:
            conn = self._idle.pop()
            with trio.CancelScope(shield=True), trio.move_on_after(1):
                await conn.aclose()
            self._open -= 1
