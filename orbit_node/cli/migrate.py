"""``orbit-migrate up|status``: forward-only schema migrations."""

from __future__ import annotations

import argparse

import trio

from ..db import migrate
from .common import Parser, database_from_env, print_json, run_command


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(
        prog="orbit-migrate",
        description="Apply or show Orbit schema migrations (ORBIT_MYSQL_DSN). Times are RFC 3339 UTC.",
    )
    sub = parser.add_subparsers(dest="command", required=True)
    up = sub.add_parser("up", help="apply pending migrations (idempotent)")
    up.add_argument("--to", type=int, default=None, metavar="VERSION", help="stop at this version (default: head)")
    status = sub.add_parser("status", help="list every version and whether it is applied")
    status.add_argument("--json", action="store_true", help="machine-readable output")
    return parser


def main(argv: list[str] | None = None) -> None:
    args = build_parser().parse_args(argv)
    db = run_command(database_from_env)

    async def go():
        try:
            if args.command == "up":
                applied = await migrate.up(db, target=args.to)
                for m in applied:
                    print(f"applied {m.version:06d}_{m.name}")
                version = await migrate.current_version(db)
                print(f"schema at {version:06d} (head {migrate.HEAD:06d})" + ("" if applied else "; nothing to do"))
            else:
                rows = await migrate.status(db)
                if args.json:
                    print_json(
                        [
                            {"version": r.version, "name": r.name, "state": r.state, "applied_at": r.applied_at}
                            for r in rows
                        ]
                    )
                else:
                    for r in rows:
                        print(f"{r.version:06d}  {r.state:8}  {r.name}  {r.applied_at or ''}".rstrip())
        finally:
            await db.aclose()

    run_command(lambda: trio.run(go))


if __name__ == "__main__":
    main()
