"""``orbit-admin queue list|pause|resume|controls``."""

from __future__ import annotations

import argparse
from typing import Any

from ...db import Database
from ...domain.errors import InvalidArgument
from ...domain.ids import is_hex32
from ...domain.rules import MAX_RUNNING_PER_KEY, MIN_RUNNING_PER_KEY, running_per_key
from ...store.operations import OperationsStore
from ...store.signals import Signal
from ...store.tenancy import Queue, TenancyStore
from ..common import add_json, console, fail, table
from .applications import UNCHANGED, quota_value
from .command import command
from .tasks import publish, resolve_queue


def add_parsers(sub: Any) -> None:
    queue = sub.add_parser(
        "queue", help="list queues with their backlog, pause or resume one, set its controls"
    ).add_subparsers(dest="action", required=True, metavar="ACTION")
    qlist = queue.add_parser("list", help="queues with backlog by state and queued tasks by priority level")
    qlist.add_argument("--application")
    qlist.add_argument("--namespace", help="needs --application")
    add_json(qlist)
    command(qlist, list_run, list_render)
    _add_queue_actions(queue)
    _add_controls(queue)


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
        _add_queue_argument(parser)
        add_json(parser)
        command(parser, pause_run, pause_render)


def _add_queue_argument(parser: Any) -> None:
    parser.add_argument("queue", metavar="QUEUE", help="queue id, or name (with --application)")
    parser.add_argument("--application")
    parser.add_argument("--namespace", default="default", help="with a queue name (default: default)")


def running_per_key_value(text: str) -> int:
    """``--max-running-per-key``: an integer from 1 to 1,000."""
    try:
        return running_per_key(int(text))
    except (ValueError, InvalidArgument):
        raise argparse.ArgumentTypeError(
            f"expected an integer from {MIN_RUNNING_PER_KEY} to {MAX_RUNNING_PER_KEY}, got {text!r}"
        ) from None


def _add_controls(queue: Any) -> None:
    """``queue controls``: what PATCH /v1/queues/{id}/controls changes."""
    controls = queue.add_parser(
        "controls",
        help="set a queue's controls (only the options given change)",
        description="Controls across all nodes: reserved + running tasks of the queue at once (--max-concurrency), "
        "reservations per database-clock second (--max-starts-per-second), both a non-negative integer or 'none' "
        f"(unlimited), and reserved + running tasks of one resource key at once (--max-running-per-key, "
        f"{MIN_RUNNING_PER_KEY}-{MAX_RUNNING_PER_KEY}; 1, the default, is one at a time; tasks of every queue naming "
        "the key count). Lowering a limit below what runs cancels nothing: no new task starts until fewer run. "
        "Without an option the command shows the controls. QUEUE is a queue id, or a name with --application "
        "(and --namespace).",
    )
    _add_queue_argument(controls)
    controls.add_argument("--max-concurrency", type=quota_value, default=UNCHANGED, metavar="N|none")
    controls.add_argument("--max-starts-per-second", type=quota_value, default=UNCHANGED, metavar="N|none")
    controls.add_argument("--max-running-per-key", type=running_per_key_value, default=UNCHANGED, metavar="N")
    add_json(controls)
    command(controls, controls_run, controls_render)


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


async def _queue(db: Database, args: argparse.Namespace) -> tuple[str, Queue]:
    """The queue QUEUE names (by id, or by name with --application) and its namespace."""
    tenancy = TenancyStore(db)
    if args.application is not None:
        ns = await OperationsStore(db).namespace(args.application, args.namespace)
        return ns["namespace_id"], await resolve_queue(tenancy, ns["namespace_id"], args.queue, "QUEUE")
    if is_hex32(args.queue):
        namespace_id = (await OperationsStore(db).queue_of_id(args.queue))["namespace_id"]
        return namespace_id, await tenancy.get_queue(namespace_id, args.queue)
    fail(f"QUEUE: {args.queue!r} is not a queue id; give a queue name with --application", 2)


async def pause_run(db: Database, args: argparse.Namespace) -> dict[str, Any]:
    """Pause or resume one queue (by id, or by name with --application)."""
    tenancy = TenancyStore(db)
    namespace_id, queue = await _queue(db, args)
    paused = args.action == "pause"
    queue = await tenancy.set_queue_paused(namespace_id, queue.queue_id, paused)
    if not paused:
        # Claims that found it paused try again now instead of when their cache entry expires.
        await publish(db, [Signal.tasks(queue.queue_id)])
    return {"queue_id": queue.queue_id, "name": queue.name, "paused": queue.paused}


def pause_render(queue: dict[str, Any], args: argparse.Namespace) -> None:
    print(f"queue {queue['name']} ({queue['queue_id']}) {'paused' if queue['paused'] else 'resumed'}")


async def controls_run(db: Database, args: argparse.Namespace) -> dict[str, Any]:
    """Change the controls named by options (none: show them)."""
    namespace_id, queue = await _queue(db, args)
    changes = {
        name: value
        for name in ("max_concurrency", "max_starts_per_second", "max_running_per_key")
        if (value := getattr(args, name)) is not UNCHANGED
    }
    if changes:
        queue = await TenancyStore(db).update_queue_controls(namespace_id, queue.queue_id, changes)
        # Claims that found a limit reached try again now (a raised limit may admit them).
        await publish(db, [Signal.tasks(queue.queue_id)])
    return {
        "queue_id": queue.queue_id,
        "name": queue.name,
        "changed": sorted(changes),
        "max_concurrency": queue.max_concurrency,
        "max_starts_per_second": queue.max_starts_per_second,
        "max_running_per_key": queue.max_running_per_key,
    }


def controls_render(queue: dict[str, Any], args: argparse.Namespace) -> None:
    def text(value: int | None) -> str:
        return "unlimited" if value is None else str(value)

    print(
        f"queue {queue['name']} ({queue['queue_id']}): max_concurrency={text(queue['max_concurrency'])} "
        f"max_starts_per_second={text(queue['max_starts_per_second'])} "
        f"max_running_per_key={queue['max_running_per_key']}"
    )
