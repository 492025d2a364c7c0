"""``orbit-admin database writer``: the servers of ORBIT_MYSQL_DSN and the one every node
writes to (a Galera cluster)."""

from __future__ import annotations

import argparse
from typing import Any

from ...db import Database
from ..common import add_json, console, table
from .command import command


def add_parsers(sub: Any) -> None:
    database = sub.add_parser("database", help="the servers of ORBIT_MYSQL_DSN").add_subparsers(
        dest="action", required=True, metavar="ACTION"
    )
    writer = database.add_parser(
        "writer",
        help="show the servers and the one every node writes to; --host moves the nodes to another",
        description="With several hosts in ORBIT_MYSQL_DSN (a Galera cluster) every node writes to one server: "
        "the first it reaches, the next when that one is lost. It returns to an earlier server only when told: "
        "--host HOST:PORT records that server in the cluster, and every node follows within a second.",
    )
    writer.add_argument("--host", metavar="HOST:PORT", help="record this server (as spelled in ORBIT_MYSQL_DSN)")
    add_json(writer)
    command(writer, writer_run, writer_render)


async def writer_run(db: Database, args: argparse.Namespace) -> dict[str, Any]:
    if args.host is not None:
        await db.set_writer(args.host)
    return {"recorded_writer": await db.recorded_writer(), "servers": await db.servers()}


def writer_render(found: dict[str, Any], args: argparse.Namespace) -> None:
    record = found["recorded_writer"]
    if record is None:
        print("recorded writer: none (each node writes to the first server it reaches)")
    else:
        print(f"recorded writer: {record['host']} (by {record['changed_by']} at {record['changed_at']})")
    console().print(
        table(
            "servers",
            ["host", "answers", "this command writes to", "error"],
            [
                [s["host"], "yes" if s["answers"] else "no", "yes" if s["writer"] else "", s["error"]]
                for s in found["servers"]
            ],
        )
    )
