"""Structured logs: one JSON object per line with the context that applies, never a secret.

The full-run test starts the real ``orbit`` process at debug level, drives it through a
whole life (HTTP submits, a Worker running tasks, refused credentials, a metrics scrape,
SIGTERM) and greps everything it printed for the credentials it was given."""

from __future__ import annotations

import io
import json
import logging
import os
import re
import signal
import subprocess

import attrs
import pytest
import trio

from orbit_protocol import logs
from orbit_sdk.client import OrbitClient
from orbit_sdk.models import SubmitTaskRequest
from orbit_sdk.worker import Worker, WorkerTask

from ..helpers import BIN, cli
from ..nodeutil import make_tenant, run_node

TOKEN = "orb_" + "0123456789abcdef" * 2 + "fedcba9876543210" * 4
SECRET = TOKEN[4 + 32 :]
# The whole full-run scenario, on the real clock.
RUN_TIMEOUT_S = 90


@pytest.fixture
def restore_logging():
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    yield
    root.handlers[:] = handlers
    root.setLevel(level)


def capture(fmt: str) -> tuple[logging.Logger, io.StringIO]:
    stream = io.StringIO()
    logger = logging.getLogger(f"orbit.test.{fmt}")
    logger.handlers[:] = [logs.make_handler(fmt, stream)]
    logger.setLevel(logging.DEBUG)
    logger.propagate = False
    return logger, stream


def test_json_lines_carry_the_bound_context_and_never_a_token():
    logger, stream = capture("json")
    with logs.bound(request_id="req_1", application="shop"):
        logger.info("submitted with %s", TOKEN, extra={"task_id": "a" * 32})
        logger.warning("header was Authorization: Bearer %s", TOKEN)
        logger.info("field", extra={"credential": TOKEN})
        try:
            raise RuntimeError(f"driver said {TOKEN}")
        except RuntimeError:
            logger.exception("failed")
    logger.info("outside")
    lines = [json.loads(line) for line in stream.getvalue().splitlines()]
    assert TOKEN not in stream.getvalue() and SECRET not in stream.getvalue()
    first = lines[0]
    assert first["message"] == "submitted with orb_[redacted]"
    assert (first["request_id"], first["application"], first["task_id"]) == ("req_1", "shop", "a" * 32)
    assert first["level"] == "info" and first["logger"] == "orbit.test.json" and first["ts"].endswith("Z")
    assert lines[1]["message"] == "header was Authorization: Bearer orb_[redacted]"
    assert lines[2]["credential"] == "orb_[redacted]"
    assert "RuntimeError: driver said orb_[redacted]" in lines[3]["exception"]
    assert "request_id" not in lines[4] and lines[4]["message"] == "outside"


def test_text_lines_for_a_terminal_show_the_context_and_redact():
    logger, stream = capture("text")
    with logs.bound(connection_id="c_1", application="shop"):
        logger.info("got Bearer %s", "x" * 40)
        logger.info("token %s", TOKEN[:20])  # even a cut token
    text = stream.getvalue()
    assert "[application=shop connection_id=c_1]" in text
    assert "x" * 40 not in text and "Bearer [redacted]" in text
    assert TOKEN[:20] not in text and "orb_[redacted]" in text
    # Prose that only mentions the scheme stays readable.
    assert logs.redact("authorization: expected the Bearer scheme") == "authorization: expected the Bearer scheme"


async def test_each_task_logs_with_its_own_context():
    logger, stream = capture("json")

    async def connection(connection_id: str, ready: trio.Event, go: trio.Event):
        logs.bind(connection_id=connection_id)
        ready.set()
        await go.wait()

        async def child():
            logger.info("child")

        async with trio.open_nursery() as nursery:
            nursery.start_soon(child)
        logger.info("parent")

    go = trio.Event()
    async with trio.open_nursery() as nursery:
        for name in ("c_a", "c_b"):
            ready = trio.Event()
            nursery.start_soon(connection, name, ready, go)
            await ready.wait()
        go.set()
    logger.info("main")
    lines = [json.loads(line) for line in stream.getvalue().splitlines()]
    by_connection = sorted((line.get("connection_id", "-"), line["message"]) for line in lines)
    assert by_connection == [("-", "main"), ("c_a", "child"), ("c_a", "parent"), ("c_b", "child"), ("c_b", "parent")]


def test_configure_logging_sets_the_level_and_format(restore_logging):
    stream = io.StringIO()
    logs.configure_logging("warning", fmt="json", stream=stream)
    logging.getLogger("orbit.test.level").info("hidden")
    logging.getLogger("orbit.test.level").warning("shown %s", TOKEN)
    lines = stream.getvalue().splitlines()
    assert len(lines) == 1 and json.loads(lines[0])["message"] == "shown orb_[redacted]"
    # A stream that is not a terminal gets JSON by default.
    stream = io.StringIO()
    logs.configure_logging("info", stream=stream)
    logging.getLogger("orbit.test.level").info("auto")
    assert json.loads(stream.getvalue())["message"] == "auto"


class NodeProcess:
    """The real ``orbit`` process; its output is read as it comes, line by line."""

    def __init__(self, process):
        self.process = process
        self.output = bytearray()
        self.url: str | None = None
        self.listening = trio.Event()

    async def read(self, stream) -> None:
        pending = b""
        async for chunk in stream:
            self.output += chunk
            pending += chunk
            *lines, pending = pending.split(b"\n")
            for line in lines:
                match = re.search(rb"listening on (http://[0-9.]+:\d+)", line)
                if match and self.url is None:
                    self.url = match.group(1).decode()
                    self.listening.set()


async def test_logs_of_a_full_run_contain_no_credential_secret(dsn, tmp_path):
    credentials = tmp_path / "credentials.json"
    boot = cli(
        "orbit-admin",
        "bootstrap",
        "--application",
        "logapp",
        "--namespace",
        "default",
        "--environment",
        "test",
        "--queue",
        "work",
        "--worker-access",
        "--output",
        str(credentials),
        dsn=dsn,
    )
    assert boot.returncode == 0, boot.stderr
    document = json.loads(credentials.read_text())
    token, queue_id = document["token"], document["queues"]["work"]
    created = cli(
        "orbit-admin",
        "credential",
        "create",
        "--application",
        "logapp",
        "--namespace",
        "default",
        "--scope",
        "metrics:read",
        "--json",
        dsn=dsn,
    )
    assert created.returncode == 0, created.stderr
    metrics_token = json.loads(created.stdout)["token"]
    secrets = [token, token[36:], metrics_token, metrics_token[36:]]

    env = {k: v for k, v in os.environ.items() if not k.startswith("ORBIT_")}
    env.update(
        ORBIT_MYSQL_DSN=dsn.url(),
        ORBIT_HTTP_ADDR="127.0.0.1:0",
        ORBIT_LOG_LEVEL="debug",
        ORBIT_LOG_FORMAT="json",
        ORBIT_METRICS="credential",
        ORBIT_SHUTDOWN_GRACE_S="2",
    )
    process = await trio.lowlevel.open_process(
        [str(BIN / "orbit")], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT
    )
    node = NodeProcess(process)
    try:
        with trio.fail_after(RUN_TIMEOUT_S):
            async with trio.open_nursery() as nursery:
                nursery.start_soon(node.read, process.stdout)
                await node.listening.wait()
                ids = await drive(node.url, token, metrics_token, queue_id)
                process.send_signal(signal.SIGTERM)
                assert await process.wait() == 0
    finally:
        if process.returncode is None:
            process.kill()
            await process.wait()

    text = node.output.decode()
    for secret in secrets:
        assert secret not in text
    entries = [json.loads(line) for line in text.splitlines() if line.strip()]
    assert all({"ts", "level", "logger", "message"} <= set(e) for e in entries)
    submits = [e for e in entries if e.get("route") == "/v1/tasks" and e.get("method") == "POST"]
    assert len(submits) == 3
    assert all(
        e["status"] == 201
        and e["application"] == "logapp"
        and e["request_id"].startswith("req_")
        and e["queue_id"] == queue_id
        for e in submits
    )
    assert sorted(e["task_id"] for e in submits) == sorted(ids)
    reads = [e for e in entries if e.get("route") == "/v1/tasks/<task_id>"]
    assert reads and all(re.fullmatch(r"[0-9a-f]{32}", e["task_id"]) for e in reads)
    connected = [e for e in entries if e["message"].startswith("worker connected")]
    assert connected and connected[0]["connection_id"].startswith("c_") and connected[0]["application"] == "logapp"
    assert any(e.get("route") == "/metrics" and e.get("status") == 200 for e in entries)
    assert any(e.get("status") == 401 for e in entries)


async def drive(url: str, token: str, metrics_token: str, queue_id: str) -> list[str]:
    """A whole life of a node: submits, reads, a Worker running everything, refusals, a scrape."""
    import httpx

    async with OrbitClient(url, token) as client:
        ids = []
        for n in range(3):
            accepted = await client.submit_task(
                f"log-{n}",
                SubmitTaskRequest(
                    queue_id=queue_id,
                    handler="log.work",
                    handler_version="v1",
                    payload_version="v1",
                    payload={"n": n, "note": f"not a secret {n}"},
                ),
            )
            ids.append(accepted.task.task_id)
        worker = Worker(url=url, token=token, queues=[queue_id], capacity=2)

        @worker.handler("log.work", "v1", "v1")
        async def work(task: WorkerTask):
            return task.payload

        async with trio.open_nursery() as nursery:
            await nursery.start(worker.run)
            await worker.wait_completed(3)
            await worker.drain()
        for task_id in ids:
            assert (await client.get_task(task_id)).state == "succeeded"
    async with httpx.AsyncClient(base_url=url, timeout=10) as http:
        # A forged token of the right shape, the real one in a query string, a scrape.
        forged = "orb_" + "1" * 96
        assert (await http.get("/v1/tasks", headers={"Authorization": f"Bearer {forged}"})).status_code == 401
        leaked = await http.get(f"/v1/tasks?access_token={token}", headers={"Authorization": f"Bearer {token}"})
        assert leaked.status_code == 400
        scraped = await http.get("/metrics", headers={"Authorization": f"Bearer {metrics_token}"})
        assert scraped.status_code == 200 and "orbit_tasks_finished_total" in scraped.text
    return ids


@pytest.mark.parametrize(
    ("mode", "expected"),
    [
        # (route, status, level) of each line: errors by default, every request with all, none off.
        ("errors", {("/v1/tasks", 201, "DEBUG"), ("/v1/tasks/<task_id>", 404, "INFO")}),
        ("all", {("/v1/tasks", 201, "INFO"), ("/v1/tasks/<task_id>", 404, "INFO")}),
        ("off", set()),
    ],
)
async def test_the_access_log_says_what_its_mode_asks(node_config, db, caplog, mode, expected):
    caplog.set_level(logging.DEBUG, logger="orbit.access")
    tenant = await make_tenant(db)
    config = attrs.evolve(node_config, access_log=mode)
    async with run_node(config) as running, running.client(tenant.token) as http:
        body = {"queue_id": tenant.queue_id, "handler": "h", "handler_version": "v1", "payload_version": "v1"}
        made = await http.post("/v1/tasks", json={**body, "payload": {}}, headers={"Idempotency-Key": "a1"})
        assert made.status_code == 201
        assert (await http.get("/v1/tasks/" + "0" * 32)).status_code == 404
    seen = {(r.route, r.status, r.levelname) for r in caplog.records if r.name == "orbit.access"}  # type: ignore[attr-defined]
    assert seen == expected


def test_an_unknown_access_log_mode_is_refused_naming_the_variable():
    from orbit_node.config import NodeConfig
    from orbit_node.domain.errors import ConfigError

    with pytest.raises(ConfigError) as refused:
        NodeConfig.from_env({"ORBIT_MYSQL_DSN": "mysql://u@h/d", "ORBIT_ACCESS_LOG": "some"})
    assert refused.value.field == "ORBIT_ACCESS_LOG"
