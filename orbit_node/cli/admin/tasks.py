"""``orbit-admin task show|cancel|retry|list`` and ``orbit-admin explain`` (``task export``: ``export.py``).

What an operator does when something goes wrong, on the database directly (no node has
to run), through the same repositories as the HTTP API (``TaskStore.cancel_many``,
``retry_many``, ``search``), so a task is decided the same way whichever way it is
asked. A change that Workers or claims should hear at once (a cancel of a running task,
a retry) is also written as a signal between nodes (``docs/scheduling.md``); a signal
that cannot be written costs latency only.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence
from datetime import datetime
from typing import Any

import attrs

from ...db import Database
from ...domain.errors import InvalidArgument, NotFound, OrbitError
from ...domain.ids import is_hex32
from ...domain.rules import LIST_LIMIT_MAX
from ...domain.task_query import TaskCursor, filter_from_query
from ...domain.wire import rfc3339
from ...store.actions import CANCEL_REQUESTED, RETRIED
from ...store.leases import LeaseStore
from ...store.operations import OperationsStore
from ...store.signals import Signal, SignalStore
from ...store.tasks import TaskStore
from ...store.tenancy import TenancyStore
from ..common import add_json, console, fail, table
from . import export
from .command import command

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
# Reading only: explanations never use the leases or batch size a claim would.
EXPLAIN_LEASE_S = 30.0
EXPLAIN_BATCH = 16


async def resolve_queue(tenancy: TenancyStore, namespace_id: str, name_or_id: str, option: str = "--scope"):
    """A queue of the namespace by name, or by id."""
    try:
        return await tenancy.get_queue_by_name(namespace_id, name_or_id)
    except NotFound:
        if is_hex32(name_or_id):
            return await tenancy.get_queue(namespace_id, name_or_id)
        raise NotFound(f"{option}: no queue named {name_or_id!r} in this namespace", field="queue") from None


async def publish(db: Database, signals: Sequence[Signal]) -> None:
    """Tell the nodes (a latency shortcut: what is not written is found by their next scan)."""
    if signals:
        try:
            await SignalStore(db).publish(ADMIN_ORIGIN, signals)
        except OrbitError:
            pass


def task_id(value: str) -> str:
    if not is_hex32(value):
        fail(f"TASK_ID: {value!r} is not a task id (32 lowercase hex characters)", 2)
    return value


def add_parsers(sub: Any) -> None:
    task = sub.add_parser("task", help="show, list, cancel, retry or export tasks").add_subparsers(
        dest="action", required=True, metavar="ACTION"
    )
    show = task.add_parser("show", help="a task of any namespace with its attempts")
    show.add_argument("task_id", metavar="TASK_ID")
    add_json(show)
    command(show, show_run, show_render)
    _add_task_actions(task)
    export.add_parser(task)
    explain = sub.add_parser("explain", help="why a task is (not) being dispatched right now")
    explain.add_argument("task_id", metavar="TASK_ID")
    add_json(explain)
    command(explain, explain_run, explain_render, lambda data: data["explanation"])


def _add_task_actions(task: Any) -> None:
    """``task cancel``, ``task retry`` and ``task list``."""
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
        command(parser, action_run, action_render, lambda data: data["outcome"])
    tlist = task.add_parser(
        "list",
        help="a namespace's tasks, newest first, by filter",
        description="Tasks of one namespace, newest first by (created_at, task_id). Every filter given must hold; "
        "--state, --priority and --task-id are repeatable and take comma-separated lists. Times are RFC 3339 "
        "(2030-01-02T03:04:05Z); after is inclusive, before exclusive. A queued task shows why it waits. When "
        "more match, the last line gives the --cursor of the next page.",
    )
    tlist.add_argument(
        "--application", help="(default: the only application, when the database holds one; else required)"
    )
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
    command(tlist, list_run, list_render)


async def show_run(db: Database, args: argparse.Namespace) -> dict[str, Any]:
    return await OperationsStore(db).task(task_id(args.task_id))


def show_render(task: dict[str, Any], args: argparse.Namespace) -> None:
    task = dict(task)
    history = task.pop("attempt_history")
    width = max(len(k) for k in task)
    for key, value in task.items():
        if isinstance(value, (dict, list)):
            value = json.dumps(value, ensure_ascii=False, default=str)
        print(f"{key:<{width}}  {'-' if value is None else value}")
    print()
    console().print(
        table(
            f"attempts ({len(history)})",
            ["attempt", "outcome", "node", "connection", "reserved_at", "started_at", "finished_at", "error"],
            [
                [
                    a["attempt"],
                    a["outcome"] or "(live)",
                    (a["owner_node_id"] or "")[:12] or None,
                    a["connection_id"],
                    a["reserved_at"],
                    a["started_at"],
                    a["finished_at"],
                    None if a["error"] is None else json.dumps(a["error"], ensure_ascii=False)[:80],
                ]
                for a in history
            ],
        )
    )
    # The traceback of the last attempt that sent one, whole (the table shows its start).
    for a in reversed(history):
        error = a["error"]
        if isinstance(error, dict) and isinstance(error.get("traceback"), str):
            print(f"\ntraceback of attempt {a['attempt']}:\n{error['traceback'].rstrip()}")
            break


async def action_run(db: Database, args: argparse.Namespace) -> dict[str, Any]:
    """Cancel or retry one task of any namespace."""
    task = await OperationsStore(db).task(task_id(args.task_id))
    store = TaskStore(db)
    act = store.cancel_many if args.action == "cancel" else store.retry_many
    (outcome,) = await act(task["namespace_id"], [args.task_id])
    if outcome.error is not None:
        raise outcome.error
    if outcome.outcome == CANCEL_REQUESTED:
        await publish(db, [Signal.cancel(outcome.task_id)])
    elif outcome.outcome == RETRIED:
        await publish(db, [Signal.tasks(outcome.queue_id)])
    return {"outcome": outcome.as_json(), "where": f"{task['application']}/{task['namespace']}/{task['queue']}"}


def action_render(data: dict[str, Any], args: argparse.Namespace) -> None:
    outcome = data["outcome"]
    messages = {
        "cancelled": "cancelled",
        "cancel_requested": f"cancel requested; it is {outcome['state']}, its Worker is told",
        "retried": f"retried as task {outcome.get('retry_task_id')}",
    }
    unchanged = {
        "cancel": "already cancelled"
        if outcome["state"] == "cancelled"
        else f"cancel already requested ({outcome['state']})",
        "retry": f"retried before as task {outcome.get('retry_task_id')}; nothing changed",
    }
    said = messages.get(outcome["outcome"]) or unchanged[args.action]
    print(f"task {args.task_id} ({data['where']}): {said}")


async def only_application(db: Database) -> str:
    """The database's one application, for a command that names none; a usage error that
    names the choices when there are several (or none)."""
    names = sorted(a["application"] for a in await OperationsStore(db).applications())
    if len(names) == 1:
        return names[0]
    if not names:
        fail("--application: the database holds no application yet", 2)
    shown = ", ".join(names[:10]) + (f" and {len(names) - 10} more" if len(names) > 10 else "")
    fail(f"--application: required, the database holds {len(names)} applications ({shown})", 2)


async def list_run(db: Database, args: argparse.Namespace) -> dict[str, Any]:
    if not 1 <= args.limit <= LIST_LIMIT_MAX:
        fail(f"--limit: must be from 1 to {LIST_LIMIT_MAX}", 2)
    if args.application is None:
        args.application = await only_application(db)
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
    notes = await store.finish_notes(ns["namespace_id"], page.tasks)
    shown = sorted({t.queue_id for t in page.tasks})
    names = {
        q.queue_id: q.name for q in await tenancy.list_queues(ns["namespace_id"], limit=len(shown), queue_ids=shown)
    }
    rows = []
    for task in page.tasks:
        row = {k: rfc3339(v) if isinstance(v, datetime) else v for k, v in attrs.asdict(task).items()}
        note = notes.get(task.task_id, {})
        rows.append(
            {
                **row,
                "queue": names.get(task.queue_id),
                "waiting_reason": waiting.get(task.task_id),
                "error": note.get("error"),
                "retried_by": note.get("retried_by"),
            }
        )
    return {"tasks": rows, "next_cursor": None if page.next_cursor is None else page.next_cursor.encode()}


def retry_note(row: dict[str, Any]) -> str | None:
    """ "retried as <id>" and "retry of <id>", as they apply."""
    notes = []
    if row.get("retried_by"):
        notes.append(f"retried as {row['retried_by']}")
    if row.get("retried_from"):
        notes.append(f"retry of {row['retried_from']}")
    return "; ".join(notes) or None


def list_render(page: dict[str, Any], args: argparse.Namespace) -> None:
    rows = page["tasks"]
    # The text view keeps ids whole on a wide terminal; --json has every field. A queued
    # task says why it waits, a finished one what broke, when, and what retried it.
    console().print(
        table(
            f"tasks of {args.application}/{args.namespace} ({len(rows)}, newest first)",
            ["task_id", "queue", "handler", "state", "priority", "attempts", "created_at", "finished_at"]
            + ["waits for / error", "retry"],
            [
                [
                    r["task_id"],
                    r["queue"],
                    r["handler"],
                    r["state"],
                    r["priority"],
                    f"{r['attempts']}/{r['max_attempts']}",
                    r["created_at"],
                    r["finished_at"],
                    r["waiting_reason"] or r["error"],
                    retry_note(r),
                ]
                for r in rows
            ],
        )
    )
    if page["next_cursor"] is not None:
        print(f"more: --cursor {page['next_cursor']}")


async def explain_run(db: Database, args: argparse.Namespace) -> dict[str, Any]:
    task = await OperationsStore(db).task(task_id(args.task_id))
    store = LeaseStore(db, reservation_lease_s=EXPLAIN_LEASE_S, run_lease_s=EXPLAIN_LEASE_S, batch_size=EXPLAIN_BATCH)
    explanation = await store.explain(task["namespace_id"], args.task_id)
    return {"explanation": explanation, "application": task["application"], "namespace": task["namespace"]}


def explain_render(data: dict[str, Any], args: argparse.Namespace) -> None:
    explanation = data["explanation"]
    print(
        f"task {explanation['task_id']} ({data['application']}/{data['namespace']}/"
        f"{explanation['queue']}): "
        f"{explanation['state']}, priority {explanation['priority']}, attempts "
        f"{explanation['attempts']}/{explanation['max_attempts']}"
    )
    print(
        f"available_at {explanation['available_at']}  dispatch_at {explanation['dispatch_at']}  "
        f"database now {explanation['database_now']}"
    )
    if explanation["capable_connections"] is not None:
        print(f"capable Worker connections: {explanation['capable_connections']}")
    position = explanation.get("position")
    if position:
        capped = "at least " if position["capped"] else ""
        print(
            f"due tasks ahead in dispatch order: {capped}{position['due_tasks_ahead']} "
            f"({position['due_tasks_ahead_same_capability']} with the same handler and versions)"
        )
    if explanation["dispatchable"]:
        print("dispatchable: the next claim of a capable Worker takes it in this order")
    else:
        print("waiting because:")
        for reason in explanation["reasons"]:
            print(f"  {reason['code']}: {reason['message']}")
