"""What the task tables take on the server: rows, InnoDB's data and index bytes, the
``.ibd`` files, the binary log, and the server process's CPU (bench/retention.py).

InnoDB's ``data_length`` and ``index_length`` (``information_schema.TABLES``) count the
16 KiB pages its segments hold, as of the last statistics update: ``table_sizes`` runs
``ANALYZE TABLE`` first. A page freed by a delete stays in its segment and its file (the
``.ibd`` never shrinks): flat figures under churn mean the space is reused.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import attrs

from orbit_node.db import Database

from .accounting import cpu_seconds

# The tables a finished task's rows live in, the ones retention deletes from.
TASK_TABLES = ("tasks", "task_attempts", "idempotency_records")


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


async def analyze(db: Database, tables: Sequence[str] = TASK_TABLES) -> None:
    """``ANALYZE TABLE``: InnoDB's persistent statistics (and the page counts) brought up to date."""
    await db.run(lambda tx: tx.fetchall_raw("ANALYZE TABLE " + ", ".join(f"`{t}`" for t in tables)))


async def table_sizes(db: Database, *, tables: Sequence[str] = TASK_TABLES, count: bool = True) -> dict[str, Any]:
    """Per table: ``rows`` (``COUNT(*)``, or InnoDB's estimate without ``count``),
    ``data_length``, ``index_length``, ``bytes`` (the two together) and ``ibd_bytes`` (the
    file's size on disk, None when the datadir cannot be read), after ``ANALYZE TABLE``."""
    await analyze(db, tables)
    names = ", ".join(f"'{t}'" for t in tables)
    rows = await db.run(
        lambda tx: tx.fetchall_raw(
            "SELECT TABLE_NAME AS name, TABLE_ROWS AS estimate, DATA_LENGTH AS data_length, "
            "INDEX_LENGTH AS index_length, DATABASE() AS db, @@datadir AS datadir "
            f"FROM information_schema.TABLES WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME IN ({names})"
        )
    )
    out: dict[str, Any] = {}
    for r in rows:
        name = _text(r["name"])
        ibd = Path(_text(r["datadir"])) / _text(r["db"]) / f"{name}.ibd"
        try:
            ibd_bytes: int | None = ibd.stat().st_size
        except OSError:
            ibd_bytes = None
        out[name] = {
            "rows": int(r["estimate"] or 0),
            "data_length": int(r["data_length"] or 0),
            "index_length": int(r["index_length"] or 0),
            "bytes": int(r["data_length"] or 0) + int(r["index_length"] or 0),
            "ibd_bytes": ibd_bytes,
        }
    if count:
        counts = await db.run(
            lambda tx: tx.fetchall_raw(
                " UNION ALL ".join(f"SELECT '{t}' AS name, COUNT(*) AS n FROM `{t}`" for t in tables)
            )
        )
        for c in counts:
            out[_text(c["name"])]["rows"] = int(c["n"])
    return out


async def binlog_bytes(db: Database) -> int | None:
    """Bytes of every binary log file of the server (``SHOW BINARY LOGS``); None without binary logging."""
    enabled = await db.run(lambda tx: tx.fetchall_raw("SELECT @@log_bin AS on_"))
    if not int(enabled[0]["on_"]):
        return None
    rows = await db.run(lambda tx: tx.fetchall_raw("SHOW BINARY LOGS"))
    return sum(int(r["File_size"]) for r in rows)


async def server_variable(db: Database, name: str) -> str:
    rows = await db.run(lambda tx: tx.fetchall_raw(f"SELECT @@{name} AS v"))
    return _text(rows[0]["v"])


async def server_pid(db: Database) -> int | None:
    """The ``mariadbd`` process of the server ``db`` talks to, from its pid file (None when
    the file cannot be read: another user's server, another machine)."""
    path = Path(await server_variable(db, "pid_file"))
    if not path.is_absolute():
        path = Path(await server_variable(db, "datadir")) / path
    try:
        pid = int(path.read_text().strip())
    except (OSError, ValueError):
        return None
    return pid if not math.isnan(cpu_seconds(pid)) else None


@attrs.define(eq=False)
class ServerMeter:
    """CPU seconds of the server process and bytes of its binary log over a phase."""

    db: Database
    pid: int | None
    _cpu: float = math.nan
    _binlog: int | None = None

    @classmethod
    async def of(cls, db: Database) -> ServerMeter:
        return cls(db, await server_pid(db))

    async def start(self) -> None:
        self._binlog = await binlog_bytes(self.db)
        self._cpu = cpu_seconds(self.pid) if self.pid is not None else math.nan

    async def stop(self) -> dict[str, Any]:
        """``server_cpu_s`` (NaN when the process is not readable) and ``binlog_bytes`` (None without)."""
        cpu = (cpu_seconds(self.pid) if self.pid is not None else math.nan) - self._cpu
        after = await binlog_bytes(self.db)
        return {
            "server_cpu_s": cpu,
            "binlog_bytes": None if after is None or self._binlog is None else after - self._binlog,
        }
