"""``make run`` writes the development credentials file only for a node that serves it.

The target itself runs (``-o install -o db``: the venv and the database are this test
run's), on a scratch database with ``CREDENTIALS`` pointed at a file of the test. A node
that cannot start leaves an existing file byte for byte; a node that starts gets a file
whose url and token work. ``orbit-admin bootstrap --when-ready`` is what does it, and a
node of another database answering on the url (it refuses the token) does not count.
"""

from __future__ import annotations

import json
import os
import secrets
import signal
import socket
import subprocess

import httpx
import pytest
import trio

from orbit_node.db import Database, migrate

from .conftest import create_database, drop_database, server_dsn
from .helpers import BIN, REPO, bootstrap_args, cli, wait_until

# What an existing credentials file holds before a failed start: it must stay exactly so.
BEFORE = '{"url": "http://127.0.0.1:1", "token": "orb_previous"}\n'


def make_run(dsn, address: str, credentials) -> subprocess.Popen:
    """``make run`` in its own process group (so the test can stop the node it starts)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("ORBIT_")}
    env.update(ORBIT_MYSQL_DSN=dsn.url(), ORBIT_HTTP_ADDR=address, ORBIT_LOG_FORMAT="json")
    return subprocess.Popen(
        ["make", "-s", "-o", "install", "-o", "db", "run", f"CREDENTIALS={credentials}", f"BIN={BIN}"],
        cwd=REPO,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )


def free_address() -> str:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return f"127.0.0.1:{probe.getsockname()[1]}"


async def test_a_node_that_cannot_listen_leaves_the_credentials_file_as_it_was(dsn, tmp_path):
    credentials = tmp_path / "dev.credentials.json"
    credentials.write_text(BEFORE)
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        address = f"127.0.0.1:{taken.getsockname()[1]}"
        run = make_run(dsn, address, credentials)
        # communicate() returns once every writer of the pipes ended: make, the node and
        # the bootstrap waiting beside it.
        out, err = await trio.to_thread.run_sync(lambda: run.communicate(timeout=60))
    assert run.returncode != 0
    assert f"ORBIT_HTTP_ADDR: cannot listen on {address}" in err
    assert f"exited before it served http://{address}; {credentials} left as it was" in err
    assert credentials.read_text() == BEFORE
    assert "credentials written" not in out


async def test_a_node_that_starts_gets_a_credentials_file_that_works(dsn, tmp_path):
    credentials = tmp_path / "dev.credentials.json"
    credentials.write_text(BEFORE)
    address = free_address()
    run = make_run(dsn, address, credentials)
    try:
        await wait_until(lambda: credentials.read_text() != BEFORE, timeout_s=60)
        document = json.loads(credentials.read_text())
        assert document["url"] == f"http://{address}"
        async with httpx.AsyncClient(base_url=document["url"]) as client:
            queues = await client.get("/v1/queues", headers={"Authorization": f"Bearer {document['token']}"})
        assert queues.status_code == 200, queues.text
        assert [q["name"] for q in queues.json()["data"]] == ["initial"]
    finally:
        if run.poll() is None:
            # What Ctrl-C in a terminal does: SIGINT to the whole group. (Not SIGTERM: make
            # sends a SIGTERM it receives on to its children, and the node would take that
            # second signal as "stop at once".)
            os.killpg(run.pid, signal.SIGINT)
        out, err = await trio.to_thread.run_sync(lambda: run.communicate(timeout=60))
    assert '"message": "drain ended' in err  # the node stopped cleanly (make itself died of the signal)
    assert out.count(f"credentials written to {credentials}") == 1


@pytest.fixture
async def other_dsn():
    """A second migrated scratch database: what a node of another deployment serves."""
    name = "orbit_t_" + secrets.token_hex(6)
    await create_database(name)
    db = Database(server_dsn().with_database(name), size=1)
    try:
        await migrate.up(db)
    finally:
        await db.aclose()
    try:
        yield server_dsn().with_database(name)
    finally:
        with trio.CancelScope(shield=True):
            await drop_database(name)


async def bootstrap_when_ready(dsn, credentials, node, *args: str):
    """``orbit-admin bootstrap --when-ready ...`` of a file whose url is ``node``'s."""
    address = node.base_url.removeprefix("http://")
    env = {"ORBIT_HTTP_ADDR": address}
    return await trio.to_thread.run_sync(
        lambda: cli("orbit-admin", *bootstrap_args(credentials), "--when-ready", *args, dsn=dsn, env=env)
    )


async def test_a_node_of_another_database_does_not_count_as_ready(running_node, other_dsn, tmp_path):
    credentials = tmp_path / "dev.credentials.json"
    credentials.write_text(BEFORE)
    boot = await bootstrap_when_ready(other_dsn, credentials, running_node, "1")
    assert boot.returncode == 1
    assert boot.stderr == (f"error: no node served {running_node.base_url} within 1 s; {credentials} left as it was\n")
    assert credentials.read_text() == BEFORE


async def test_when_ready_writes_once_the_node_serves_the_token(running_node, dsn, tmp_path):
    credentials = tmp_path / "dev.credentials.json"
    boot = await bootstrap_when_ready(dsn, credentials, running_node, "30", "--node-pid", str(os.getpid()))
    assert boot.returncode == 0, boot.stderr
    assert json.loads(credentials.read_text())["url"] == running_node.base_url


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--node-pid", "1"], "error: --node-pid: goes with --when-ready\n"),
        (["--when-ready", "0"], "error: --when-ready: must be more than 0 and at most 86400 seconds\n"),
    ],
)
async def test_when_ready_usage_errors(dsn, tmp_path, args, message):
    boot = cli("orbit-admin", *bootstrap_args(tmp_path / "c.json"), *args, dsn=dsn)
    assert (boot.returncode, boot.stderr) == (2, message)
    assert not (tmp_path / "c.json").exists()
