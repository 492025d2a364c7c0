"""trio-mysql as the node uses it: error numbers and their translation into
``orbit_node.domain.errors``, the session set-up, the fast DATETIME conversion, and a
connection class that really closes its socket when it gives a connection up and
writes the most common values as SQL literals in one step."""

from __future__ import annotations

import select
from datetime import datetime
from typing import Any

import trio
import trio_mysql
import trio_mysql.converters
from trio_mysql.constants import FIELD_TYPE, SERVER_STATUS
from trio_mysql.protocol import MysqlPacket

from ..domain.errors import DatabaseError, SchemaNotReady, Unavailable
from .results import Result, packet_now

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


def escape_backslashes(text: str) -> str:
    """``text`` escaped as the driver's ``trio_mysql.converters.escape_string`` escapes it
    (the server's default mode): NUL, backslash, newline, carriage return, Ctrl-Z and both
    quotes get a backslash. One ``str.replace`` per character, the backslash first, so no
    escape written is escaped again; each is a C scan that returns the text itself when
    the character is absent. (A ``str.translate`` table looks every character up in
    Python objects: five times the cost on a task's JSON payload.)"""
    return (
        text.replace("\\", "\\\\")
        .replace("\0", "\\0")
        .replace("\n", "\\n")
        .replace("\r", "\\r")
        .replace("\032", "\\Z")
        .replace('"', '\\"')
        .replace("'", "\\'")
    )


def sequence_literal(items: tuple[Any, ...] | list[Any]) -> str | None:
    """A tuple or list (an ``IN`` list, a row of pairs) of strings, None, integers and
    such sequences as the driver writes it: ``(a,b)``, each string escaped with
    backslashes whatever the server's mode (the driver escapes a sequence's items so);
    None when an item is of another type (the driver's own way then)."""
    parts = []
    for item in items:
        kind = type(item)
        if kind is str:
            parts.append("'" + escape_backslashes(item) + "'")
        elif item is None:
            parts.append("NULL")
        elif kind is int:
            parts.append(str(item))
        elif kind is tuple or kind is list:
            text = sequence_literal(item)
            if text is None:
                return None
            parts.append(text)
        else:
            return None
    return "(" + ",".join(parts) + ")"


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
    # Commands sent on this connection (each one round trip): a figure for tests and benchmarks.
    commands: int = 0

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        # Column descriptions this connection has parsed, by their bytes (``results``).
        self.known_columns: dict[tuple[bytes, ...], Any] = {}
        super().__init__(*args, **kwargs)

    async def _execute_command(self, command: int, sql: Any) -> None:
        self.commands += 1
        await super()._execute_command(command, sql)

    async def _read_packet(self, packet_type: Any = MysqlPacket) -> Any:
        """The driver's, in one step when the read buffer holds the whole packet."""
        data = packet_now(self)
        if data is None:
            return await super()._read_packet(packet_type)
        return packet_type(data, self.encoding)

    async def _read_query_result(self, unbuffered: bool = False) -> Any:
        """The driver's, reading a buffered result with ``results.Result``."""
        if unbuffered:
            return await super()._read_query_result(unbuffered=True)
        self._result = None
        result = Result(self)
        await result.read()
        self._result = result
        if result.server_status is not None:
            self.server_status = result.server_status
        return result.affected_rows

    def literal(self, obj: Any) -> str:
        """``obj`` as an SQL literal, the text the driver's own ``literal`` gives (every
        statement's values pass here, through the driver's cursors). Strings, None,
        integers, finite floats and naive datetimes (nearly all of a bulk submit's tens of
        thousands of values) are written here in one step instead of the driver's four
        calls; any other type goes through the driver."""
        kind = type(obj)
        if kind is str:
            if self.server_status & SERVER_STATUS.SERVER_STATUS_NO_BACKSLASH_ESCAPES:
                return "'" + obj.replace("'", "''") + "'"
            return "'" + escape_backslashes(obj) + "'"
        if obj is None:
            return "NULL"
        if kind is int:
            return str(obj)
        if kind is float:
            number = repr(obj)
            if "n" not in number:  # not inf or nan, which the driver refuses
                return number if "e" in number else number + "e0"
        if kind is datetime and obj.tzinfo is None:
            # The driver's form: microseconds only when there are some.
            return "'" + obj.isoformat(" ") + "'"
        if kind is tuple or kind is list:
            text = sequence_literal(obj)
            if text is not None:
                return text
        return self.escape(obj, self.encoders)

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
