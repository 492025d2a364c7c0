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
* A DSN with several hosts (a MariaDB Galera cluster) is written through one server at a
  time, chosen by the rules of ``hosts.py``: the first reachable in order, the next when
  it is lost, an earlier one only when the ``database_writer`` record says so. Every new
  connection to such a cluster first reads that record with ``wsrep_sync_wait=1`` (a
  causality barrier: the server has applied every transaction the cluster committed
  before), then runs with ``wsrep_sync_wait=0``; so after a failover the node reads what
  it wrote before. A certification failure (1213 at COMMIT) replays like a deadlock, and
  "WSREP has not yet prepared node for application use" (1047, a server outside the
  primary component: nothing ran) moves the writer on and replays.
"""

from __future__ import annotations

import collections
import logging
import math
import random
import re
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

from ..config import Dsn, DsnHost
from ..errors import DatabaseError, InvalidArgument, OrbitError, SchemaNotReady, Unavailable
from .hosts import HostOrder
from .queries import QUERIES

T = TypeVar("T")

log = logging.getLogger("orbit.db")

# Server notes such as "table already exists" (CREATE ... IF NOT EXISTS) are not errors.
warnings.filterwarnings("ignore", category=trio_mysql.Warning)

# Errors after which the same transaction may simply be run again. On Galera a
# certification failure at COMMIT, and a local transaction aborted by a replicated one,
# are reported as 1213 (deadlock) too.
REPLAYABLE_ERRNOS = frozenset({1213, 1205, 1020})
# Galera: "WSREP has not yet prepared node for application use" - the server is not in the
# primary component (partitioned, joining, desynced) and ran nothing. The writer moves on
# and the transaction is replayed on the next server.
WSREP_NOT_READY_ERRNO = 1047
# The server has no such variable (MySQL has no wsrep_sync_wait): no barrier to take.
UNKNOWN_VARIABLE_ERRNO = 1193
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
# A statement that takes values per row (per_row_statement): ``{column}`` is a per-row
# value, ``key IN %(row_keys)s`` names the rows.
PER_ROW_COLUMN = re.compile(r"\{([a-z_]+)\}")
PER_ROW_KEY = re.compile(r"(\w+)\s+IN\s+%\(row_keys\)s", re.IGNORECASE)

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


def _close_stream(stream: Any) -> None:
    """Close the OS socket under a trio stream (a TLS stream wraps a socket stream)."""
    while stream is not None and not hasattr(stream, "socket"):
        stream = getattr(stream, "transport_stream", None)
    if stream is not None:
        try:
            stream.socket.close()
        except Exception:
            pass


class DriverConnection(trio_mysql.connections.Connection):
    """trio-mysql's connection, closing its socket when it gives the connection up.

    The driver's own ``_force_close`` (run by ``close()``, and by the driver itself when a
    read is interrupted, e.g. by a cancellation, or the server is lost) calls ``close()``
    on a ``trio.SocketStream``, which has none, swallows the error and forgets the stream:
    the socket then stays open until the garbage collector finds the stream, and the
    server keeps the session, its open transaction and its row locks alive. A claim
    cancelled while it waits for the server would hold its rows for as long.
    """

    _sock: Any
    _closed: bool

    def _force_close(self) -> None:
        _close_stream(self._sock)
        self._sock = None
        self._closed = True

    __del__ = _force_close


def hard_close(conn) -> None:
    """Close a driver connection's socket now: the server rolls its transaction back at once."""
    conn.close()


def is_dropped(conn) -> bool:
    """An idle connection whose socket has anything to read is not fit for reuse.

    A healthy idle MySQL session never sends unprompted, so readable means the server
    closed it (restart, ``wait_timeout``, ``KILL``: EOF, RST or a farewell error packet).
    Checked without a round trip, before every reuse, with ``poll`` (``select.select``
    refuses descriptors of 1024 and above, which a busy process hands out).
    """
    stream = getattr(conn, "_sock", None)
    if stream is None:
        return True
    try:
        fd = stream.socket.fileno()
        if fd < 0:
            return True
        poller = select.poll()
        poller.register(fd, select.POLLIN | select.POLLPRI)
        # Any event counts: data or EOF (POLLIN), an error or hang-up (always reported),
        # a descriptor that is no longer open (POLLNVAL).
        return bool(poller.poll(0))
    except (OSError, ValueError):
        return True


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
    if (
        errno in CONNECTION_ERRNOS
        or errno == WSREP_NOT_READY_ERRNO
        or isinstance(exc, (OSError, trio.BrokenResourceError, trio.ClosedResourceError))
    ):
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


def per_row_statement(
    template: str, rows: Mapping[Any, Mapping[str, Any]], params: Mapping[str, Any], *, name: str = "<sql>"
) -> tuple[str, dict[str, Any]]:
    """The text and parameters of a statement that takes a value per row.

    ``template`` names its rows ``key IN %(row_keys)s`` (the keys of ``rows``) and each
    per-row value ``{column}``; a row's values lack none but may leave one out (NULL).
    ``{column}`` becomes the value most rows have, one parameter, and when some rows differ,
    ``CASE key WHEN <row> THEN <its value> ... ELSE <that value> END`` with a branch for each
    of them only. So a single-table UPDATE by primary key takes per-row values without
    joining a table of them (a multi-table UPDATE needs an internal temporary table), and
    the server compares each row with as few branches as the values allow.
    """
    found = PER_ROW_KEY.search(template)
    if found is None:
        raise ValueError(f"query {name!r} does not name its rows with `key IN %(row_keys)s`")
    key = found.group(1)
    columns = set(PER_ROW_COLUMN.findall(template))
    unknown = {column for values in rows.values() for column in values} - columns
    if unknown:
        raise ValueError(f"query {name!r} has no per-row column {sorted(unknown)!r}")
    keys = list(rows)
    values: dict[str, Any] = {**params, "row_keys": tuple(keys)}
    expressions: dict[str, str] = {}
    for column in columns:
        by_row = [rows[k].get(column) for k in keys]
        common = collections.Counter(by_row).most_common(1)[0][0]
        values[f"_{column}"] = common
        branches = []
        for i, value in enumerate(by_row):
            if value != common:
                values[f"_row_{i}"], values[f"_{column}_{i}"] = keys[i], value
                branches.append(f"WHEN %(_row_{i})s THEN %(_{column}_{i})s")
        expressions[column] = (
            f"CASE {key} {' '.join(branches)} ELSE %(_{column})s END" if branches else f"%(_{column})s"
        )
    return PER_ROW_COLUMN.sub(lambda m: expressions[m.group(1)], template), values


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

    async def execute_per_row(
        self, name: str, rows: Mapping[str, Mapping[str, Any]], params: Mapping[str, Any] | None = None
    ) -> int:
        """Run the named statement ``name`` with values per row (``per_row_statement``): ``rows``
        maps each row's key to its values. Returns the rows affected."""
        if not rows:
            return 0
        sql, values = per_row_statement(QUERIES[name], rows, params or {}, name=name)
        cursor = self._conn.cursor(trio_mysql.cursors.DictCursor)
        await cursor.execute(sql, values)
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
    # The servers of the DSN and the one written to (one server: nothing ever moves).
    order: HostOrder = attrs.field(init=False)
    # The writer moved (a server that takes no work) and the cluster's record says otherwise.
    _unpublished: bool = attrs.field(default=False, init=False)

    def __attrs_post_init__(self):
        self._slots = trio.Semaphore(self.size)
        self.order = HostOrder(self.dsn.hosts)

    @property
    def writer(self) -> DsnHost:
        """The server new connections go to."""
        return self.order.writer

    def statistics(self) -> PoolStatistics:
        in_use = self.size - self._slots.value
        return PoolStatistics(self.size, self._open, len(self._idle), in_use, self.replays)

    async def _open_to(self, host: DsnHost):
        conn = DriverConnection(
            host=host.host,
            port=host.port,
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

    async def _connect(self):
        """A new connection to the writer; with several servers, the rules of ``hosts.py``."""
        if not self.order.several:
            return await self._open_to(self.order.writer)
        first_error: Unavailable | None = None
        for index in self.order.candidates():
            start = self.order.current
            try:
                conn, recorded = await self._ready(index)
            except Unavailable as exc:
                first_error = first_error or exc
                continue
            if index != start and self.order.current == start:
                # The writer was lost and this is the next server that answers.
                self.order.move_to(index)
                log.warning("database writer %s lost; writing to %s", self.order.hosts[start], self.order.hosts[index])
                await self._publish(conn)
                return conn
            if self._unpublished and index == self.order.current:
                self._unpublished = False
                await self._publish(conn)
                return conn
            followed = self.order.index_of(recorded)
            if followed is not None and followed != index and index == self.order.current:
                # The cluster's record names another server (a failover elsewhere, or an
                # operator's ``orbit-admin database writer``): follow it if it answers.
                other = await self._probe(followed)
                if other is not None:
                    self._discard(conn)
                    self.order.move_to(followed)
                    log.warning("database writer moved to %s (recorded in the cluster)", self.order.writer)
                    return other
            return conn
        assert first_error is not None
        raise first_error

    async def _ready(self, index: int) -> tuple[Any, str | None]:
        """A connection to server ``index`` past the barrier, and the recorded writer;
        Unavailable when the server does not answer or takes no work."""
        conn = await self._open_to(self.order.hosts[index])
        try:
            return conn, await self._barrier(conn)
        except BaseException:
            self._discard(conn)
            raise

    async def _probe(self, index: int):
        """A ready connection to server ``index``, or None when it does not answer."""
        try:
            conn, _ = await self._ready(index)
        except Unavailable:
            return None
        return conn

    async def _barrier(self, conn) -> str | None:
        """Wait until the server has applied what the cluster committed; returns the
        recorded writer (``host:port``, or None when none is recorded or no schema yet).

        Unavailable when the server takes no work (1047: outside the primary component)."""
        tx = Tx(conn)
        try:
            with trio.fail_after(self.connect_timeout_s):
                try:
                    await conn.query("SET SESSION wsrep_sync_wait = 1")
                except trio_mysql.MySQLError as exc:
                    if errno_of(exc) != UNKNOWN_VARIABLE_ERRNO:
                        raise
                    synced = False
                else:
                    synced = True
                try:
                    row = await tx.fetchone("database_writer_read")
                except trio_mysql.MySQLError as exc:
                    if errno_of(exc) not in SCHEMA_ERRNOS:
                        raise
                    row = None
                if synced:
                    await conn.query("SET SESSION wsrep_sync_wait = 0")
        except trio.TooSlowError:
            raise Unavailable(
                "database unavailable: the server did not catch up with its cluster", cause="unreachable"
            ) from None
        except (trio_mysql.MySQLError, OSError, trio.BrokenResourceError) as exc:
            if errno_of(exc) == WSREP_NOT_READY_ERRNO:
                raise Unavailable(f"database server takes no work: {exc}", cause="unreachable") from exc
            raise translate(exc) from exc
        return row["host"] if row else None

    async def _publish(self, conn) -> None:
        """Record the writer this node moved to, so the other nodes follow (best effort:
        without the record they find the same server by the same rule)."""
        try:
            await Tx(conn).execute("database_writer_publish", {"host": str(self.order.writer), "by": "failover"})
        except trio_mysql.MySQLError as exc:
            log.warning("could not record the database writer: %s", exc)

    def _host_lost(self, conn) -> None:
        """The server of ``conn`` answered that it takes no work: move on if it is the writer."""
        if self.order.several and self.order.is_writer(conn.host, conn.port):
            self.order.move_to(self.order.candidates()[1])
            self._unpublished = True
            log.warning("database writer %s:%s takes no work; trying %s", conn.host, conn.port, self.order.writer)

    async def check_writer(self) -> None:
        """Follow the cluster's writer record if it names a server this node can reach
        (run once a check interval by the node, so idle pools follow too)."""
        if not self.order.several:
            return
        row = await self.fetchone("database_writer_read")
        followed = self.order.index_of(row["host"] if row else None)
        if followed is None or followed == self.order.current:
            return
        conn = await self._probe(followed)
        if conn is None:
            log.warning("database writer record names %s, which does not answer; staying", self.order.hosts[followed])
            return
        self._discard(conn)
        self.order.move_to(followed)
        log.warning("database writer moved to %s (recorded in the cluster)", self.order.writer)

    async def servers(self) -> list[dict[str, Any]]:
        """Each server of the DSN, in order: whether it answers and takes work (and if not,
        why), and which one this pool writes to (``orbit-admin database writer``)."""
        found = []
        for index, host in enumerate(self.order.hosts):
            error = None
            try:
                conn, _ = await self._ready(index)
            except Unavailable as exc:
                error = exc.message
            else:
                self._discard(conn)
            found.append(
                {"host": str(host), "writer": index == self.order.current, "answers": error is None, "error": error}
            )
        return found

    async def recorded_writer(self) -> dict[str, Any] | None:
        """The cluster's writer record (None: nothing recorded yet)."""
        row = await self.fetchone("database_writer_read")
        return row if row and row["host"] else None

    async def set_writer(self, text: str) -> None:
        """Record ``host:port`` (one of the DSN's servers) as every node's writer; the nodes
        follow within their check interval (an operator's failback)."""
        index = self.order.index_of(text)
        if index is None:
            names = ", ".join(str(h) for h in self.order.hosts)
            raise InvalidArgument(f"--host: {text!r} is not a server of ORBIT_MYSQL_DSN ({names})", field="host")
        conn = await self._probe(index)
        if conn is None:
            raise Unavailable(f"database unavailable: {text} does not answer or takes no work", cause="unreachable")
        try:
            await Tx(conn).execute("database_writer_publish", {"host": text, "by": "operator"})
        except (trio_mysql.MySQLError, OSError, trio.BrokenResourceError) as exc:
            raise translate(exc) from exc
        finally:
            self._discard(conn)
        self.order.move_to(index)

    def _fit_for_reuse(self, conn) -> bool:
        return not is_dropped(conn) and (not self.order.several or self.order.is_writer(conn.host, conn.port))

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
                if self._fit_for_reuse(conn):
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
                    errno = errno_of(exc)
                    if errno == WSREP_NOT_READY_ERRNO:
                        self._host_lost(conn)
                    keep = conn.open and errno not in CONNECTION_ERRNOS and errno != WSREP_NOT_READY_ERRNO
                    raise
                finally:
                    if keep and self.order.several and not self.order.is_writer(conn.host, conn.port):
                        # The writer moved while this connection was in use.
                        keep = False
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
                if (errno in REPLAYABLE_ERRNOS or errno == WSREP_NOT_READY_ERRNO) and attempt <= replays:
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
