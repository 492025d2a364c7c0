"""Forward-only migrations: ``schema/migrations/NNNNNN_name.sql``.

Applied versions are recorded in ``orbit_schema_migrations`` with the file's
SHA-256. ``up`` is idempotent, serialised across processes by a named lock, and
refuses to touch a database that has a version this code does not know (a newer
node migrated it) or whose applied file changed since.

Expand, then contract: a migration whose file starts with the line
``-- orbit: compatible`` only adds what nodes of the version before it ignore (a column,
a table, an index), so they run unchanged against it; the database records the mark,
and a node accepts a newer schema whose unknown versions are all compatible. A
migration without the mark may change what older nodes read or write, so ``up``
refuses to apply it while a live node whose code does not know it is registered
(docs/operations.md, "Upgrades").
"""

from __future__ import annotations

import hashlib
import re
from pathlib import Path

import attrs

from ..domain.errors import SchemaMismatch
from ..domain.wire import rfc3339
from .pool import Database, Tx

_FILE = re.compile(r"^(\d{6})_([a-z0-9_]+)\.sql$")
_STATEMENT_END = re.compile(r";[ \t]*$", re.MULTILINE)
# How long `up` waits for another migrating process before giving up.
LOCK_WAIT_S = 60
# The first line of a migration that nodes of the version before it run unchanged against.
COMPATIBLE_MARK = "-- orbit: compatible"
# A node whose heartbeat is this recent (and that has not stopped) is live for ``up``.
LIVE_NODE_S = 30


def migrations_dir() -> Path:
    here = Path(__file__).resolve().parent.parent
    for candidate in (here / "_schema" / "migrations", here.parent / "schema" / "migrations"):
        if candidate.is_dir():
            return candidate
    raise FileNotFoundError("schema/migrations not found beside the orbit_node package")


@attrs.frozen
class Migration:
    version: int
    name: str
    sql: str

    @property
    def compatible(self) -> bool:
        """Nodes of the version before this one run unchanged against it (expand only)."""
        return self.sql.lstrip().startswith(COMPATIBLE_MARK)

    @property
    def checksum(self) -> str:
        return hashlib.sha256(self.sql.encode()).hexdigest()

    def statements(self) -> list[str]:
        text = "\n".join(line for line in self.sql.splitlines() if not line.lstrip().startswith("--"))
        return [part.strip() for part in _STATEMENT_END.split(text) if part.strip()]


def load_migrations(directory: Path | None = None) -> list[Migration]:
    directory = directory or migrations_dir()
    found = []
    for path in sorted(directory.iterdir()):
        match = _FILE.match(path.name)
        if match:
            found.append(Migration(int(match.group(1)), match.group(2), path.read_text()))
    versions = [m.version for m in found]
    if versions != list(range(1, len(found) + 1)):
        raise ValueError(f"migrations must be numbered 1..N without gaps, found {versions}")
    return found


MIGRATIONS = load_migrations()
HEAD = MIGRATIONS[-1].version


@attrs.frozen
class VersionStatus:
    version: int
    name: str
    applied_at: str | None
    state: str  # applied | pending | changed | unknown


async def _ensure_table(tx: Tx) -> None:
    await tx.execute_raw(
        "CREATE TABLE IF NOT EXISTS orbit_schema_migrations ("
        " version INT NOT NULL PRIMARY KEY,"
        " name VARCHAR(128) NOT NULL,"
        " checksum CHAR(64) NOT NULL,"
        " applied_at DATETIME(6) NOT NULL DEFAULT CURRENT_TIMESTAMP(6),"
        " compatible TINYINT(1) NOT NULL DEFAULT 0"
        ") ENGINE=InnoDB"
    )
    if not await _has_column(tx, "orbit_schema_migrations", "compatible"):
        # A table made before the mark existed: its versions are all older nodes' own.
        await tx.execute_raw(
            "ALTER TABLE orbit_schema_migrations ADD COLUMN compatible TINYINT(1) NOT NULL DEFAULT 0, ALGORITHM=INSTANT"
        )


async def _has_column(tx: Tx, table: str, column: str) -> bool:
    rows = await tx.fetchall_raw(
        "SELECT COUNT(*) AS n FROM information_schema.columns"
        " WHERE table_schema = DATABASE() AND table_name = %s AND column_name = %s",
        (table, column),
    )
    return bool(rows[0]["n"])


async def newer_are_compatible(db: Database, head: int) -> bool:
    """Every applied version above ``head`` (this code's newest) is marked compatible:
    a node of this code may serve the database."""

    async def body(tx: Tx) -> bool:
        if not await _has_column(tx, "orbit_schema_migrations", "compatible"):
            return False
        rows = await tx.fetchall_raw(
            "SELECT COUNT(*) AS n FROM orbit_schema_migrations WHERE version > %s AND compatible = 0", (head,)
        )
        return not rows[0]["n"]

    return await db.run(body)


async def _older_live_nodes(tx: Tx, version: int) -> list[str]:
    """Live nodes whose code does not know ``version`` (or is older than the column that
    says what it knows)."""
    if not await _has_column(tx, "nodes", "node_id"):
        return []
    known = "schema_head >= %s" if await _has_column(tx, "nodes", "schema_head") else "FALSE"
    rows = await tx.fetchall_raw(
        "SELECT node_id, hostname, http_addr FROM nodes"
        f" WHERE stopped_at IS NULL AND heartbeat_at > NOW(6) - INTERVAL %s SECOND AND NOT COALESCE({known}, FALSE)"
        " ORDER BY node_id",
        (LIVE_NODE_S, version) if known != "FALSE" else (LIVE_NODE_S,),
    )
    return [f"{r['hostname']} ({r['http_addr']}, node {r['node_id']})" for r in rows]


async def _applied(tx: Tx) -> dict[int, dict]:
    rows = await tx.fetchall_raw("SELECT version, name, checksum, applied_at FROM orbit_schema_migrations")
    return {row["version"]: row for row in rows}


async def status(db: Database) -> list[VersionStatus]:
    async def body(tx: Tx):
        await _ensure_table(tx)
        return await _applied(tx)

    applied = await db.run(body)
    known = {m.version: m for m in MIGRATIONS}
    result = []
    for m in MIGRATIONS:
        row = applied.get(m.version)
        if row is None:
            result.append(VersionStatus(m.version, m.name, None, "pending"))
        else:
            state = "applied" if row["checksum"] == m.checksum else "changed"
            result.append(VersionStatus(m.version, m.name, rfc3339(row["applied_at"]), state))
    for version, row in sorted(applied.items()):
        if version not in known:
            result.append(VersionStatus(version, row["name"], rfc3339(row["applied_at"]), "unknown"))
    return result


async def current_version(db: Database) -> int:
    """The highest applied version (0 for an empty database)."""

    async def body(tx: Tx):
        rows = await tx.fetchall_raw(
            "SELECT COUNT(*) AS n FROM information_schema.tables"
            " WHERE table_schema = DATABASE() AND table_name = 'orbit_schema_migrations'"
        )
        if not rows[0]["n"]:
            return 0
        rows = await tx.fetchall_raw("SELECT COALESCE(MAX(version), 0) AS v FROM orbit_schema_migrations")
        return int(rows[0]["v"])

    return await db.run(body)


async def up(db: Database, *, target: int | None = None) -> list[Migration]:
    """Apply pending migrations up to ``target`` (default: head). Returns what was applied."""
    target = HEAD if target is None else target
    if not 0 <= target <= HEAD:
        raise SchemaMismatch(f"target version {target} is not between 0 and {HEAD}", field="target")

    async def body(tx: Tx) -> list[Migration]:
        got = await tx.fetchall_raw("SELECT GET_LOCK('orbit_schema_migrations', %s) AS ok", (LOCK_WAIT_S,))
        if got[0]["ok"] != 1:
            raise SchemaMismatch("another process is migrating this database; try again")
        try:
            await _ensure_table(tx)
            applied = await _applied(tx)
            unknown = sorted(v for v in applied if v > HEAD)
            if unknown:
                raise SchemaMismatch(
                    f"database has version {unknown[-1]:06d}, newer than this code knows ({HEAD:06d}); refusing to migrate"
                )
            done = []
            for m in MIGRATIONS:
                if m.version > target:
                    break
                row = applied.get(m.version)
                if row is not None:
                    if row["checksum"] != m.checksum:
                        raise SchemaMismatch(f"applied migration {m.version:06d}_{m.name} was changed since it ran")
                    continue
                if not m.compatible:
                    older = await _older_live_nodes(tx, m.version)
                    if older:
                        raise SchemaMismatch(
                            f"migration {m.version:06d}_{m.name} changes what older nodes use, and "
                            f"{len(older)} live node(s) do not know it: {', '.join(older)}; "
                            "upgrade or stop them first (docs/operations.md, Upgrades)"
                        )
                for statement in m.statements():
                    await tx.execute_raw(statement)
                await tx.execute_raw(
                    "INSERT INTO orbit_schema_migrations (version, name, checksum, compatible) VALUES (%s, %s, %s, %s)",
                    (m.version, m.name, m.checksum, int(m.compatible)),
                )
                done.append(m)
            return done
        finally:
            await tx.fetchall_raw("SELECT RELEASE_LOCK('orbit_schema_migrations') AS released")

    return await db.run(body)
