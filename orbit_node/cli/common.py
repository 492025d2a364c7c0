"""What every command shares: one-line failures and the database from the environment."""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, BinaryIO

from orbit_protocol.commands import fail

from ..config import check_environment
from ..db import Database
from ..domain.dsn import Dsn, parse_shards
from ..domain.errors import ConfigError, OrbitError


def dsns_from_env(env=None) -> list[tuple[str, Dsn]]:
    """ORBIT_MYSQL_DSN's database, then each other database of ORBIT_SHARDS, labelled as a
    node labels its shards ("main", "shard 2", ...)."""
    env = os.environ if env is None else env
    try:
        check_environment(env)
    except ConfigError as exc:
        fail(exc.message, 2)
    dsn_text = env.get("ORBIT_MYSQL_DSN")
    if not dsn_text:
        fail("ORBIT_MYSQL_DSN is not set")
    main = Dsn.parse(dsn_text)
    found = {main.location: main}
    for entry in parse_shards(env.get("ORBIT_SHARDS", "")):
        found.setdefault(entry.dsn.location, entry.dsn)
    return [("main" if n == 1 else f"shard {n}", dsn) for n, dsn in enumerate(found.values(), start=1)]


def database_from_env(env=None, *, application: str | None = None) -> Database:
    """The database of ORBIT_MYSQL_DSN or, for an ``application`` ORBIT_SHARDS names, its shard's."""
    env = os.environ if env is None else env
    main = dsns_from_env(env)[0][1]
    shards = {entry.application: entry.dsn for entry in parse_shards(env.get("ORBIT_SHARDS", ""))}
    return Database(shards.get(application, main) if application is not None else main, size=2)


def run_command(fn: Callable[[], Any]) -> Any:
    """Run a command body, turning every expected failure into one line and exit 1."""
    try:
        return fn()
    except ConfigError as exc:
        fail(exc.message, 2)
    except OrbitError as exc:
        fail(f"{exc.code}: {exc.message}")
    except KeyboardInterrupt:
        fail("interrupted", 130)
    except BrokenPipeError:
        # The reader went away (``| head``): stop quietly, as other Unix tools do.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        raise SystemExit(141) from None


@contextlib.contextmanager
def private_file(path: Path) -> Iterator[BinaryIO]:
    """A file written atomically, with mode 0600 from the first byte: the block writes a
    temporary file beside ``path`` (``.NAME.XXXXXXXX``), which replaces ``path`` once it is
    on disk, when the block ends without an error. An error (or an interrupt) leaves
    ``path`` as it was and removes the temporary file."""
    path = path.resolve()
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        os.fchmod(fd, 0o600)
        with os.fdopen(fd, "wb") as handle:
            yield handle
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def print_json(value: Any) -> None:
    print(json.dumps(value, indent=2, sort_keys=True, default=str))


def add_json(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", action="store_true", help="machine-readable output (one JSON document)")


def console():
    from rich.console import Console

    # Piped output keeps whole rows (scripts should prefer --json).
    return Console() if sys.stdout.isatty() else Console(width=400, color_system=None)


def table(title: str, columns: list[str], rows: list[list[Any]]):
    from rich.table import Table

    shown = Table(title=title, title_justify="left")
    for column in columns:
        shown.add_column(column)
    for row in rows:
        shown.add_row(*("-" if v is None else str(v) for v in row))
    return shown
