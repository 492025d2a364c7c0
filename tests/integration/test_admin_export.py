"""orbit-admin task export, as an operator runs it, against a real MariaDB: exactly the
application's finished tasks before the time (oldest finished_at first, with their
attempts, payloads as stored), pages that meet inside a run of equal times, a file that
appears whole or not at all, the application's shard, every refusal as one line, and a
page that reads about what it returns whatever else the application holds."""

from __future__ import annotations

import json
import os
import secrets
import stat
from datetime import datetime, timedelta

import pytest
import trio

from orbit_node.cli.admin import build_parser
from orbit_node.cli.admin.export import export_run
from orbit_node.db import Database
from orbit_node.domain.errors import Unavailable
from orbit_node.store.export import ExportCursor, ExportStore

from ..database import create_database, drop_database
from ..seed import TaskSpec, bulk_insert_tasks, insert_tasks, tenant
from .test_admin import DOWN_DSN, TEST_TIMEOUT_S, admin, one_line_error
from .test_dispatch_index import session_reads

T = "2026-01-01T00:00:00Z"
BEFORE = datetime(2026, 1, 1)
EXPORT = ["task", "export", "--application", "app", "--finished-before", T]
# A payload and a result as stored, each in a layout and with numbers (1.10, 1e2, a
# 20-digit integer) that parsing and writing again would change.
PAYLOAD = '{"z": 1, "a": [1.10, "\u00e9\\n", {"n": null}], "big": 12345678901234567890, "e": 1e2}'
RESULT = '{"ok":true,"ratio":1.10}'
ERROR = '{"code":"BOOM","message":"it broke"}'
# A line's keys, in their order (docs/operations.md, "Exporting finished tasks").
LINE_KEYS = [
    *("task_id", "application_id", "namespace_id", "queue_id", "handler", "handler_version", "payload_version"),
    *("payload", "state", "priority", "available_at", "dispatch_at", "deadline", "attempts", "max_attempts"),
    *("backoff_initial_ms", "backoff_max_ms", "backoff_multiplier", "resource_key", "cancel_requested"),
    *("owner_node_id", "connection_id", "lease_expires_at", "reserved_at", "started_at", "finished_at"),
    *("result", "error", "plan_id", "plan_version", "retried_from", "created_at", "updated_at"),
    *("queue", "namespace", "environment", "application", "attempt_history", "depends_on"),
]
ATTEMPT_KEYS = [
    *("attempt", "outcome", "owner_node_id", "connection_id", "reserved_at", "started_at", "finished_at", "error")
]


def task_id(n: int) -> str:
    return f"{n:032x}"


async def finish(db: Database, task: str, state: str, finished_at: str, **columns: str | None) -> None:
    """Play the dispatch side: the task finished as ``state`` at ``finished_at`` (UTC)."""
    sets = ", ".join(f"{name} = %s" for name in columns)
    await db.run(
        lambda tx: tx.execute_raw(
            f"UPDATE tasks SET state = %s, finished_at = %s{', ' + sets if sets else ''} WHERE task_id = %s",
            (state, finished_at, *columns.values(), task),
        )
    )


async def add_attempt(db: Database, task: str, attempt: int, outcome: str | None, error: str | None = None) -> None:
    await db.run(
        lambda tx: tx.execute_raw(
            "INSERT INTO task_attempts (task_id, attempt, fencing_token, owner_node_id, connection_id, reserved_at, "
            "started_at, finished_at, outcome, error) VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, %s)",
            (
                task,
                attempt,
                f"{attempt}-{secrets.token_hex(8)}",
                "ab" * 16,
                f"conn-{attempt}",
                f"2025-01-01 00:00:0{attempt}",
                f"2025-01-01 00:00:0{attempt}.5",
                None if outcome is None else f"2025-01-01 00:00:0{attempt}.75",
                outcome,
                error,
            ),
        )
    )


def lines_of(text: str) -> list[dict]:
    assert text == "" or text.endswith("\n")
    return [json.loads(line) for line in text.split("\n")[:-1]]


async def test_exports_the_finished_tasks_before_the_time_oldest_first(dsn, db):
    owner = await tenant(db, queue="q1")
    other = await tenant(db, application="other")
    with trio.fail_after(TEST_TIMEOUT_S):
        ids = await insert_tasks(db, owner, [TaskSpec(task_id=task_id(n), payload=PAYLOAD) for n in range(1, 10)])
        failed, cancelled, expired, succeeded, late, at_t, queued, running, odd = ids
        (elsewhere,) = await insert_tasks(db, other, [TaskSpec(task_id=task_id(99))])
        await finish(db, failed, "failed", "2025-01-01 00:00:10", error=ERROR)
        await add_attempt(db, failed, 1, "retry", "not json")
        await add_attempt(db, failed, 2, "failed", ERROR)
        # Two outcome classes finished at the same time: task id order.
        await finish(db, expired, "expired", "2025-01-02 00:00:00")
        await finish(db, cancelled, "cancelled", "2025-01-02 00:00:00")
        await finish(db, succeeded, "succeeded", "2025-12-31 23:59:59.999999", result=RESULT)
        await add_attempt(db, succeeded, 1, "succeeded")
        await finish(db, late, "succeeded", "2026-02-01 00:00:00")
        await finish(db, at_t, "failed", "2026-01-01 00:00:00")
        await finish(db, elsewhere, "succeeded", "2025-06-01 00:00:00")
        await db.run(lambda tx: tx.execute_raw("UPDATE tasks SET state = 'running' WHERE task_id = %s", (running,)))
        # The state decides, not finished_at: a live task is never exported.
        await finish(db, odd, "queued", "2025-03-01 00:00:00")

        text = await admin(*EXPORT, dsn=dsn)
        assert text.returncode == 0, text.stderr
        lines = lines_of(text.stdout)
        assert [line["task_id"] for line in lines] == [failed, cancelled, expired, succeeded]
        assert text.stderr == "exported 4 tasks of app finished before 2026-01-01T00:00:00.000000Z to stdout\n"

        first = lines[0]
        assert {k: first[k] for k in ("application", "namespace", "queue", "state", "finished_at", "error")} == {
            "application": "app",
            "namespace": "default",
            "queue": "q1",
            "state": "failed",
            "finished_at": "2025-01-01T00:00:10.000000Z",
            "error": {"code": "BOOM", "message": "it broke"},
        }
        assert first["application_id"] == owner.application_id and first["queue_id"] == owner.queue_id
        assert first["attempt_history"] == [
            {
                "attempt": 1,
                "outcome": "retry",
                "owner_node_id": "ab" * 16,
                "connection_id": "conn-1",
                "reserved_at": "2025-01-01T00:00:01.000000Z",
                "started_at": "2025-01-01T00:00:01.500000Z",
                "finished_at": "2025-01-01T00:00:01.750000Z",
                "error": "not json",
            },
            {
                "attempt": 2,
                "outcome": "failed",
                "owner_node_id": "ab" * 16,
                "connection_id": "conn-2",
                "reserved_at": "2025-01-01T00:00:02.000000Z",
                "started_at": "2025-01-01T00:00:02.500000Z",
                "finished_at": "2025-01-01T00:00:02.750000Z",
                "error": {"code": "BOOM", "message": "it broke"},
            },
        ]
        assert [len(line["attempt_history"]) for line in lines] == [2, 0, 0, 1]
        # Keys in the order docs/operations.md lists them.
        assert list(first) == LINE_KEYS and list(first["attempt_history"][0]) == ATTEMPT_KEYS
        assert lines[3]["result"] == {"ok": True, "ratio": 1.1} and lines[1]["result"] is None
        # Every line has what `task show --json` has, and the payload and result as stored.
        shown = json.loads((await admin("task", "show", succeeded, "--json", dsn=dsn)).stdout)
        assert lines[3] == shown
        raw = text.stdout.split("\n")[3]
        assert f'"payload":{PAYLOAD},' in raw and f'"result":{RESULT},' in raw
        assert json.loads(raw)["payload"]["big"] == 12345678901234567890

        since = await admin(*EXPORT, "--finished-after", "2025-01-02T01:00:00+01:00", dsn=dsn)
        assert [line["task_id"] for line in lines_of(since.stdout)] == [cancelled, expired, succeeded]
        assert since.stderr == (
            "exported 3 tasks of app finished at or after 2025-01-02T00:00:00.000000Z and before "
            "2026-01-01T00:00:00.000000Z to stdout\n"
        )
        none = await admin(*EXPORT[:-1], "2025-01-01T00:00:10Z", dsn=dsn)
        assert none.returncode == 0 and none.stdout == "" and none.stderr.startswith("exported 0 tasks of app")


async def test_pages_meet_inside_equal_times_and_lose_nothing(dsn, db):
    owner = await tenant(db)
    with trio.fail_after(TEST_TIMEOUT_S):
        ids = await insert_tasks(db, owner, [TaskSpec(task_id=task_id(n)) for n in range(1, 12)])
        # Both classes interleaved; five tasks of two classes share one time.
        finished = {
            ids[0]: ("succeeded", "2025-05-01 00:00:00"),
            ids[1]: ("failed", "2025-05-01 00:00:00"),
            ids[2]: ("succeeded", "2025-05-01 00:00:00"),
            ids[3]: ("cancelled", "2025-05-01 00:00:00"),
            ids[4]: ("succeeded", "2025-05-01 00:00:00"),
            ids[5]: ("expired", "2025-04-01 00:00:00"),
            ids[6]: ("succeeded", "2025-04-02 00:00:00"),
            ids[7]: ("failed", "2025-06-01 00:00:00.000001"),
            ids[8]: ("succeeded", "2025-06-01 00:00:00"),
            ids[9]: ("failed", "2025-03-01 00:00:00"),
            ids[10]: ("succeeded", "2025-03-01 00:00:00.5"),
        }
        for task, (state, at) in finished.items():
            await finish(db, task, state, at)
        expected = sorted(finished, key=lambda t: (datetime.fromisoformat(finished[t][1]), t))

        store = ExportStore(db)
        whole = await store.page(owner.application_id, finished_before=BEFORE)
        assert [t["task_id"] for t in whole.tasks] == expected and whole.next is None
        for size in (1, 2, 3, 4):
            pages, after = [], None
            while True:
                page = await store.page(owner.application_id, finished_before=BEFORE, after=after, limit=size)
                pages.append([t["task_id"] for t in page.tasks])
                if page.next is None:
                    break
                after = page.next
            assert [t for p in pages for t in p] == expected, size
            assert all(len(p) == size for p in pages[:-1]) and len(pages) == len(expected) // size + 1

        by_cli = await admin(*EXPORT, "--page-size", "2", dsn=dsn)
        assert [line["task_id"] for line in lines_of(by_cli.stdout)] == expected
        assert by_cli.stdout == (await admin(*EXPORT, dsn=dsn)).stdout


async def test_the_output_file_appears_whole_or_not_at_all(dsn, db, tmp_path, monkeypatch):
    owner = await tenant(db)
    with trio.fail_after(TEST_TIMEOUT_S):
        ids = await insert_tasks(db, owner, [TaskSpec(task_id=task_id(n)) for n in range(1, 6)])
        for n, task in enumerate(ids):
            await finish(db, task, "succeeded", f"2025-01-0{n + 1} 00:00:00")
        out = tmp_path / "export.jsonl"
        text = await admin(*EXPORT, "--output", str(out), "--json", dsn=dsn)
        assert text.returncode == 0 and text.stdout == ""
        assert json.loads(text.stderr) == {
            "application": "app",
            "application_id": owner.application_id,
            "finished_after": None,
            "finished_before": "2026-01-01T00:00:00.000000Z",
            "tasks": 5,
            "output": str(out),
        }
        assert out.read_text() == (await admin(*EXPORT, dsn=dsn)).stdout
        assert [line["task_id"] for line in lines_of(out.read_text())] == ids
        assert stat.S_IMODE(out.stat().st_mode) == 0o600 and os.listdir(tmp_path) == ["export.jsonl"]

        # The database goes away after the first page was written: the file is as it was,
        # and nothing half-written is left beside it.
        out.write_text("an earlier export\n")
        real_page = ExportStore.page
        calls = 0

        async def failing_page(self, *args, **kwargs):
            nonlocal calls
            calls += 1
            if calls == 2:
                raise Unavailable("database unavailable: test", cause="unreachable")
            return await real_page(self, *args, **kwargs)

        monkeypatch.setattr(ExportStore, "page", failing_page)
        args = build_parser().parse_args([*EXPORT, "--output", str(out), "--page-size", "2"])
        with pytest.raises(Unavailable):
            await export_run(db, args)
        assert calls == 2
        assert out.read_text() == "an earlier export\n" and os.listdir(tmp_path) == ["export.jsonl"]


async def test_refusals_name_the_option(dsn, db, tmp_path):
    await tenant(db)
    with trio.fail_after(TEST_TIMEOUT_S):
        for args, message, code in (
            (["--application", "nope"], "error: NOT_FOUND: --application: no application named 'nope'", 1),
            (["--finished-before", "yesterday"], "error: INVALID_ARGUMENT: --finished-before: must be an RFC 3339", 2),
            (
                ["--finished-after", T],
                "error: INVALID_ARGUMENT: --finished-before: must be later than --finished-after",
                2,
            ),
            (["--finished-after", "2025-13-01T00:00:00Z"], "error: INVALID_ARGUMENT: --finished-after: must be", 2),
            (["--page-size", "0"], "error: --page-size: must be from 1 to 5000", 2),
            (["--output", str(tmp_path)], f"error: --output: '{tmp_path}' is a directory", 2),
            (
                ["--output", str(tmp_path / "no" / "such.jsonl")],
                f"error: --output: cannot write '{tmp_path / 'no' / 'such.jsonl'}': No such file or directory",
                1,
            ),
        ):
            line = one_line_error(await admin(*EXPORT, *args, dsn=dsn), code)
            assert line.startswith(message), (args, line)
        line = one_line_error(await admin("task", "export", "--application", "app", dsn=dsn), 2)
        assert "the following arguments are required: --finished-before" in line
        # Bad usage is refused before the database is asked.
        line = one_line_error(await admin(*EXPORT, "--finished-after", "soon", env={"ORBIT_MYSQL_DSN": DOWN_DSN}), 2)
        assert line.startswith("error: INVALID_ARGUMENT: --finished-after: must be an RFC 3339")
        line = one_line_error(await admin(*EXPORT, env={"ORBIT_MYSQL_DSN": DOWN_DSN}))
        assert "database unavailable" in line
    assert os.listdir(tmp_path) == []


@pytest.fixture
async def shard_dsn(dsn, migrated_template):
    """A second database at the head migration on the same server: another shard."""
    name = "orbit_t_" + secrets.token_hex(6)
    await create_database(name)
    try:
        await migrated_template.copy_into(name)
        yield dsn.with_database(name)
    finally:
        with trio.CancelScope(shield=True):
            await drop_database(name)


async def test_an_application_on_a_shard_is_exported_from_its_shard(dsn, shard_dsn):
    shard = Database(shard_dsn, size=2)
    try:
        owner = await tenant(shard)
        (done,) = await insert_tasks(shard, owner, [TaskSpec()])
        await finish(shard, done, "succeeded", "2025-01-01 00:00:00")
    finally:
        await shard.aclose()
    with trio.fail_after(TEST_TIMEOUT_S):
        env = {"ORBIT_MYSQL_DSN": dsn.url(), "ORBIT_SHARDS": f"app={shard_dsn.url()}"}
        text = await admin(*EXPORT, env=env)
        assert text.returncode == 0, text.stderr
        assert [line["task_id"] for line in lines_of(text.stdout)] == [done]
        # The main database has no such application.
        line = one_line_error(await admin(*EXPORT, dsn=dsn))
        assert line == "error: NOT_FOUND: --application: no application named 'app'"


MANY = 5000
PAGE = 50
# What a page of PAGE may read: each class's range up to PAGE + 1 index entries, the
# merge's temporary table, and per task its row, queue, namespace and application (the
# attempts: none here). Independent of MANY.
READ_BOUND = 10 * PAGE + 20


async def test_a_page_reads_about_what_it_returns(dsn, db):
    owner = await tenant(db)
    await bulk_insert_tasks(db, owner, MANY, id_prefix="0000eeee")
    # Every task finished, both classes over the same times; a few live tasks besides.
    await db.run(
        lambda tx: tx.execute_raw(
            "UPDATE tasks SET state = IF(CONV(RIGHT(task_id, 4), 16, 10) % 3 = 0, 'failed', 'succeeded'), "
            "finished_at = TIMESTAMP('2025-01-01') + INTERVAL CONV(RIGHT(task_id, 6), 16, 10) SECOND"
        )
    )
    await insert_tasks(db, owner, [TaskSpec() for _ in range(PAGE)])
    await db.run(lambda tx: tx.execute_raw("ANALYZE TABLE tasks"))
    one = Database(dsn, size=1)
    try:
        store = ExportStore(one)
        await one.run(lambda tx: tx.execute_raw("SET SESSION optimizer_switch = 'index_condition_pushdown=off'"))
        # The first page, then one from the middle of the history.
        for after in (None, ExportCursor(datetime(2025, 1, 1) + timedelta(seconds=MANY // 2), "0" * 32)):
            before = await one.run(session_reads)
            baseline = await one.run(session_reads) - before
            page = await store.page(owner.application_id, finished_before=BEFORE, after=after, limit=PAGE)
            reads = await one.run(session_reads) - before - 2 * baseline
            assert len(page.tasks) == PAGE and reads <= READ_BOUND, (after, reads)
            assert after is None or page.tasks[0]["finished_at"] == "2025-01-01T00:41:40.000000Z"
    finally:
        await one.aclose()
