"""``orbit-admin task export``: an application's finished tasks as JSON Lines, oldest
``finished_at`` first, for keeping their history before retention deletes them.

Each line is the task as ``task show --json`` has it (its fields, the names of its
application, namespace and queue, and ``attempt_history``), with payload, result and
errors as stored (``wire.verbatim_json``). Pages of tasks (``store/export.py``) are
written as they are read; ``--output`` writes a file atomically (``private_file``), so an
export that fails leaves no file that looks complete. The summary goes to stderr, as one
JSON object with ``--json``: stdout may be the export itself.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, BinaryIO

from ...db import Database
from ...domain.errors import InvalidArgument, NotFound
from ...domain.task_query import filter_from_query
from ...domain.wire import json_line, rfc3339
from ...store.export import EXPORT_PAGE_MAX, EXPORT_PAGE_SIZE, ExportCursor, ExportStore
from ...store.tenancy import TenancyStore
from ..common import fail, private_file
from .command import streaming

# The time options: the filter field each one gives.
TIME_OPTIONS = {"finished_after": "--finished-after", "finished_before": "--finished-before"}


def add_parser(task: Any) -> None:
    """``task export``, added to the ``task`` subcommands."""
    export = task.add_parser(
        "export",
        help="an application's finished tasks as JSON Lines, oldest first",
        description="Write the application's finished tasks (succeeded, failed, cancelled, expired) whose finished_at "
        "is before --finished-before (and not before --finished-after) as JSON Lines, oldest finished_at first: one "
        "task a line, with its attempts, as `task show --json` has it; payload, result and errors as stored. Times "
        "are RFC 3339 (2030-01-02T03:04:05Z). A summary line goes to stderr.",
    )
    export.add_argument("--application", required=True)
    export.add_argument("--finished-before", required=True, metavar="TIME", help="only tasks finished before TIME")
    export.add_argument("--finished-after", metavar="TIME", help="only tasks finished at TIME or later")
    export.add_argument(
        "--output",
        metavar="FILE",
        type=Path,
        help="write FILE (mode 0600) instead of stdout; it appears, whole, only when the export succeeds",
    )
    export.add_argument(
        "--page-size",
        type=int,
        default=EXPORT_PAGE_SIZE,
        metavar="N",
        help=f"tasks read per transaction, and held in memory, at a time: 1 to {EXPORT_PAGE_MAX} "
        f"(default {EXPORT_PAGE_SIZE}); lower it for very large payloads",
    )
    export.add_argument("--json", action="store_true", help="the summary as one JSON object (on stderr)")
    streaming(export, export_run)


async def export_run(db: Database, args: argparse.Namespace) -> None:
    if not 1 <= args.page_size <= EXPORT_PAGE_MAX:
        fail(f"--page-size: must be from 1 to {EXPORT_PAGE_MAX}", 2)
    if args.output is not None and args.output.is_dir():
        fail(f"--output: {str(args.output)!r} is a directory", 2)
    given = {field: [getattr(args, field)] for field in TIME_OPTIONS if getattr(args, field) is not None}
    try:
        found = filter_from_query(given)
    except InvalidArgument as exc:
        message = exc.message
        for field, option in TIME_OPTIONS.items():
            message = message.replace(field, option)
        fail(f"{exc.code}: {message}", 2)
    assert found.finished_before is not None  # a required option
    try:
        application = await TenancyStore(db).application_by_name(args.application)
    except NotFound:
        fail(f"NOT_FOUND: --application: no application named {args.application!r}")
    store = ExportStore(db)
    exported = 0
    with _destination(args.output) as out:
        after: ExportCursor | None = None
        while True:
            page = await store.page(
                application["application_id"],
                finished_before=found.finished_before,
                finished_after=found.finished_after,
                after=after,
                limit=args.page_size,
            )
            if page.tasks:
                out.write("".join(json_line(task) + "\n" for task in page.tasks).encode())
                out.flush()
                exported += len(page.tasks)
            if page.next is None:
                break
            after = page.next
    summary = {
        "application": args.application,
        "application_id": application["application_id"],
        "finished_after": rfc3339(found.finished_after),
        "finished_before": rfc3339(found.finished_before),
        "tasks": exported,
        "output": None if args.output is None else str(args.output.resolve()),
    }
    if args.json:
        print(json.dumps(summary, sort_keys=True), file=sys.stderr)
    else:
        since = "" if found.finished_after is None else f" at or after {summary['finished_after']} and"
        where = summary["output"] or "stdout"
        print(
            f"exported {exported} tasks of {args.application} finished{since} before {summary['finished_before']} "
            f"to {where}",
            file=sys.stderr,
        )


@contextmanager
def _destination(output: Path | None) -> Iterator[BinaryIO]:
    """Where the lines go: stdout, or ``output`` written atomically."""
    if output is None:
        yield sys.stdout.buffer
        return
    try:
        with private_file(output) as handle:
            yield handle
    except OSError as exc:  # the file's directory, its disk: the database's errors are OrbitErrors
        fail(f"--output: cannot write {str(output)!r}: {exc.strerror or exc}")
