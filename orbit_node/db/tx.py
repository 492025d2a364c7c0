"""``Tx``: what a transaction body (or an autocommit statement) runs named statements
through, and ``per_row_statement``, the per-row values of a single-table UPDATE."""

from __future__ import annotations

import collections
import functools
import re
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import attrs
import trio_mysql.cursors
from trio_mysql.constants import SERVER_STATUS

from ..errors import DatabaseError
from .queries import QUERIES
from .results import Rows

# The statements the driver's executemany joins into multi-row INSERTs (any other is run
# once per row, which Tx.execute_rows refuses).
MULTI_ROW_INSERT = trio_mysql.cursors.RE_INSERT_VALUES
# The longest multi-row INSERT ``Tx.insert_rows`` writes as one statement: the driver's
# own bound on one statement of ``executemany`` (``Cursor.max_stmt_length``).
MAX_INSERT_BYTES = trio_mysql.cursors.Cursor.max_stmt_length
# A statement that takes values per row (per_row_statement): ``{column}`` is a per-row
# value, ``key IN %(row_keys)s`` names the rows.
PER_ROW_COLUMN = re.compile(r"\{([a-z_]+)\}")
PER_ROW_KEY = re.compile(r"(\w+)\s+IN\s+%\(row_keys\)s", re.IGNORECASE)
# A named placeholder, as the driver's ``mogrify`` fills it from a mapping.
NAMED_PLACEHOLDER = re.compile(r"%\((\w+)\)s")
# The same, or a ``%%`` (a percent sign of the text, never the start of a placeholder).
PLACEHOLDER_OR_PERCENT = re.compile(r"%%|%\((\w+)\)s")
NO_BACKSLASH_ESCAPES = SERVER_STATUS.SERVER_STATUS_NO_BACKSLASH_ESCAPES
# ``Tx.union_statement``'s texts with their branches' values written in, by query names,
# the connection's escaping mode and the branches' values (a claim's branches are its
# Worker connection's capabilities by priority level): emptied when it holds this many.
MAX_UNIONS = 256
_UNIONS: dict[tuple[Any, ...], str] = {}


@functools.cache
def positional(text: str) -> tuple[str, tuple[str, ...]]:
    """``text`` with each ``%(name)s`` a positional ``%s``, and the names in order: the
    driver's ``mogrify(text, row)`` is then ``form % tuple(literal(row[n]) for n in names)``,
    without escaping the row's other values or building a mapping of them."""
    return NAMED_PLACEHOLDER.sub("%s", text), tuple(NAMED_PLACEHOLDER.findall(text))


@functools.cache
def _per_row_shape(template: str, name: str) -> tuple[str, frozenset[str]]:
    """The key column that names a per-row statement's rows, and its per-row columns."""
    found = PER_ROW_KEY.search(template)
    if found is None:
        raise ValueError(f"query {name!r} does not name its rows with `key IN %(row_keys)s`")
    return found.group(1), frozenset(PER_ROW_COLUMN.findall(template))


def per_row_statement(
    template: str,
    rows: Mapping[Any, Mapping[str, Any]],
    params: Mapping[str, Any],
    literal: Callable[[Any], str],
    *,
    name: str = "<sql>",
) -> tuple[str, dict[str, Any]]:
    """The text and parameters of a statement that takes a value per row.

    ``template`` names its rows ``key IN %(row_keys)s`` (the keys of ``rows``) and each
    per-row value ``{column}``; a row's values lack none but may leave one out (NULL).
    ``{column}`` becomes the value most rows have, and when some rows differ,
    ``CASE key WHEN <row> THEN <its value> ... ELSE <that value> END`` with a branch for each
    of them only. So a single-table UPDATE by primary key takes per-row values without
    joining a table of them (a multi-table UPDATE needs an internal temporary table), and
    the server compares each row with as few branches as the values allow.

    The per-row values are written into the text as ``literal`` writes them (the
    connection's, with ``%`` doubled for the driver's formatting); the parameters left are
    ``params`` and ``row_keys``. One literal per value, instead of a parameter each that
    the driver would name, escape and format again.
    """
    key, columns = _per_row_shape(template, name)
    unknown = {column for values in rows.values() for column in values} - columns
    if unknown:
        raise ValueError(f"query {name!r} has no per-row column {sorted(unknown)!r}")
    keys = list(rows)
    expressions: dict[str, str] = {}
    for column in columns:
        by_row = [rows[k].get(column) for k in keys]
        common = collections.Counter(by_row).most_common(1)[0][0]
        branches = [f"WHEN {literal(keys[i])} THEN {literal(v)}" for i, v in enumerate(by_row) if v != common]
        text = f"CASE {key} {' '.join(branches)} ELSE {literal(common)} END" if branches else literal(common)
        expressions[column] = text.replace("%", "%%")
    sql = PER_ROW_COLUMN.sub(lambda m: expressions[m.group(1)], template)
    return sql, {**params, "row_keys": tuple(keys)}


# The value types whose equal values have one literal (``union_statement``'s kept texts).
_KEPT_TYPES = frozenset({str, int, bool, type(None)})


def _union_key(branches: Sequence[Mapping[str, Any]]) -> tuple[Any, ...] | None:
    """The branches' values with their types, or None when one is not of ``_KEPT_TYPES``."""
    key: list[tuple[str, type, Any] | None] = []
    for values in branches:
        for name, value in values.items():
            kind = type(value)
            if kind not in _KEPT_TYPES:
                return None
            key.append((name, kind, value))
        key.append(None)  # where a branch ends
    return tuple(key)


def _union_template(
    branch: str, tail: str, branches: Sequence[Mapping[str, Any]], literal: Callable[[Any], str]
) -> str:
    """``union_statement``'s text with each branch's values written in by ``literal`` (with
    ``%`` doubled, for the driver's formatting) and the shared parameters left to fill:
    formatted with them, the text the driver writes with all the values as parameters."""
    template = QUERIES[branch]
    sql = f"{' UNION ALL '.join(template.replace('{i}', str(i)) for i in range(len(branches)))} {QUERIES[tail]}"
    written = {
        f"{key}_{i}": literal(value).replace("%", "%%")
        for i, values in enumerate(branches)
        for key, value in values.items()
    }

    def fill(found: re.Match[str]) -> str:
        name = found.group(1)
        return written[name] if name is not None and name in written else found.group(0)

    return PLACEHOLDER_OR_PERCENT.sub(fill, sql)


@attrs.define(eq=False)
class Tx:
    """The handle a transaction body (or a single autocommit statement) works through.

    Round trips are what a transaction costs most, so two kinds of statement travel in
    front of the next one the body runs, in the same packet (the connection allows
    several statements per packet; their results are read and dropped in order, and the
    first that fails raises as its own statement would):

    * ``opening``: the statements that open the transaction (``START TRANSACTION``, an
      isolation level before it). A body that runs nothing opens nothing.
    * writes the body ``defer``s: statements whose answer it does not need (no rows; at
      most a count it knows in advance, ``rows``). ``commit`` sends what is left of them
      together with ``COMMIT``, so a body that ends with writes pays one round trip for
      them and the commit together.

    A body that needs the rows of several reads that do not depend on each other asks for
    them in one packet too (``fetchall_each``).
    """

    _conn: Any
    _leading: list[str] = attrs.field(factory=list)
    # How many of ``_leading`` (from the front) are the opening statements.
    _opening: int = attrs.field(init=False)
    # The rows a deferred write must change, by its index in ``_leading``, with its name.
    _expected: dict[int, tuple[str, int]] = attrs.field(factory=dict, init=False)
    # Something went to the server.
    _sent: bool = attrs.field(default=False, init=False)
    # ``commit_reading`` ended the transaction.
    _committed: bool = attrs.field(default=False, init=False)

    def __attrs_post_init__(self) -> None:
        self._opening = len(self._leading)

    def _text(self, sql: str, params: Any) -> str:
        """The statement as the driver would send it (its values escaped by the driver)."""
        return self._conn.cursor().mogrify(sql, params)

    async def _send(self, cursor: Any, tail: Sequence[str] = ()) -> list[list[dict[str, Any]]]:
        """The leading statements, then ``tail``, in one packet. ``cursor`` is left on the
        last statement's result; the rows of the statements of ``tail`` before it are
        returned, the results of the leading ones read and dropped.

        A deferred write that changed other than the rows it was deferred with raises
        ``DatabaseError`` once the whole packet is read (so the connection stays in step).
        When ``COMMIT`` was in the packet the transaction is committed by then: a body
        defers a count only where the row locks it holds guarantee it.
        """
        statements = [*self._leading, *tail]
        expected, first_tail = self._expected, len(self._leading)
        self._leading, self._opening, self._expected = [], 0, {}
        results: list[list[dict[str, Any]]] = []
        mismatch: str | None = None
        await cursor.execute("; ".join(statements))
        self._sent = True
        for index in range(len(statements)):
            if index:
                await cursor.nextset()
            if index in expected and mismatch is None:
                name, rows = expected[index]
                if cursor.rowcount != rows:
                    mismatch = f"database error: {name} changed {cursor.rowcount} rows, not {rows}"
            if first_tail <= index < len(statements) - 1:
                results.append(list(await cursor.fetchall()))
        if mismatch is not None:
            raise DatabaseError(mismatch)
        return results

    async def _execute(self, cursor: Any, sql: str, params: Any) -> None:
        """``cursor.execute(sql, params)``, with the leading statements in front when due."""
        if self._leading:
            await self._send(cursor, [self._text(sql, params)])
        else:
            await cursor.execute(sql, params)
            self._sent = True

    async def send_leading(self) -> None:
        """Send the leading statements now, alone (before a statement that cannot carry
        them, or at the end of the body)."""
        if self._leading:
            await self._send(self._conn.cursor())

    async def commit(self) -> None:
        """End the transaction: the deferred writes and ``COMMIT`` in one packet. Nothing at
        all when the body ran and deferred nothing."""
        if self._committed:
            return
        if not self._sent and len(self._leading) == self._opening:
            self._leading = []
            return
        self._leading.append("COMMIT")
        await self.send_leading()

    async def commit_reading(self, statement: str) -> list[dict[str, Any]]:
        """End the transaction with one more read: the deferred writes, ``statement`` (from
        ``statement``) and ``COMMIT`` in one packet, and ``statement``'s rows. For a read
        whose answer is only needed once the body's writes are decided: it costs no round
        trip of its own. The body runs nothing after it (``commit`` then does nothing)."""
        cursor = self._conn.cursor(Rows)
        [rows] = await self._send(cursor, [statement, "COMMIT"])
        self._committed = True
        return rows

    def defer(self, name: str, params: Mapping[str, Any] | None = None, *, rows: int | None = None) -> None:
        """Run the named write with the body's next statement (or its commit): for a write
        whose answer the body does not read. With ``rows``, the write must change exactly
        that many rows, or the statement that carries it raises ``DatabaseError`` (``_send``)."""
        self._defer(name, self._text(QUERIES[name], params), rows)

    def defer_per_row(
        self,
        name: str,
        rows: Mapping[str, Mapping[str, Any]],
        params: Mapping[str, Any] | None = None,
        *,
        changed: int | None = None,
    ) -> None:
        """``execute_per_row``, deferred as ``defer`` does (``changed`` is its ``rows``)."""
        if rows:
            statement = per_row_statement(QUERIES[name], rows, params or {}, self._conn.literal, name=name)
            self._defer(name, self._text(*statement), changed)

    def _defer(self, name: str, text: str, rows: int | None) -> None:
        if rows is not None:
            self._expected[len(self._leading)] = (name, rows)
        self._leading.append(text)

    def statement(self, name: str, params: Mapping[str, Any] | None = None) -> str:
        """The named statement with its values, for ``fetchall_each``."""
        return self._text(QUERIES[name], params)

    def union_statement(
        self, branch: str, tail: str, branches: Sequence[Mapping[str, Any]], params: Mapping[str, Any]
    ) -> str:
        """Named query ``branch`` once per item of ``branches`` joined with UNION ALL, then
        ``tail``. ``{i}`` in the branch's text numbers its own parameters: the keys of
        ``branches[i]`` are passed as ``<key>_<i>``; ``params`` are shared by all.

        The text with the branches' values written in is kept (``_UNIONS``): a Worker
        connection's claims read the same branches, one per priority level and capability,
        every time, and only ``params`` are written again. Kept only for branches of
        strings, integers, booleans and None, by value and type: values that are equal
        are written alike only then (``0``, ``0.0`` and ``False`` are equal keys)."""
        key = _union_key(branches)
        if key is None:
            return self._text(_union_template(branch, tail, branches, self._conn.literal), params)
        key = (branch, tail, self._conn.server_status & NO_BACKSLASH_ESCAPES, key)
        template = _UNIONS.get(key)
        if template is None:
            template = _union_template(branch, tail, branches, self._conn.literal)
            if len(_UNIONS) >= MAX_UNIONS:
                _UNIONS.clear()
            _UNIONS[key] = template
        return self._text(template, params)

    async def fetchall_each(self, *statements: str) -> list[list[dict[str, Any]]]:
        """The rows of each of ``statements`` (from ``statement`` or ``union_statement``),
        sent in one packet with the leading statements: reads that do not depend on each
        other cost one round trip."""
        if not statements:
            return []
        cursor = self._conn.cursor(Rows)
        results = await self._send(cursor, statements)
        return [*results, list(await cursor.fetchall())]

    async def _run(self, name: str, params: Mapping[str, Any] | Sequence[Any] | None):
        sql = QUERIES[name]
        cursor = self._conn.cursor(Rows)
        await self._execute(cursor, sql, params)
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
        # The driver may split the rows into several INSERTs: what leads goes out alone.
        await self.send_leading()
        cursor = self._conn.cursor(Rows)
        await cursor.executemany(sql, rows)
        return cursor.rowcount

    async def insert_rows(self, name: str, rows: Sequence[Mapping[str, Any]]) -> None:
        """Write every row with the named ``INSERT ... VALUES (%(a)s, ...)`` (no ``IGNORE``,
        no ``ON DUPLICATE``: each statement must insert all its rows), as multi-row
        statements of at most ``MAX_INSERT_BYTES``. The last is deferred as ``defer`` does
        (it goes with the next statement or the commit); any before it go at once, each
        with what leads. A duplicate key raises at the statement that carries it."""
        if not rows:
            return
        found = MULTI_ROW_INSERT.match(QUERIES[name])
        if not found or found.group(3).strip() or "IGNORE" in found.group(1).upper():
            raise ValueError(f"query {name!r} is not a plain INSERT whose VALUES list holds only placeholders")
        literal = self._conn.literal
        head = found.group(1) % ()
        form, names = positional(found.group(2).rstrip())
        statements: list[list[str]] = [[]]
        size = head_size = len(head.encode())
        for row in rows:
            part = form % tuple([literal(row[name]) for name in names])
            length = (len(part) if part.isascii() else len(part.encode())) + 1
            if statements[-1] and size + length > MAX_INSERT_BYTES:
                statements.append([])
                size = head_size
            statements[-1].append(part)
            size += length
        for parts in statements[:-1]:
            self._defer(name, head + ",".join(parts), len(parts))
            await self.send_leading()
        self._defer(name, head + ",".join(statements[-1]), len(statements[-1]))

    async def execute_per_row(
        self, name: str, rows: Mapping[str, Mapping[str, Any]], params: Mapping[str, Any] | None = None
    ) -> int:
        """Run the named statement ``name`` with values per row (``per_row_statement``): ``rows``
        maps each row's key to its values. Returns the rows affected."""
        if not rows:
            return 0
        sql, values = per_row_statement(QUERIES[name], rows, params or {}, self._conn.literal, name=name)
        cursor = self._conn.cursor(Rows)
        await self._execute(cursor, sql, values)
        return cursor.rowcount

    async def fetchall_union(
        self, branch: str, tail: str, branches: Sequence[Mapping[str, Any]], params: Mapping[str, Any]
    ) -> list[dict[str, Any]]:
        """The rows of ``union_statement(branch, tail, branches, params)``."""
        [rows] = await self.fetchall_each(self.union_statement(branch, tail, branches, params))
        return rows

    async def execute_raw(self, sql: str, params: Any = None) -> int:
        """Run literal SQL. Only the migration runner and test fixtures use this."""
        cursor = self._conn.cursor(Rows)
        await self._execute(cursor, sql, params)
        return cursor.rowcount

    async def fetchall_raw(self, sql: str, params: Any = None) -> list[dict[str, Any]]:
        cursor = self._conn.cursor(Rows)
        await self._execute(cursor, sql, params)
        return list(await cursor.fetchall())

    @property
    def commands(self) -> int:
        """Commands (round trips) sent on this connection so far."""
        return self._conn.commands

    @property
    def thread_id(self) -> int:
        """The server's id of this connection (for ``KILL`` in fault tests)."""
        return self._conn.server_thread_id[0]
