"""``orbit-admin audit list``: the audit record of operators' writes through the console
(who, when, what, on which task, queue or filter, how many it changed; ``store/audit.py``)."""

from __future__ import annotations

import argparse
import json
from typing import Any

from ...db import Database
from ...domain.ids import is_hex32
from ...store.audit import MAX_LIMIT, AuditStore
from ...store.operations import OperationsStore
from ..common import add_json, console, fail, table
from .command import command

# Records listed when --limit is not given.
DEFAULT_LIMIT = 50


def add_parsers(sub: Any) -> None:
    audit = sub.add_parser("audit", help="who did what through the console").add_subparsers(
        dest="action", required=True, metavar="ACTION"
    )
    listing = audit.add_parser(
        "list",
        help="audit records, newest first: credential, time, action, task, queue or filter, how many it changed",
        description="Records of the database of ORBIT_MYSQL_DSN or, with --application, of that application's "
        "shard (ORBIT_SHARDS). Page with --before: the last record's id of the page before.",
    )
    listing.add_argument("--application")
    listing.add_argument("--namespace", help="needs --application")
    listing.add_argument("--credential", metavar="CREDENTIAL_ID", help="only the records of this credential")
    listing.add_argument("--limit", type=int, default=DEFAULT_LIMIT, metavar="N", help=f"at most N (1 to {MAX_LIMIT})")
    listing.add_argument("--before", type=int, metavar="AUDIT_ID", help="only records older than this one")
    add_json(listing)
    command(listing, list_run, list_render)


async def list_run(db: Database, args: argparse.Namespace) -> dict[str, Any]:
    if args.namespace and not args.application:
        fail("--namespace needs --application", 2)
    if args.credential is not None and not is_hex32(args.credential):
        fail(f"--credential: {args.credential!r} is not a credential id (32 lowercase hex characters)", 2)
    if not 1 <= args.limit <= MAX_LIMIT:
        fail(f"--limit: expected 1 to {MAX_LIMIT}", 2)
    if args.before is not None and args.before < 1:
        fail("--before: an audit id (a positive integer)", 2)
    ops = OperationsStore(db)
    application_id = namespace_id = None
    if args.namespace:
        namespace_id = (await ops.namespace(args.application, args.namespace))["namespace_id"]
    elif args.application:
        application_id = (await ops.application(args.application))["application_id"]
    page = await AuditStore(db).list(
        application_id=application_id,
        namespace_id=namespace_id,
        credential_id=args.credential,
        before=args.before,
        limit=args.limit,
    )
    return {"records": [r.as_json() for r in page.records], "next_before": page.last}


def list_render(page: dict[str, Any], args: argparse.Namespace) -> None:
    records = page["records"]
    console().print(
        table(
            f"audit ({len(records)} records, newest first)",
            ["id", "at", "application / namespace", "credential", "action", "target", "changed", "outcome"],
            [
                [
                    r["audit_id"],
                    r["recorded_at"],
                    f"{r['application']} / {r['namespace']}",
                    r["credential_id"] + (f" ({r['credential_name']})" if r["credential_name"] else ""),
                    r["action"],
                    target(r),
                    r["changed"],
                    r["outcome"],
                ]
                for r in records
            ],
        )
    )
    if page["next_before"] is not None:
        print(f"older records: --before {page['next_before']}")


def target(record: dict[str, Any]) -> str:
    """What an action named: its task, its queue, its filter."""
    parts = []
    if record["task_id"]:
        parts.append(f"task {record['task_id']}")
    if record["queue_id"]:
        parts.append(f"queue {record['queue'] or record['queue_id']}")
    if record["filter"]:
        parts.append("filter " + json.dumps(record["filter"], sort_keys=True, ensure_ascii=False))
    return ", ".join(parts) or "-"
