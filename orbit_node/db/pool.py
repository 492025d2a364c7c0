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
* Driver errors are translated at this boundary into ``orbit_node.domain.errors`` types
  (``driver.py``: error numbers, the session set-up, the connection class); statements
  run through ``Tx`` (``tx.py``).
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

import logging
import math
import random
import warnings
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from contextlib import asynccontextmanager
from typing import Any, TypeVar

import attrs
import trio
import trio_mysql
import trio_mysql.converters
import trio_mysql.cursors
from trio_mysql.constants import CLIENT

from ..domain.dsn import Dsn, DsnHost
from ..domain.errors import InvalidArgument, OrbitError, Unavailable
from .driver import (
    CONNECTION_ERRNOS,
    CONVERSIONS,
    REPLAYABLE_ERRNOS,
    SCHEMA_ERRNOS,
    SESSION_SETUP,
    UNKNOWN_VARIABLE_ERRNO,
    WSREP_NOT_READY_ERRNO,
    DriverConnection,
    errno_of,
    hard_close,
    is_dropped,
    translate,
)
from .hosts import HostOrder
from .tx import Tx

T = TypeVar("T")

log = logging.getLogger("orbit.db")

# Server notes such as "table already exists" (CREATE ... IF NOT EXISTS) are not errors.
warnings.filterwarnings("ignore", category=trio_mysql.Warning)

# Replays of one transaction before the conflict is reported as an error.
MAX_REPLAYS = 8
# Base of the jittered pause between replays; small, conflicts clear in milliseconds.
REPLAY_BACKOFF_S = 0.005
# A rollback that takes longer than this means the connection is stuck; close it.
ROLLBACK_TIMEOUT_S = 2.0

# Transactions run at READ COMMITTED unless they ask otherwise; set once per session so
# a transaction costs no extra round trip for it.
DEFAULT_ISOLATION = "READ COMMITTED"


def connection_settings(dsn: Dsn, host: DsnHost, connect_timeout_s: float) -> dict[str, Any]:
    """The driver connection's settings for one server of ``dsn``, as the pool opens it."""
    return dict(
        host=host.host,
        port=host.port,
        user=dsn.user,
        password=dsn.password,
        database=dsn.database,
        unix_socket=dsn.unix_socket,
        charset="utf8mb4",
        use_unicode=True,
        autocommit=True,
        # A transaction's opening travels with its first statement (``Tx``). Every
        # statement's values are escaped by the driver; none is built from input text.
        client_flag=CLIENT.MULTI_STATEMENTS,
        connect_timeout=connect_timeout_s,
        init_command=SESSION_SETUP,
        conv=CONVERSIONS,
    )


@attrs.frozen
class DatabasePoolStatistics:
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

    def statistics(self) -> DatabasePoolStatistics:
        in_use = self.size - self._slots.value
        return DatabasePoolStatistics(self.size, self._open, len(self._idle), in_use, self.replays)

    async def _open_to(self, host: DsnHost):
        conn = DriverConnection(**connection_settings(self.dsn, host, self.connect_timeout_s))
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
                tx = Tx(conn)
                result = await fn(tx)
                # A write deferred by an autocommit body runs before the connection goes back.
                await tx.send_leading()
                return result
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
                        # Opened in front of the body's first statement (``Tx``); another
                        # isolation level is for this transaction only, the session's stays.
                        opening: tuple[str, ...] = ("START TRANSACTION",)
                        if isolation != DEFAULT_ISOLATION:
                            opening = (f"SET TRANSACTION ISOLATION LEVEL {isolation}", *opening)
                        tx = Tx(conn, list(opening))
                        result = await fn(tx)
                        await tx.commit()
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
