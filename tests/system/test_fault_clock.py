"""Scenario 7: a node whose own clock is minutes off decides nothing with it.

The node runs as a separate process under libfaketime (``LD_PRELOAD``), so every clock
it can read (``time.time``, ``datetime.now``, the monotonic clock trio paces itself
with) is skewed by 15 minutes, ahead or behind. Leases, due times and recovery must
still follow the database clock only: no premature recovery, no extended lease.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from datetime import UTC, datetime
from pathlib import Path

import httpx
import pytest
import trio

from harness.nodeproc import NodeProcess

from .. import seed
from ..checks import rows, tenant_with_token, wait_for_state
from ..wsclient import raw_worker

LIBFAKETIME = Path("/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1")
SKEW_S = 15 * 60
RESERVATION_LEASE_S = 30
RUN_LEASE_S = 60


@pytest.fixture(scope="session")
def libfaketime() -> Path:
    """Debian's libfaketime, installed with apt when it is missing (as root, like make test's MariaDB)."""
    if not LIBFAKETIME.exists():
        apt = shutil.which("apt-get")
        assert apt and os.geteuid() == 0, (
            f"{LIBFAKETIME} is missing and cannot be installed: apt-get install libfaketime"
        )
        env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
        install = [apt, "install", "-y", "-qq", "libfaketime"]
        if subprocess.run(install, env=env, capture_output=True).returncode != 0:
            subprocess.run([apt, "update", "-qq"], env=env, capture_output=True, check=True)
            subprocess.run(install, env=env, capture_output=True, check=True)
    assert LIBFAKETIME.exists()
    return LIBFAKETIME


async def seconds_from_now(db, task_id: str) -> float:
    """``lease_expires_at`` of a task minus the database's NOW(6), in seconds."""
    found = await rows(
        db, "SELECT TIMESTAMPDIFF(MICROSECOND, NOW(6), lease_expires_at) AS us FROM tasks WHERE task_id = %s", task_id
    )
    return found[0]["us"] / 1e6


def first_log_time(node: NodeProcess) -> datetime:
    for line in node.log_text().splitlines():
        try:
            entry = json.loads(line)
        except ValueError:
            continue
        if "ts" in entry:
            return datetime.strptime(entry["ts"], "%Y-%m-%dT%H:%M:%S.%fZ").replace(tzinfo=UTC)
    raise AssertionError(f"no log line with a time: {node.log_text()[-1000:]}")


@pytest.mark.parametrize("skew_s", [SKEW_S, -SKEW_S], ids=["ahead", "behind"])
async def test_a_node_with_a_skewed_clock_neither_recovers_early_nor_extends_a_lease(
    dsn, db, tmp_path, libfaketime, skew_s
):
    owner, token = await tenant_with_token(db)
    probe, reserved, running = await seed.insert_tasks(db, owner, [seed.TaskSpec() for _ in range(3)])
    future = await seed.insert_task(db, owner, available_in_s=60)
    store = seed.lease_store(db, reservation_lease_s=RESERVATION_LEASE_S, run_lease_s=RUN_LEASE_S)
    claimed = {r.task_id: r for r in await store.claim(seed.claim_request(owner, limit=3))}
    await store.start(running, claimed[running].fencing_token)
    # Only the probe's reservation has run out (on the database clock); the others are valid
    # for 30 and 60 s: a node believing its own clock would see them expired (or not) wrongly.
    await seed.expire_lease(db, probe)
    before = {
        r["task_id"]: r for r in await rows(db, "SELECT task_id, state, fencing_token, lease_expires_at FROM tasks")
    }
    node = NodeProcess(
        dsn,
        tmp_path / "node.log",
        env={
            "ORBIT_RESERVATION_LEASE_S": str(RESERVATION_LEASE_S),
            "ORBIT_RUN_LEASE_S": str(RUN_LEASE_S),
            "ORBIT_LOG_FORMAT": "json",
        },
        process_env={"LD_PRELOAD": str(libfaketime), "FAKETIME": f"{skew_s:+d}s", "FAKETIME_NO_CACHE": "1"},
    )
    await node.start()
    try:
        # The process really lives at the skewed time.
        observed = (first_log_time(node) - datetime.now(UTC)).total_seconds()
        assert abs(observed - skew_s) < 60, observed
        with trio.fail_after(30):
            # The skewed node's sweeper requeues the probe; that same pass left the others alone.
            await wait_for_state(db, probe, "queued")
            after = {
                r["task_id"]: r
                for r in await rows(db, "SELECT task_id, state, fencing_token, lease_expires_at FROM tasks")
            }
            for task_id in (reserved, running):
                assert after[task_id] == before[task_id]
            assert after[future]["state"] == "queued"
            async with raw_worker(node.base_url, token) as w:
                await w.hello([owner.queue_id], capacity=3)
                dispatch = (await w.recv_type("dispatch"))["tasks"]
                # Only the probe is dispatched: the task due in 60 s is not due, the others are owned.
                assert [t["task_id"] for t in dispatch] == [probe]
                # Leases the skewed node writes are database time plus the lease, to the second.
                assert RESERVATION_LEASE_S - 10 < await seconds_from_now(db, probe) <= RESERVATION_LEASE_S
                ref = {"task_id": probe, "token": dispatch[0]["token"]}
                assert (await w.request("start", [ref], "s"))["results"][0]["ok"]
                assert RUN_LEASE_S - 10 < await seconds_from_now(db, probe) <= RUN_LEASE_S
                ack = await w.request("renew", [ref], "r")
                assert ack["results"][0]["ok"]
                assert RUN_LEASE_S - 10 < await seconds_from_now(db, probe) <= RUN_LEASE_S
                stored = (await rows(db, "SELECT lease_expires_at FROM tasks WHERE task_id = %s", probe))[0]
                assert (
                    ack["results"][0]["lease_expires_at"]
                    == stored["lease_expires_at"].isoformat(timespec="microseconds") + "Z"
                )
            # A delay given to the skewed node is added to the database clock.
            async with httpx.AsyncClient(base_url=node.base_url, headers={"Authorization": f"Bearer {token}"}) as http:
                response = await http.post(
                    "/v1/tasks",
                    headers={"Idempotency-Key": "skewed-delay"},
                    json={
                        "queue_id": owner.queue_id,
                        "handler": "h",
                        "handler_version": "v1",
                        "payload_version": "v1",
                        "payload": None,
                        "delay_s": 120,
                    },
                )
                assert response.status_code == 201, response.text
                created = response.json()["data"]["task_id"]
            due = await rows(
                db,
                "SELECT TIMESTAMPDIFF(MICROSECOND, NOW(6), available_at) AS us FROM tasks WHERE task_id = %s",
                created,
            )
            assert 110 < due[0]["us"] / 1e6 <= 120
    finally:
        await node.aclose()
    # The reservation and the running attempt of the other owner were never touched.
    final = {
        r["task_id"]: r for r in await rows(db, "SELECT task_id, state, fencing_token, lease_expires_at FROM tasks")
    }
    for task_id in (reserved, running):
        assert final[task_id] == before[task_id]
