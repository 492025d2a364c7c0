"""The `orbit` process: health, readiness, clean exit on SIGTERM, one-line config errors."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import time

import httpx
import trio

from orbit_node.db import migrate

from ..helpers import BIN


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_http(url: str, timeout_s: float = 20) -> httpx.Response:
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            return httpx.get(url, timeout=2)
        except httpx.TransportError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.1)  # bounded poll (in a thread): the process tells nothing else when it is up


async def test_node_serves_health_and_readiness_and_exits_zero_on_sigterm(dsn):
    await trio.to_thread.run_sync(check_health_and_sigterm, dsn)


def check_health_and_sigterm(dsn):
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("ORBIT_")}
    env.update(ORBIT_MYSQL_DSN=dsn.url(), ORBIT_HTTP_ADDR=f"127.0.0.1:{port}", ORBIT_SHUTDOWN_GRACE_S="2")
    proc = subprocess.Popen([str(BIN / "orbit")], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        health = wait_http(f"http://127.0.0.1:{port}/healthz")
        assert health.status_code == 200 and health.json()["data"]["status"] == "ok"
        ready = httpx.get(f"http://127.0.0.1:{port}/readyz")
        assert ready.status_code == 200 and ready.json()["data"]["schema_version"] == migrate.HEAD
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=15) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


async def test_readyz_reports_a_database_behind_the_schema(empty_dsn):
    await trio.to_thread.run_sync(check_not_ready, empty_dsn)


def check_not_ready(empty_dsn):
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("ORBIT_")}
    env.update(ORBIT_MYSQL_DSN=empty_dsn.url(), ORBIT_HTTP_ADDR=f"127.0.0.1:{port}")
    proc = subprocess.Popen([str(BIN / "orbit")], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert wait_http(f"http://127.0.0.1:{port}/healthz").status_code == 200
        ready = httpx.get(f"http://127.0.0.1:{port}/readyz")
        assert ready.status_code == 503
        error = ready.json()["error"]
        assert (error["code"], error["field"], error["cause"]) == ("SCHEMA_NOT_READY", "schema", "schema_behind")
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=15) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_bad_configuration_is_one_line_and_nonzero():
    env = {k: v for k, v in os.environ.items() if not k.startswith("ORBIT_")}
    env.update(ORBIT_MYSQL_DSN="mysql://root@127.0.0.1/orbit", ORBIT_HTTP_ADDR="localhost")
    result = subprocess.run([str(BIN / "orbit")], env=env, capture_output=True, text=True, timeout=30)
    assert result.returncode == 2
    assert result.stderr.strip() == "error: ORBIT_HTTP_ADDR: expected HOST:PORT, got 'localhost'"
