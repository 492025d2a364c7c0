"""``orbit-migrate up|status``: forward-only schema migrations."""

from __future__ import annotations

import argparse

import trio

from orbit_protocol.commands import Parser

from ..db import Database, migrate
from .common import dsns_from_env, print_json, run_command


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(
        prog="orbit-migrate",
        description="Apply or show Orbit schema migrations (ORBIT_MYSQL_DSN's database and every other "
        "database of ORBIT_SHARDS). Times are RFC 3339 UTC.",
    )
    sub = parser.add_subparsers(dest="command", required=True)
    up = sub.add_parser("up", help="apply pending migrations (idempotent)")
    up.add_argument("--to", type=int, default=None, metavar="VERSION", help="stop at this version (default: head)")
    status = sub.add_parser("status", help="list every version and whether it is applied")
    status.add_argument("--json", action="store_true", help="machine-readable output")
    return parser


def main(argv: list[str] | None = None) -> None:
    args = build_parser().parse_args(argv)
    dsns = run_command(dsns_from_env)
    # With ORBIT_SHARDS every line of a database's answer starts with its label.
    several = len(dsns) > 1

    async def one(label: str, db: Database) -> list[dict]:
        prefix = f"{label}: " if several else ""
        if args.command == "up":
            applied = await migrate.up(db, target=args.to)
            for m in applied:
                print(f"{prefix}applied {m.version:06d}_{m.name}")
            version = await migrate.current_version(db)
            print(f"{prefix}schema at {version:06d} (head {migrate.HEAD:06d})" + ("" if applied else "; nothing to do"))
            return []
        rows = await migrate.status(db)
        if not args.json:
            for r in rows:
                print(f"{prefix}{r.version:06d}  {r.state:8}  {r.name}  {r.applied_at or ''}".rstrip())
        found = [{"version": r.version, "name": r.name, "state": r.state, "applied_at": r.applied_at} for r in rows]
        return [{"database": label, **row} for row in found] if several else found

    async def go():
        rows: list[dict] = []
        # In order, the node's own database first: each one is migrated (or shown) in full.
        for label, dsn in dsns:
            db = Database(dsn, size=2)
            try:
                rows += await one(label, db)
            finally:
                await db.aclose()
        if args.command == "status" and args.json:
            print_json(rows)

    run_command(lambda: trio.run(go))


if __name__ == "__main__":
    main()
