"""``orbit-admin``: operator commands against the database (ORBIT_MYSQL_DSN).

Every command reads and writes the database directly (no node needs to run), has
``--help`` and ``--json``, and fails with one line on stderr and a non-zero status:
1 for an operation that failed (unknown task, database down, ...), 2 for bad usage.

One module per noun (``credentials``, ``applications``, ``queues``, ``tasks``,
``database``, ``audit``, ``live``), each adding its commands to the parser. A command is
an ``Operation`` (``command.py``): it returns its data, which ``--json`` prints as it is
and a renderer shows to people; a live view prints as it goes.
"""

from __future__ import annotations

import argparse

import trio

from orbit_protocol.commands import Parser

from ..common import database_from_env, fail, run_command
from . import applications, audit, credentials, database, live, queues, tasks
from .credentials import bootstrap, create_credential, node_url

__all__ = ["bootstrap", "build_parser", "create_credential", "main", "node_url"]

# The nouns, in the order --help lists them.
NOUNS = (credentials, applications, queues, tasks, database, live, audit)


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(
        prog="orbit-admin",
        description="Operate an Orbit database (ORBIT_MYSQL_DSN). Every command has --help and --json; a failure is "
        "one line on stderr and exit status 1 (2 for bad usage).",
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for noun in NOUNS:
        noun.add_parsers(sub)
    return parser


def main(argv: list[str] | None = None) -> None:
    args = build_parser().parse_args(argv)
    # A command about one application works on the database of its shard (ORBIT_SHARDS).
    db = run_command(lambda: database_from_env(application=getattr(args, "application", None)))

    async def go():
        try:
            await args.operation(db, args)
        finally:
            with trio.CancelScope(shield=True):
                await db.aclose()

    try:
        run_command(lambda: trio.run(go))
    except (SystemExit, KeyboardInterrupt):
        raise
    except BaseException as exc:  # a bug or an unexpected driver error: still one line
        fail(f"unexpected {type(exc).__name__}: {exc}")


if __name__ == "__main__":
    main()
