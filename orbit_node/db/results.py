"""Reading a result set in fewer steps than trio-mysql does, with the same values.

Measured on one connection, a result's column descriptions cost the node about 11 us
each and every value about 1.4 us: reading 16 rows of 17 columns took about 4x the CPU
of a ``SELECT 1`` round trip, and a claim cycle reads several such results (candidates,
locks, the transitions' locks). The driver reads every packet through two coroutine
calls and a packet object, parses every column's description again for every result,
and reads every value through the packet object's cursor. Here:

* a packet whose bytes are all in the connection's read buffer is taken from it in one
  step (anything else, or an error packet, goes the driver's way);
* a statement's column descriptions arrive as the same bytes every time it runs, so a
  connection parses them once (keyed by those bytes) and keeps the fields, converters,
  description and dict keys;
* a row's values are read from its bytes in one loop.

Rows, descriptions, warnings and errors are the driver's, value for value
(``tests/integration/test_db_results.py`` compares them).
"""

from __future__ import annotations

from typing import Any

from trio_mysql import converters
from trio_mysql.connections import MAX_PACKET_LEN, TEXT_TYPES, MySQLResult
from trio_mysql.constants import FIELD_TYPE
from trio_mysql.cursors import Cursor, DictCursor
from trio_mysql.protocol import EOFPacketWrapper, FieldDescriptorPacket, MysqlPacket

# Column sets a connection keeps; a connection runs the node's few dozen statements.
MAX_DESCRIPTIONS = 256
# The first byte of a length-coded value: NULL, then 2-, 3- and 8-byte lengths.
NULL_COLUMN = 251
LENGTH_2, LENGTH_3 = 252, 253
# The first byte of an error packet; an EOF packet starts with 0xFE and is shorter than 9.
ERROR_PACKET = 0xFF
EOF_MAX_LENGTH = 9


class Columns:
    """What a connection learned from one set of column descriptions."""

    __slots__ = ("fields", "converters", "description", "names")

    def __init__(self, fields: list[Any], connection: Any) -> None:
        self.fields = fields
        self.description = tuple(field.description() for field in fields)
        # The driver's choices (``MySQLResult._get_descriptions``): how each value's bytes
        # decode, and its converter.
        self.converters: list[tuple[str | None, Any]] = []
        for field in fields:
            field_type = field.type_code
            if not connection.use_unicode:
                encoding = None
            elif field_type == FIELD_TYPE.JSON:
                encoding = connection.encoding
            elif field_type in TEXT_TYPES:
                encoding = None if field.charsetnr == 63 else connection.encoding
            else:
                encoding = "ascii"
            converter = connection.decoders.get(field_type)
            if converter is int and encoding == "ascii":
                encoding = None  # int() reads the digits' bytes as they are
            self.converters.append((encoding, None if converter is converters.through else converter))
        # The keys of a dict row (``DictCursorMixin``): a repeated name gets its table's.
        names: list[str] = []
        for field in fields:
            names.append(field.table_name + "." + field.name if field.name in names else field.name)
        self.names = names


def packet_now(conn: Any) -> bytes | None:
    """The next packet's body when the connection's read buffer holds all of it (and it
    is not one of a split packet's parts), taken from the buffer; else None."""
    rbuf = conn._rbuf
    offset = conn._rbuf_offset
    if len(rbuf) - offset < 4:
        return None
    length = rbuf[offset] | rbuf[offset + 1] << 8 | rbuf[offset + 2] << 16
    start = offset + 4
    if length >= MAX_PACKET_LEN or len(rbuf) - start < length or rbuf[offset + 3] != conn._next_seq_id:
        return None
    if length and rbuf[start] == ERROR_PACKET:
        return None
    data = bytes(rbuf[start : start + length])
    conn._rbuf_offset = start + length
    conn._next_seq_id = (conn._next_seq_id + 1) % 256
    return data


async def read_packet(conn: Any) -> bytes:
    """The next packet's body: from the buffer in one step, else the driver's way (which
    also raises an error packet as the driver's exception)."""
    data = packet_now(conn)
    if data is None:
        data = (await conn._read_packet()).get_all_data()
    return data


def is_eof(data: bytes) -> bool:
    """An EOF packet (a row's first byte 0xFE starts an 8-byte length instead)."""
    return data[:1] == b"\xfe" and len(data) < EOF_MAX_LENGTH


def row_values(data: bytes, columns: list[tuple[str | None, Any]]) -> tuple[Any, ...]:
    """One text-protocol row: each column's length-coded value, decoded and converted."""
    row: list[Any] = []
    append = row.append
    position = 0
    end = len(data)
    for encoding, converter in columns:
        if position >= end:
            break
        first = data[position]
        if first < NULL_COLUMN:
            length = first
            position += 1
        elif first == NULL_COLUMN:
            append(None)
            position += 1
            continue
        elif first == LENGTH_2:
            length = data[position + 1] | data[position + 2] << 8
            position += 3
        elif first == LENGTH_3:
            length = data[position + 1] | data[position + 2] << 8 | data[position + 3] << 16
            position += 4
        else:
            length = int.from_bytes(data[position + 1 : position + 9], "little")
            position += 9
        value: Any = data[position : position + length]
        position += length
        if encoding is not None:
            value = value.decode(encoding)
        if converter is not None:
            value = converter(value)
        append(value)
    return tuple(row)


class Result(MySQLResult):
    """trio-mysql's buffered result, read as the module docstring says."""

    connection: Any
    names: list[str]

    async def _get_descriptions(self) -> None:
        conn = self.connection
        raw = tuple([await read_packet(conn) for _ in range(self.field_count)])
        known: dict[tuple[bytes, ...], Columns] = conn.known_columns
        columns = known.get(raw)
        if columns is None:
            if len(known) >= MAX_DESCRIPTIONS:
                known.clear()
            columns = known[raw] = Columns([FieldDescriptorPacket(data, conn.encoding) for data in raw], conn)
        self.fields = columns.fields
        self.converters = columns.converters
        self.description = columns.description
        self.names = columns.names
        eof = await read_packet(conn)
        if not is_eof(eof):
            raise AssertionError("Protocol error, expecting EOF")

    async def _read_rowdata_packet(self) -> None:
        conn = self.connection
        columns = self.converters
        rows = []
        while True:
            data = await read_packet(conn)
            if is_eof(data):
                eof = EOFPacketWrapper(MysqlPacket(data, conn.encoding))
                self.warning_count = eof.warning_count
                self.has_next = eof.has_next
                self.connection = None
                break
            rows.append(row_values(data, columns))
        self.affected_rows = len(rows)
        self.rows = tuple(rows)


class Rows(DictCursor):
    """The driver's dict cursor, taking a row's keys from ``Result`` (worked out once per
    set of columns) instead of from every field of every result (on a connection that is
    not a ``DriverConnection``, the driver's way)."""

    _rows: Any

    async def _do_get_result(self) -> None:
        if not isinstance(self._get_db()._result, Result):
            await super()._do_get_result()
            return
        await Cursor._do_get_result(self)
        if self.description:
            names = self._result.names
            self._fields = names
            if self._rows:
                self._rows = [dict(zip(names, row, strict=False)) for row in self._rows]
