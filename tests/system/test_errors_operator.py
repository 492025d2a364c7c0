"""Failures an operator must fix: what tenants are told, what /readyz says, what is logged.

A database that cannot serve (down, refusing the user, missing, not migrated) is 503 with
a stable code, a generic message and ``Retry-After`` for tenants; the cause goes to the
log and, as a class, to ``/readyz``, which logs changes only. An address the node cannot
listen on is a one-line start-up error with exit status 2.
"""

from __future__ import annotations

import json
import logging
import os
import secrets
import socket
import subprocess

import attrs
import httpx
import pytest
import trio
from trio_websocket import ConnectionRejected, open_websocket_url

from harness.nodeproc import free_port
from orbit_node.config import NodeConfig
from orbit_node.db import Database, migrate
from orbit_node.domain.dsn import Dsn

from ..database import server_dsn
from ..helpers import BIN
from ..nodeutil import assert_error, make_tenant, run_node
from ..wsclient import ws_url

# A well-formed credential (orb_ + 32 hex id + 64 hex secret) that no database holds.
SOME_TOKEN = "orb_" + "0" * 32 + "1" * 64
SUBMIT_HEADERS = {"Authorization": f"Bearer {SOME_TOKEN}", "Idempotency-Key": "k1"}


def node_config(dsn: Dsn) -> NodeConfig:
    return NodeConfig(dsn=dsn, http_host="127.0.0.1", http_port=0, shutdown_grace_s=1.0)


def readiness_lines(caplog, level: int) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "orbit.readiness" and r.levelno == level]


def assert_says_nothing_of(error: dict, dsn: Dsn) -> None:
    """The error names neither the server (host, port) nor the database, user or errno."""
    text = json.dumps(error)
    for secret_ish in (dsn.host, str(dsn.port), dsn.database, dsn.user, "Errno", "1045", "1049", "1146", "2003"):
        assert secret_ish not in text, (secret_ish, text)


async def test_an_unmigrated_database_is_503_schema_not_ready_and_the_start_up_warning_says_what_to_run(
    empty_dsn, caplog
):
    caplog.set_level(logging.INFO, logger="orbit")
    async with run_node(node_config(empty_dsn)) as running:
        async with running.client() as http:
            submitted = await http.post("/v1/tasks", headers=SUBMIT_HEADERS, json={})
            error = assert_error(submitted, 503, "SCHEMA_NOT_READY", None)
            assert submitted.headers["Retry-After"] == "1"
            assert_says_nothing_of(error, empty_dsn)
            for _ in range(3):
                ready = await http.get("/readyz")
                assert ready.status_code == 503 and ready.headers["Retry-After"] == "1"
                assert ready.json()["error"] == {
                    "code": "SCHEMA_NOT_READY",
                    "message": f"schema: the database is at version 000000, older than this node's {migrate.HEAD:06d}",
                    "field": "schema",
                    "cause": "schema_behind",
                }
            # Once, at start-up (before the first probe), and never again for the same state.
            warnings = readiness_lines(caplog, logging.WARNING)
            assert len(warnings) == 1, warnings
            assert "schema_behind" in warnings[0] and "run `orbit-migrate up`" in warnings[0]
            # The request's cause is in the log, under its request id.
            failed = [r for r in caplog.records if getattr(r, "request_id", None) == submitted.json()["request_id"]]
            assert any(getattr(r, "cause", None) == "schema_behind" and "1146" in r.getMessage() for r in failed)

            db = Database(empty_dsn, size=1)
            try:
                await migrate.up(db)
            finally:
                await db.aclose()
            ready = await http.get("/readyz")
            assert ready.status_code == 200 and ready.json()["data"]["schema_version"] == migrate.HEAD
            assert len(readiness_lines(caplog, logging.INFO)) == 1
            # Past the schema: the unknown credential is now simply unauthenticated.
            assert_error(
                await http.post("/v1/tasks", headers=SUBMIT_HEADERS, json={}), 401, "UNAUTHENTICATED", "authorization"
            )
    assert len(readiness_lines(caplog, logging.WARNING)) == 1


def closed_port_dsn() -> Dsn:
    return attrs.evolve(server_dsn(), host="127.0.0.1", port=free_port(), unix_socket=None, database="orbit")


def wrong_password_dsn() -> Dsn:
    return attrs.evolve(server_dsn(), user="orbit_nobody", password=secrets.token_hex(8))


def unknown_database_dsn() -> Dsn:
    return server_dsn().with_database("orbit_missing_" + secrets.token_hex(6))


@pytest.mark.parametrize(
    ("make_dsn", "cause", "driver_words"),
    [
        # 2003: the client could not connect (the words after it are the socket layer's own).
        (closed_port_dsn, "unreachable", "2003"),
        (wrong_password_dsn, "access_denied", "1045"),
        (unknown_database_dsn, "unknown_database", "1049"),
    ],
)
async def test_a_database_that_cannot_serve_is_a_generic_503_for_tenants_and_a_cause_for_operators(
    make_dsn, cause, driver_words, caplog
):
    dsn = make_dsn()
    caplog.set_level(logging.INFO, logger="orbit")
    async with run_node(node_config(dsn)) as running:
        async with running.client() as http:
            submitted = await http.post("/v1/tasks", headers=SUBMIT_HEADERS, json={})
            error = assert_error(submitted, 503, "UNAVAILABLE", None)
            assert error["message"] == "the service is temporarily unavailable; retry later"
            assert submitted.headers["Retry-After"] == "1"
            assert_says_nothing_of(error, dsn)
            # The Worker handshake is answered the same way.
            with pytest.raises(ConnectionRejected) as refused:
                headers = [(b"authorization", f"Bearer {SOME_TOKEN}".encode())]
                async with open_websocket_url(ws_url(running.base_url), extra_headers=headers):
                    pass
            assert refused.value.status_code == 503 and (b"retry-after", b"1") in refused.value.headers
            handshake = json.loads(refused.value.body)["error"]
            assert handshake["code"] == "UNAVAILABLE" and handshake["message"] == error["message"]

            ready = await http.get("/readyz")
            assert ready.status_code == 503 and ready.headers["Retry-After"] == "1"
            body = ready.json()["error"]
            assert (body["code"], body["field"], body["cause"]) == ("UNAVAILABLE", "database", cause)
            assert_says_nothing_of(body, dsn)
    # The log has the cause and the driver's own words.
    logged = [r for r in caplog.records if r.name == "orbit.http" and getattr(r, "cause", None) == cause]
    assert len(logged) == 2 and all(r.levelno == logging.ERROR for r in logged), logged
    assert all(driver_words in r.getMessage() for r in logged), [r.getMessage() for r in logged]
    warnings = readiness_lines(caplog, logging.WARNING)
    assert len(warnings) == 1 and warnings[0].startswith(f"not ready ({cause})"), warnings


@pytest.mark.time_cap(120)
async def test_readyz_logs_when_the_database_goes_away_and_comes_back_not_on_every_probe(private_mariadb, caplog):
    dsn = private_mariadb.dsn()
    setup = Database(dsn, size=1)
    try:
        await migrate.up(setup)
        tenant = await make_tenant(setup)
    finally:
        await setup.aclose()
    caplog.set_level(logging.INFO, logger="orbit")
    async with run_node(node_config(dsn)) as running:
        async with running.client(tenant.token) as http:
            assert (await http.get("/readyz")).status_code == 200
            assert readiness_lines(caplog, logging.WARNING) == readiness_lines(caplog, logging.INFO) == []

            await private_mariadb.stop()
            for _ in range(3):
                ready = await http.get("/readyz")
                assert ready.status_code == 503 and ready.json()["error"]["cause"] == "unreachable"
            queue = await http.get(f"/v1/queues/{tenant.queue_id}")
            # A credential verified a moment ago may still be trusted; the database is not.
            assert_error(queue, 503, "UNAVAILABLE", None)
            assert queue.headers["Retry-After"] == "1"
            assert_says_nothing_of(queue.json()["error"], dsn)
            warnings = readiness_lines(caplog, logging.WARNING)
            assert len(warnings) == 1 and warnings[0].startswith("not ready (unreachable)"), warnings

            await private_mariadb.start()
            with trio.fail_after(30):
                while (await http.get("/readyz")).status_code != 200:
                    await trio.sleep(0.1)  # bounded poll: pooled connections notice the restart on reuse
            assert (await http.get("/readyz")).status_code == 200
            assert len(readiness_lines(caplog, logging.INFO)) == 1
            assert len(readiness_lines(caplog, logging.WARNING)) == 1


def run_orbit(dsn: Dsn, **settings: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith("ORBIT_")}
    env.update(ORBIT_MYSQL_DSN=dsn.url(), ORBIT_LOG_FORMAT="json", **settings)
    return subprocess.run([str(BIN / "orbit")], env=env, capture_output=True, text=True, timeout=60)


@pytest.mark.parametrize("setting", ["ORBIT_HTTP_ADDR", "ORBIT_METRICS_ADDR"])
async def test_an_address_in_use_is_one_line_and_exit_2(dsn, setting):
    with socket.create_server(("127.0.0.1", 0)) as taken:
        port = taken.getsockname()[1]
        settings = {"ORBIT_HTTP_ADDR": f"127.0.0.1:{free_port()}"}
        if setting == "ORBIT_METRICS_ADDR":
            settings.update(ORBIT_METRICS="open")
        settings[setting] = f"127.0.0.1:{port}"
        result = await trio.to_thread.run_sync(lambda: run_orbit(dsn, **settings))
    assert result.returncode == 2, result.stderr
    assert result.stderr.splitlines() == [
        f"error: {setting}: cannot listen on 127.0.0.1:{port}: "
        "address already in use (is another node, or `make run`, already running?)"
    ], result.stderr


async def test_a_second_node_on_the_same_address_is_one_line_and_exit_2(dsn):
    """``make run`` started twice: the second node reports the address, the first serves on."""
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("ORBIT_")}
    env.update(ORBIT_MYSQL_DSN=dsn.url(), ORBIT_HTTP_ADDR=f"127.0.0.1:{port}", ORBIT_SHUTDOWN_GRACE_S="1")
    first = subprocess.Popen([str(BIN / "orbit")], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        with trio.fail_after(30):
            while True:
                try:
                    async with httpx.AsyncClient() as http:
                        if (await http.get(f"http://127.0.0.1:{port}/healthz")).status_code == 200:
                            break
                except httpx.TransportError:
                    await trio.sleep(0.1)  # bounded poll: the process tells nothing else when it listens
        second = await trio.to_thread.run_sync(
            lambda: run_orbit(dsn, ORBIT_HTTP_ADDR=f"127.0.0.1:{port}", ORBIT_SHUTDOWN_GRACE_S="1")
        )
        assert second.returncode == 2, second.stderr
        assert len(second.stderr.splitlines()) == 1, second.stderr
        assert second.stderr.startswith(
            f"error: ORBIT_HTTP_ADDR: cannot listen on 127.0.0.1:{port}: address already in use"
        )
        assert first.poll() is None
    finally:
        first.terminate()
        first.wait(timeout=20)
