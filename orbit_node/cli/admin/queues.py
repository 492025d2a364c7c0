"""``orbit-admin queue list|pause|resume``."""

from __future__ import annotations

import argparse
from typing import Any

from ...db import Database
from ...domain.ids import is_hex32
from ...store.operations import OperationsStore
from ...store.signals import Signal
from ...store.tenancy import TenancyStore
from ..common import add_json, console, fail, table
from .command import command
from .tasks import publish, resolve_queue


def add_parsers(sub: Any) -> None:
    queue = sub.add_parser("queue", help="list queues with their backlog, pause or resume one").add_subparsers(
        dest="action", required=True, metavar="ACTION"
    )
    qlist = queue.add_parser("list", help="queues with backlog by state and queued tasks by priority level")
    qlist.add_argument("--application")
    qlist.add_argument("--namespace", help="needs --application")
    add_json(qlist)
    command(qlist, list_run, list_render)
    _add_queue_actions(queue)


def _add_queue_actions(queue: Any) -> None:
    """``queue pause`` and ``queue resume``."""
    for action, text in (
        ("pause", "stop reserving the queue's tasks (submissions are still accepted; running tasks go on)"),
        ("resume", "reserve the queue's tasks again"),
    ):
        parser = queue.add_parser(
            action,
            help=text,
            description=f"{text[0].upper()}{text[1:]}. QUEUE is a queue id, or a name with --application "
            "(and --namespace). Idempotent.",
        )
        parser.add_argument("queue", metavar="QUEUE", help="queue id, or name (with --application)")
        parser.add_argument("--application")
        parser.add_argument("--namespace", default="default", help="with a queue name (default: default)")
        add_json(parser)
        command(parser, pause_run, pause_render)


async def list_run(db: Database, args: argparse.Namespace) -> list[dict[str, Any]]:
    if args.namespace and not args.application:
        fail("--namespace needs --application", 2)
    queues = await OperationsStore(db).queue_backlogs(application=args.application, namespace=args.namespace)
    return [q.as_json() for q in queues]


def list_render(queues: list[dict[str, Any]], args: argparse.Namespace) -> None:
    rows = []
    for q in queues:
        backlog = q["backlog"]
        levels = " ".join(f"p{level}:{n}" for level, n in q["queued_by_priority"].items())
        rows.append(
            [
                q["application"],
                q["namespace"],
                q["queue"] + (" (paused)" if q["paused"] else ""),
                q["queue_id"],
                backlog["due"],
                backlog["scheduled"],
                backlog["reserved"],
                backlog["running"],
                levels or "-",
            ]
        )
    console().print(
        table(
            "queues",
            [
                "application",
                "namespace",
                "queue",
                "queue_id",
                "due",
                "later",
                "reserved",
                "running",
                "queued by priority",
            ],
            rows,
        )
    )


async def pause_run(db: Database, args: argparse.Namespace) -> dict[str, Any]:
    """Pause or resume one queue (by id, or by name with --application)."""
    tenancy = TenancyStore(db)
    if args.application is not None:
        ns = await OperationsStore(db).namespace(args.application, args.namespace)
        queue = await resolve_queue(tenancy, ns["namespace_id"], args.queue, "QUEUE")
        namespace_id = ns["namespace_id"]
    elif is_hex32(args.queue):
        namespace_id = (await OperationsStore(db).queue_of_id(args.queue))["namespace_id"]
        queue = await tenancy.get_queue(namespace_id, args.queue)
    else:
        fail(f"QUEUE: {args.queue!r} is not a queue id; give a queue name with --application", 2)
    paused = args.action == "pause"
    queue = await tenancy.set_queue_paused(namespace_id, queue.queue_id, paused)
    if not paused:
        # Claims that found it paused try again now instead of when their cache entry expires.
        await publish(db, [Signal.tasks(queue.queue_id)])
    return {"queue_id": queue.queue_id, "name": queue.name, "paused": queue.paused}


def pause_render(queue: dict[str, Any], args: argparse.Namespace) -> None:
    print(f"queue {queue['name']} ({queue['queue_id']}) {'paused' if queue['paused'] else 'resumed'}")
