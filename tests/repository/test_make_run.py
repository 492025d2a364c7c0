"""``make run`` writes the development credentials file only for a node that serves it.

The target itself runs (``-o install -o db``: the venv and the database are this test
run's), on a scratch database with ``CREDENTIALS`` pointed at a file of the test. A node
that cannot start leaves an existing file byte for byte; a node that starts gets a file
whose url and token work. ``orbit-admin bootstrap --when-ready`` is what does it, and a
node of another database answering on the url (it refuses the token) does not count.
The bootstrap, once done, leaves no zombie behind; Ctrl-C on ``make run`` with the
private MariaDB leaves that database running and says how to stop it.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import tempfile
from pathlib import Path

import httpx
import pytest
import trio

from orbit_node.db import Database, migrate

from ..database import create_database, drop_database, server_dsn
from ..helpers import BIN, REPO, bootstrap_args, cli, wait_until

# What an existing credentials file holds before a failed start: it must stay exactly so.
BEFORE = '{"url": "http://127.0.0.1:1", "token": "orb_previous"}\n'


def make_run(dsn, address: str, credentials, *, cwd: Path = REPO, env: dict | None = None) -> subprocess.Popen:
    """``make run`` in its own process group (so the test can stop the node it starts);
    ``dsn`` None: the private MariaDB of ``cwd``'s scripts/devdb.sh."""
    full_env = {k: v for k, v in os.environ.items() if not k.startswith("ORBIT_")}
    full_env.update(ORBIT_HTTP_ADDR=address, ORBIT_LOG_FORMAT="json", **(env or {}))
    if dsn is not None:
        full_env["ORBIT_MYSQL_DSN"] = dsn.url()
    return subprocess.Popen(
        ["make", "-s", "-f", str(REPO / "Makefile"), "-o", "install", "-o", "db", "run"]
        + [f"CREDENTIALS={credentials}", f"BIN={BIN}"],
        cwd=cwd,
        env=full_env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )


def stop_as_ctrl_c_does(run: subprocess.Popen) -> None:
    # What Ctrl-C in a terminal does: SIGINT to the whole group. (Not SIGTERM: make sends
    # a SIGTERM it receives on to its children, and the node would take that second
    # signal as "stop at once".)
    if run.poll() is None:
        os.killpg(run.pid, signal.SIGINT)


def group_processes(pgid: int) -> list[tuple[int, int, str, str]]:
    """(pid, parent pid, state, command name) of each process of group ``pgid``, from /proc."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue  # ended meanwhile
        name = stat[stat.index("(") + 1 : stat.rindex(")")]
        state, ppid, group = stat[stat.rindex(")") + 2 :].split()[:3]
        if int(group) == pgid:
            found.append((int(entry.name), int(ppid), state, name))
    return found


async def bootstrap_ended(run: subprocess.Popen) -> None:
    """Wait until ``make run``'s bootstrap has exited (it may be left a zombie)."""
    await wait_until(
        lambda: not [p for p in group_processes(run.pid) if p[3] == "orbit-admin" and p[2] != "Z"], timeout_s=30
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
        # The bootstrap is done and was reaped: no zombie under the node (or anywhere in
        # make's process group) while the node serves.
        await bootstrap_ended(run)
        processes = group_processes(run.pid)
        (node,) = [p[0] for p in processes if p[3] == "orbit"]
        assert not [p for p in processes if p[2] == "Z"], processes
        assert not [p for p in group_processes(run.pid) if p[1] == node], processes
    finally:
        stop_as_ctrl_c_does(run)
        out, err = await trio.to_thread.run_sync(lambda: run.communicate(timeout=60))
    assert '"message": "drain ended' in err  # the node stopped cleanly
    assert out.count(f"credentials written to {credentials}") == 1
    assert "private MariaDB" not in err  # ORBIT_MYSQL_DSN named the database: not make run's to mention


@pytest.mark.time_cap(240)
async def test_ctrl_c_leaves_the_private_database_running_and_says_how_to_stop_it():
    """Without ORBIT_MYSQL_DSN, ``make run`` uses the private MariaDB of scripts/devdb.sh:
    here one of a scratch checkout (its scripts, its var/), on a port of its own. Ctrl-C
    stops the node; the database keeps running, and make run's last line says so and how
    to stop it."""
    checkout = Path(tempfile.mkdtemp(prefix="orbit-run-"))  # short: the server's socket path lives under it
    (checkout / "scripts").mkdir()
    for script in ("devdb.sh", "run.sh"):
        (checkout / "scripts" / script).symlink_to(REPO / "scripts" / script)
    devdb = str(checkout / "scripts" / "devdb.sh")
    port = int(free_address().rsplit(":", 1)[1])
    env = {**os.environ, "ORBIT_DEV_DB_PORT": str(port)}

    def devdb_run(command: str) -> subprocess.CompletedProcess:
        return subprocess.run([devdb, command], env=env, capture_output=True, text=True, timeout=180)

    try:
        started = await trio.to_thread.run_sync(lambda: devdb_run("start"))
        assert started.returncode == 0, started.stderr
        dsn = started.stdout.strip()
        credentials = checkout / "var" / "dev.credentials.json"
        run = make_run(None, free_address(), credentials, cwd=checkout, env={"ORBIT_DEV_DB_PORT": str(port)})
        try:
            await wait_until(credentials.exists, timeout_s=60)
        finally:
            stop_as_ctrl_c_does(run)
            out, err = await trio.to_thread.run_sync(lambda: run.communicate(timeout=60))
        assert '"message": "drain ended' in err
        assert (
            f"make run: the node has stopped; the private MariaDB (scripts/devdb.sh) is still running at {dsn}: "
            "stop it with scripts/devdb.sh stop (its data stays in var/mariadb), "
            "or make clean (which also deletes var/ and .venv/)\n"
        ) in err
        assert (await trio.to_thread.run_sync(lambda: devdb_run("status"))).returncode == 0  # as it says
    finally:
        await trio.to_thread.run_sync(lambda: devdb_run("stop"))
        shutil.rmtree(checkout, ignore_errors=True)


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
