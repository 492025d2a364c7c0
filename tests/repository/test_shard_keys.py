"""Every named statement on task data names its shard key (docs/scaling.md).

The application is the shard key. A statement that reads or writes tasks, attempts,
resource keys, idempotency records, plans, plan versions or claim turns must bind, in
its WHERE clause or in the row it writes, ``application_id`` or a key that maps to
exactly one application: ``namespace_id`` and ``queue_id`` (a namespace and its queues
belong to one application; the tenancy directory that says which is the unsharded
data), ``task_id`` and ``plan_id`` (a task and a plan belong to one application; a
sharded deployment routes them by a lookup from the id to its application). The few
statements that do not are listed below, each with the reason it may scatter."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from orbit_node.db.queries import load_queries, parse_blocks

SQL_DIR = Path(__file__).resolve().parents[2] / "orbit_node" / "db" / "sql"
SHARDED_TABLES = (
    "tasks",
    "task_attempts",
    "resource_keys",
    "resource_key_holders",
    "idempotency_records",
    "plans",
    "plan_versions",
    "claim_turns",
    "claim_turn_minutes",
    "task_parents",
    "task_waits",
    "dependency_failures",
)
# A parent and its child are tasks of one application (000027): their ids route as task ids do.
ROUTING_KEYS = ("application_id", "namespace_id", "queue_id", "task_id", "plan_id", "parent_task_id", "child_task_id")

# Statements that may run on every shard, and why none of them breaks single-shard writes.
SCATTER_ALLOWED = {
    "recover_lease_candidates": "the sweeper's read-only candidate scan (no locks); it runs on each shard, "
    "and every write follows in one transaction per application (recover_lock names application_id)",
    "recover_deadline_candidates": "the same scan for queued tasks past their deadline",
    "plan_due": "the plan trigger's read-only scan for due plans; each plan then fires in its own "
    "transaction keyed by plan_id (plan_lock_due)",
    "ops_turns_forget_node": "claim turns are a node's counters per application: a stopping node deletes its "
    "rows on every shard, one row per application, nothing else is read or changed",
    "ops_turns_prune": "the same clean-up for nodes that stopped without it",
    "ops_turns_live": "orbit-admin top: an operator's read across all applications",
    "ops_turn_minutes_recent": "the console's fairness history: an operator's read across all applications",
    "ops_turn_minutes_prune": "clean-up of history older than an hour, per shard; it decides nothing",
    "ops_applications": "orbit-admin application list: an operator's read across all applications",
    "dependency_failures_next": "the dependency cascade's read-only scan of its work list; each parent's "
    "children are then cancelled in one transaction keyed by the parent's task id (dependency_failure_lock)",
}

_TABLE = re.compile(r"\b(?:from|join|update|into|delete\s+\w+\s+from)\s+`?(\w+)`?", re.IGNORECASE)
# A routing key bound to a parameter: `key = %(p)s`, `key IN %(p)s`, `key <=> %(p)s`, a tuple
# holding the key IN a parameter, a key
# column whose value is a parameter in an INSERT row, or a key read from a JSON parameter
# (JSON_TABLE(%(values)s ... task_id ... PATH '$.i')).
_BOUND = r"\b{key}\b\s*(?:=|<=>|\bin\b)\s*%\("
_JSON_COLUMN = r"\b{key}\b[^,]*\bpath\s+'\$\.\w+'"
# `(key, other) IN %(pairs)s`
_TUPLE = r"\([^()]*\b{key}\b[^()]*\)\s*in\s*%\("


def tables_of(sql: str) -> set[str]:
    return {name.lower() for name in _TABLE.findall(sql)}


def inserted_keys(sql: str) -> set[str]:
    """Columns of an INSERT whose VALUES (or SELECT) list is made of parameters."""
    match = re.search(r"\binsert\s+(?:ignore\s+)?into\s+\w+\s*\(([^)]*)\)", sql, re.IGNORECASE)
    return {c.strip().strip("`").lower() for c in match.group(1).split(",")} if match else set()


def routing_keys(sql: str) -> set[str]:
    low = sql.lower()
    found = {
        key for key in ROUTING_KEYS if re.search(_BOUND.format(key=key), low) or re.search(_TUPLE.format(key=key), low)
    }
    if "json_table(%(" in low:
        found |= {key for key in ROUTING_KEYS if re.search(_JSON_COLUMN.format(key=key), low)}
    if "%(" in low:
        found |= inserted_keys(low) & set(ROUTING_KEYS)
    return found


def violations(queries: dict[str, str]) -> list[str]:
    bad = []
    for name, sql in sorted(queries.items()):
        touched = tables_of(sql) & set(SHARDED_TABLES)
        if touched and not routing_keys(sql) and name not in SCATTER_ALLOWED:
            bad.append(f"{name} ({', '.join(sorted(touched))})")
    return bad


def test_every_statement_on_task_data_names_its_shard_key():
    assert violations(load_queries(SQL_DIR)) == []


def test_the_allow_list_names_only_statements_that_exist_and_need_it():
    queries = load_queries(SQL_DIR)
    for name in SCATTER_ALLOWED:
        assert name in queries, f"{name}: allowed but no longer defined"
        assert tables_of(queries[name]) & set(SHARDED_TABLES), f"{name}: touches no sharded table"
        assert not routing_keys(queries[name]), f"{name}: names a routing key now; drop it from the allow-list"


@pytest.mark.parametrize(
    ("sql", "ok"),
    [
        ("SELECT * FROM tasks WHERE state = 'queued'", False),
        ("SELECT * FROM tasks WHERE application_id = %(a)s AND state = 'queued'", True),
        ("UPDATE tasks SET state = 'x' WHERE task_id IN %(ids)s", True),
        ("DELETE FROM resource_keys WHERE expires_at < NOW(6)", False),
        ("UPDATE resource_keys SET h = NULL WHERE (namespace_id, resource_key) IN %(keys)s", True),
        ("UPDATE resource_keys SET h = NULL WHERE holder_task_id IN %(ids)s", False),
        ("INSERT INTO idempotency_records (namespace_id, idempotency_key) VALUES (%(n)s, %(k)s)", True),
        ("SELECT t.* FROM queues q JOIN tasks t ON t.queue_id = q.queue_id WHERE q.name = 'x'", False),
        ("SELECT name FROM queues WHERE namespace_id = 'literal'", True),
    ],
)
def test_the_rule_itself(sql, ok):
    assert (violations(parse_blocks(f"-- name: q\n{sql}\n")) == []) is ok
