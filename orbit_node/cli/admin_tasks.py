"""``orbit-admin task cancel|retry|list`` and ``orbit-admin queue pause|resume``.

What an operator does when something goes wrong, on the database directly (no node has
to run), through the same repositories as the HTTP API (``TaskStore.cancel_many``,
``retry_many``, ``search``; ``TenancyStore.set_queue_paused``), so a task is decided the
same way whichever way it is asked. A change that Workers or claims should hear at once
(a cancel of a running task, a retry, a resumed queue) is also written as a signal
between nodes (``docs/scheduling.md``); a signal that cannot be written costs latency only.
``admin.py``'s parser hands these actions over here.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any

import attrs

from ..db import Database
from ..errors import InvalidArgument, NotFound, OrbitError
from ..ids import is_hex32
from ..rules import LIST_LIMIT_MAX
from ..store.actions import CANCEL_REQUESTED, RETRIED
from ..store.operations import OperationsStore
from ..store.signals import Signal, SignalStore
from ..store.tasks import TaskStore
from ..store.tenancy import TenancyStore
from ..task_query import TaskCursor, filter_from_query
from ..wire import rfc3339
from .common import add_json, console, fail, print_json, table

TASK_ACTIONS = ("cancel", "retry", "list")
QUEUE_ACTIONS = ("pause", "resume")
# The origin of the signals orbit-admin writes: no node has this id (node ids are random),
# so every node acts on them.
ADMIN_ORIGIN = "0" * 32
# Tasks orbit-admin task list shows by default.
LIST_DEFAULT = 50
# Filter field -> the option that gives it.
OPTIONS = {
    "queue_id": "--queue",
    "state": "--state",
    "handler": "--handler",
    "priority": "--priority",
    "priority_min": "--priority-min",
    "priority_max": "--priority-max",
    "created_after": "--created-after",
    "created_before": "--created-before",
    "finished_after": "--finished-after",
    "finished_before": "--finished-before",
    "task_ids": "--task-id",
}


async def resolve_queue(tenancy: TenancyStore, namespace_id: str, name_or_id: str, option: str = "--scope"):
    """A queue of the namespace by name, or by id."""
    try:
        return await tenancy.get_queue_by_name(namespace_id, name_or_id)
    except NotFound:
        if is_hex32(name_or_id):
            return await tenancy.get_queue(namespace_id, name_or_id)
        raise NotFound(f"{option}: no queue named {name_or_id!r} in this namespace", field="queue") from None


# -- the parser ------------------------------------------------------------------------


def add_task_actions(task: Any) -> None:
    """``task cancel``, ``task retry`` and ``task list`` (``task`` is admin.py's subparsers)."""
    for action, text in (
        (
            "cancel",
            "cancel a task of any namespace: queued -> cancelled at once; reserved or running -> cancel requested "
            "(the Worker is told); a task that succeeded, failed or expired is refused",
        ),
        (
            "retry",
            "retry a failed, cancelled or expired task of any namespace as a new task (retried_from = TASK_ID); "
            "a task is retried at most once: again, it names the same new task",
        ),
    ):
        parser = task.add_parser(action, help=text.split(":")[0], description=text)
        parser.add_argument("task_id", metavar="TASK_ID")
        add_json(parser)
    tlist = task.add_parser(
        "list",
        help="a namespace's tasks, newest first, by filter",
        description="Tasks of one namespace, newest first by (created_at, task_id). Every filter given must hold; "
        "--state, --priority and --task-id are repeatable and take comma-separated lists. Times are RFC 3339 "
        "(2030-01-02T03:04:05Z); after is inclusive, before exclusive. A queued task shows why it waits. When "
        "more match, the last line gives the --cursor of the next page.",
    )
    tlist.add_argument("--application", required=True)
    tlist.add_argument("--namespace", default="default", help="(default: default)")
    tlist.add_argument("--queue", metavar="QUEUE", help="queue name or id")
    tlist.add_argument("--state", action="append", metavar="STATE[,STATE...]")
    tlist.add_argument("--handler")
    tlist.add_argument("--priority", action="append", metavar="P[,P...]", help="priority levels 0-9")
    tlist.add_argument("--priority-min", metavar="P")
    tlist.add_argument("--priority-max", metavar="P")
    for name in ("created", "finished"):
        tlist.add_argument(f"--{name}-after", metavar="TIME")
        tlist.add_argument(f"--{name}-before", metavar="TIME")
    tlist.add_argument("--task-id", action="append", metavar="ID[,ID...]")
    tlist.add_argument(
        "--limit", type=int, default=LIST_DEFAULT, help=f"at most 1-{LIST_LIMIT_MAX} (default {LIST_DEFAULT})"
    )
    tlist.add_argument("--cursor", help="the cursor the previous page printed")
    add_json(tlist)


def add_queue_actions(queue: Any) -> None:
    """``queue pause`` and ``queue resume`` (``queue`` is admin.py's subparsers)."""
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


# -- the actions -----------------------------------------------------------------------


async def publish(db: Database, signals: Sequence[Signal]) -> None:
    """Tell the nodes (a latency shortcut: what is not written is found by their next scan)."""
    if signals:
        try:
            await SignalStore(db).publish(ADMIN_ORIGIN, signals)
        except OrbitError:
            pass


async def run_task_action(db: Database, args) -> None:
    if args.action == "list":
        await _list(db, args)
        return
    if not is_hex32(args.task_id):
        fail(f"TASK_ID: {args.task_id!r} is not a task id (32 lowercase hex characters)", 2)
    task = await OperationsStore(db).task(args.task_id)
    where = f"{task['application']}/{task['namespace']}/{task['queue']}"
    store = TaskStore(db)
    act = store.cancel_many if args.action == "cancel" else store.retry_many
    (outcome,) = await act(task["namespace_id"], [args.task_id])
    if outcome.error is not None:
        raise outcome.error
    if outcome.outcome == CANCEL_REQUESTED:
        await publish(db, [Signal.cancel(outcome.task_id)])
    elif outcome.outcome == RETRIED:
        await publish(db, [Signal.tasks(outcome.queue_id)])
    if args.json:
        print_json(outcome.as_json())
        return
    messages = {
        "cancelled": "cancelled",
        "cancel_requested": f"cancel requested; it is {outcome.state}, its Worker is told",
        "retried": f"retried as task {outcome.retry_task_id}",
    }
    unchanged = {
        "cancel": "already cancelled"
        if outcome.state == "cancelled"
        else f"cancel already requested ({outcome.state})",
        "retry": f"retried before as task {outcome.retry_task_id}; nothing changed",
    }
    print(f"task {args.task_id} ({where}): {messages.get(outcome.outcome) or unchanged[args.action]}")


async def _list(db: Database, args) -> None:
    if not 1 <= args.limit <= LIST_LIMIT_MAX:
        fail(f"--limit: must be from 1 to {LIST_LIMIT_MAX}", 2)
    ns = await OperationsStore(db).namespace(args.application, args.namespace)
    tenancy = TenancyStore(db)
    params: dict[str, list[str]] = {}
    if args.queue is not None:
        params["queue_id"] = [(await resolve_queue(tenancy, ns["namespace_id"], args.queue, "--queue")).queue_id]
    for field in OPTIONS:
        value = getattr(args, "task_id" if field == "task_ids" else field, None)
        if field != "queue_id" and value is not None:
            params[field] = value if isinstance(value, list) else [value]
    try:
        found = filter_from_query(params)
        after = None if args.cursor is None else TaskCursor.decode(args.cursor)
    except InvalidArgument as exc:
        option = OPTIONS.get(exc.field or "", f"--{exc.field}")
        fail(f"{exc.code}: {option}{exc.message[len(exc.field or '') :]}", 2)
    store = TaskStore(db)
    page = await store.search(ns["namespace_id"], found, after=after, limit=args.limit)
    waiting = await store.waiting_reasons(ns["namespace_id"], page.tasks)
    shown = sorted({t.queue_id for t in page.tasks})
    names = {
        q.queue_id: q.name for q in await tenancy.list_queues(ns["namespace_id"], limit=len(shown), queue_ids=shown)
    }
    rows = []
    for task in page.tasks:
        row = {k: rfc3339(v) if isinstance(v, datetime) else v for k, v in attrs.asdict(task).items()}
        rows.append({**row, "queue": names.get(task.queue_id), "waiting_reason": waiting.get(task.task_id)})
    cursor = None if page.next_cursor is None else page.next_cursor.encode()
    if args.json:
        print_json({"tasks": rows, "next_cursor": cursor})
        return
    # The text view keeps ids whole on a wide terminal; --json has every field.
    console().print(
        table(
            f"tasks of {args.application}/{args.namespace} ({len(rows)}, newest first)",
            ["task_id", "queue", "handler", "state", "priority", "attempts", "created_at", "waits for"],
            [
                [
                    r["task_id"],
                    r["queue"],
                    r["handler"],
                    r["state"],
                    r["priority"],
                    f"{r['attempts']}/{r['max_attempts']}",
                    r["created_at"],
                    r["waiting_reason"],
                ]
                for r in rows
            ],
        )
    )
    if cursor is not None:
        print(f"more: --cursor {cursor}")


async def run_queue_action(db: Database, args) -> None:
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
    if args.json:
        print_json({"queue_id": queue.queue_id, "name": queue.name, "paused": queue.paused})
    else:
        print(f"queue {queue.name} ({queue.queue_id}) {'paused' if queue.paused else 'resumed'}")
