"""The SQL stays within what MariaDB 10.6+ and MySQL 8.0.16+ both accept.

Only MariaDB is installable where the tests run, so this reads the statements instead
of running them on MySQL: every named statement of orbit_node/db/sql/*.sql, every
migration, and the statements written inline in Python. MariaDB-only syntax fails the
test; what both accept but is engine-sensitive (docs/operations.md, "Engine
compatibility") must be listed there by statement name, so the list stays whole.
"""

from __future__ import annotations

import re

import pytest

from ..helpers import REPO

SQL_FILES = sorted((REPO / "orbit_node" / "db" / "sql").glob("*.sql"))
MIGRATIONS = sorted((REPO / "schema" / "migrations").glob("*.sql"))
# Python that writes SQL inline (the rest goes through the named statements).
INLINE_SQL = [REPO / "orbit_node" / "db" / name for name in ("pool.py", "driver.py", "tx.py", "migrate.py")]

RETURNING = r"\bRETURNING\b"
SEQUENCES = r"\b(CREATE|ALTER|DROP)\s+SEQUENCE\b|\bNEXTVAL\s*\(|\bLASTVAL\s*\(|\bNEXT\s+VALUE\s+FOR\b"
# IF [NOT] EXISTS but in CREATE TABLE IF NOT EXISTS (both accept that one).
IF_EXISTS = r"\bIF\s+(NOT\s+)?EXISTS\b(?<!\bTABLE IF NOT EXISTS)"
LOCK_WAIT = r"\bWAIT\s+\d"
# MariaDB-only syntax (or MySQL only after 8.0.16), each with why it is refused.
MARIADB_ONLY = {
    RETURNING: "INSERT/DELETE ... RETURNING is MariaDB-only",
    SEQUENCES: "sequences are MariaDB-only",
    IF_EXISTS: "IF [NOT] EXISTS on columns, indexes, ... is MariaDB-only",
    r"\bCREATE\s+OR\s+REPLACE\s+(?!VIEW\b)": "CREATE OR REPLACE (but of a view) is MariaDB-only",
    LOCK_WAIT: "FOR UPDATE WAIT n is MariaDB-only (both have NOWAIT)",
    r"\bJSON_(DETAILED|LOOSE|COMPACT|EQUALS|NORMALIZE|EXISTS|QUERY|ARRAY_INTERSECT|OBJECT_FILTER_KEYS"
    r"|OBJECT_TO_ARRAY|KEY_VALUE)\s*\(": "MariaDB-only JSON function",
    r"\bSYSTEM\s+VERSIONING\b|\bFOR\s+SYSTEM_TIME\b|\bPERIOD\s+FOR\b": "system-versioned tables are MariaDB-only",
    r"\bROWS\s+EXAMINED\b": "LIMIT ROWS EXAMINED is MariaDB-only",
    r"\b(INTERSECT|EXCEPT)\b": "INTERSECT/EXCEPT need MySQL 8.0.31",
    r"\bSYS_GUID\s*\(": "SYS_GUID() is MariaDB-only",
}
# Column types MySQL lacks (UUID, INET4/6) or treats differently (JSON: binary in MySQL,
# which rounds integers beyond 64 bits; payloads are text on purpose).
COLUMN_TYPE = re.compile(r"^\s*`?\w+`?\s+(JSON|UUID|INET4|INET6)\b", re.I | re.M)
# Engine-sensitive constructs both accept: every statement using one is named in the docs.
LISTED = (r"\bJSON_TABLE\s*\(", r"\bSKIP\s+LOCKED\b", r"\bVALUES\s*\(\s*\w+\s*\)")


def without_comments(text: str) -> str:
    return re.sub(r"--[^\n]*", "", text)


def named_statements() -> dict[str, str]:
    """name -> statement text (comments removed) of every orbit_node/db/sql file."""
    found: dict[str, str] = {}
    for path in SQL_FILES:
        for chunk in re.split(r"^-- name: ", path.read_text(), flags=re.M)[1:]:
            name, _, body = chunk.partition("\n")
            found[name.strip()] = without_comments(body)
    return found


def migration_statements() -> dict[str, str]:
    return {path.name: without_comments(path.read_text()) for path in MIGRATIONS}


def inline_statements() -> dict[str, str]:
    """SQL in Python string literals: uppercase keywords only, so prose does not match."""
    found = {}
    for path in INLINE_SQL:
        literals = re.findall(r'"((?:SELECT|INSERT|UPDATE|DELETE|SET|CREATE|ALTER|DROP)\b[^"]*)"', path.read_text())
        found[path.name] = "\n".join(literals)
    return found


ALL = {**named_statements(), **migration_statements(), **inline_statements()}


def test_the_reader_sees_every_statement():
    assert len(named_statements()) > 100 and len(MIGRATIONS) >= 15
    assert "claim_reserve" in ALL and "SET time_zone" in ALL["driver.py"]
    assert "CREATE TABLE IF NOT EXISTS orbit_schema_migrations" in ALL["migrate.py"]


@pytest.mark.parametrize("pattern", list(MARIADB_ONLY))
def test_no_mariadb_only_syntax(pattern):
    used = sorted(name for name, sql in ALL.items() if re.search(pattern, sql, re.I))
    assert used == [], f"{MARIADB_ONLY[pattern]}: {used}"


@pytest.mark.parametrize(
    ("sql", "pattern"),
    [
        ("INSERT INTO t (a) VALUES (1) RETURNING a", RETURNING),
        ("ALTER TABLE t ADD COLUMN IF NOT EXISTS c INT", IF_EXISTS),
        ("CREATE INDEX IF NOT EXISTS ix ON t (a)", IF_EXISTS),
        ("DROP INDEX IF EXISTS ix ON t", IF_EXISTS),
        ("SELECT NEXTVAL(s)", SEQUENCES),
        ("SELECT 1 FROM t FOR UPDATE WAIT 5", LOCK_WAIT),
    ],
)
def test_each_refusal_catches_what_it_names(sql, pattern):
    assert re.search(pattern, sql, re.I)


def test_create_table_if_not_exists_is_allowed():
    assert not re.search(IF_EXISTS, "CREATE TABLE IF NOT EXISTS t (a INT)", re.I)


def test_no_column_type_mysql_lacks_or_stores_differently():
    used = {name: COLUMN_TYPE.findall(sql) for name, sql in migration_statements().items()}
    assert {name: types for name, types in used.items() if types} == {}
    assert COLUMN_TYPE.search("  payload JSON NOT NULL,")


def test_check_constraint_names_are_unique_in_the_database():
    """MySQL wants them unique per database (MariaDB: per table)."""
    names = re.findall(r"\bCONSTRAINT\s+`?(\w+)`?\s+CHECK\b", "\n".join(migration_statements().values()), re.I)
    assert len(names) >= 7
    assert len(names) == len(set(names)), sorted(names)


def test_every_engine_sensitive_statement_is_listed_in_the_docs():
    text = (REPO / "docs" / "operations.md").read_text()
    section = text.split("### Engine compatibility", 1)[1].split("\n## ", 1)[0]
    users = sorted(name for name, sql in named_statements().items() if any(re.search(p, sql, re.I) for p in LISTED))
    assert {"claim_lock_tasks", "plan_lock_due", "ops_turns_upsert"} <= set(users)
    assert [name for name in users if f"`{name}`" not in section] == []
