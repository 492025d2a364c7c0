"""orbit-migrate and orbit-admin bootstrap as a user runs them."""

from __future__ import annotations

import json
import os
import stat

from orbit_node.db import Database, migrate
from orbit_node.store.tenancy import TenancyStore

from ..helpers import bootstrap_args, cli


async def test_migrate_cli_up_status_and_idempotence(empty_dsn):
    first = cli("orbit-migrate", "up", dsn=empty_dsn)
    assert first.returncode == 0, first.stderr
    assert "applied 000012_task_priority" in first.stdout and "applied 000013_claim_turns" in first.stdout
    again = cli("orbit-migrate", "up", dsn=empty_dsn)
    assert again.returncode == 0 and "nothing to do" in again.stdout
    status = cli("orbit-migrate", "status", "--json", dsn=empty_dsn)
    versions = json.loads(status.stdout)
    assert [(v["version"], v["state"]) for v in versions] == [(i, "applied") for i in range(1, migrate.HEAD + 1)]


def test_migrate_cli_without_dsn_is_one_line():
    result = cli("orbit-migrate", "up")
    assert result.returncode != 0
    assert result.stderr.strip().count("\n") == 0 and "ORBIT_MYSQL_DSN" in result.stderr


async def test_bootstrap_twice_is_idempotent_and_writes_a_private_usable_file(dsn, tmp_path):
    out = tmp_path / "creds.json"
    args = bootstrap_args(out, application="priority-example")
    env = {"ORBIT_HTTP_ADDR": "127.0.0.1:8080"}
    first = cli("orbit-admin", *args, dsn=dsn, env=env)
    assert first.returncode == 0, first.stderr
    doc1 = json.loads(out.read_text())
    assert stat.S_IMODE(os.stat(out).st_mode) == 0o600
    assert doc1["url"] == "http://127.0.0.1:8080"
    assert (doc1["application"], doc1["namespace"], doc1["environment"]) == ("priority-example", "default", "test")
    assert set(doc1["scopes"]) == {
        "queues:manage",
        "tasks:submit",
        "tasks:read",
        "tasks:cancel",
        "workers:connect",
        "workers:consume",
    }
    second = cli("orbit-admin", *args, dsn=dsn, env=env)
    assert second.returncode == 0, second.stderr
    doc2 = json.loads(out.read_text())
    assert doc2["queues"] == doc1["queues"] and len(doc1["queues"]["initial"]) == 32
    assert stat.S_IMODE(os.stat(out).st_mode) == 0o600

    db = Database(dsn, size=1)
    try:
        principal = await TenancyStore(db).authenticate(doc2["token"])
        assert principal.application == "priority-example" and principal.namespace == "default"
        assert principal.allows("workers:consume", doc2["queues"]["initial"])
        counts = await db.run(
            lambda tx: tx.fetchall_raw(
                "SELECT (SELECT COUNT(*) FROM applications) AS a, (SELECT COUNT(*) FROM namespaces) AS n,"
                " (SELECT COUNT(*) FROM queues) AS q"
            )
        )
        assert counts[0] == {"a": 1, "n": 1, "q": 1}
        # A file whose token was revoked gets a fresh credential on the next bootstrap.
        await TenancyStore(db).revoke_credential(principal.credential_id)
        third = cli("orbit-admin", *args, dsn=dsn, env=env)
        assert third.returncode == 0
        doc3 = json.loads(out.read_text())
        assert doc3["token"] != doc2["token"]
        assert (await TenancyStore(db).authenticate(doc3["token"])).namespace_id == principal.namespace_id
    finally:
        await db.aclose()


async def test_bootstrap_without_worker_access_grants_no_worker_scopes(dsn, tmp_path):
    out = tmp_path / "c.json"
    result = cli(
        "orbit-admin",
        "bootstrap",
        "--application",
        "a",
        "--namespace",
        "n",
        "--environment",
        "prod",
        "--queue",
        "q",
        "--output",
        str(out),
        dsn=dsn,
    )
    assert result.returncode == 0, result.stderr
    assert not {"workers:connect", "workers:consume"} & set(json.loads(out.read_text())["scopes"])
