"""Every shell block of README.md and docs/*.md, and the SDK quick start, run as written.

The blocks of a file run in order in one ``bash -euo pipefail`` (so variables a block
defines serve the next ones), from the repository root, against a scratch database
and a node of this test. What a reader's machine has and the test's does not is
rewritten (``REWRITES``); blocks that cannot run here are listed in ``SKIPPED`` with
the reason, and a block that is neither run nor listed fails the test.
"""

from __future__ import annotations

import os
import re
import signal
import sys
from pathlib import Path

import pytest
import trio

from orbit_node.services import default_services

from ..helpers import BIN, REPO, bootstrap
from ..nodeutil import run_node

FENCE = re.compile(r"^```(\w*)\n(.*?)^```", re.S | re.M)

# A block starting with this line is not run, for this reason.
SKIPPED = {
    "mariadb-dump --single-transaction --quick --no-tablespaces -h DB -u backup orbit > orbit.sql": (
        "tests/system/test_backup_restore.py takes this backup of a live database and restores it"
    ),
    "mariadb -h DB -u migrator -e 'CREATE DATABASE orbit_restored CHARACTER SET utf8mb4 COLLATE utf8mb4_bin'": (
        "tests/system/test_backup_restore.py restores the backup this way into a new database"
    ),
    "make run    # venv in .venv/, private MariaDB under ./var (unless ORBIT_MYSQL_DSN is set),": (
        "make run/test/lint build the checkout's own venv and database and make run never returns; "
        "the test's node and scratch database stand in for it"
    ),
    ".venv/bin/orbit": "runs a node until it is stopped; the test's node stands in for it",
    "npx --yes openapi-typescript@7 schema/openapi.yaml --output orbit-api.d.ts": (
        "writes into the checkout and needs the npm registry; tests/repository/test_openapi_generated.py runs it "
        "into a temporary directory and checks what it writes"
    ),
    "pip install 'orbit-node[otel]' opentelemetry-distro opentelemetry-exporter-otlp": (
        "installs an exporter and runs a node until it is stopped, exporting to a collector; "
        "tests/integration/test_tracing.py records the node's and the Worker's spans in memory instead"
    ),
    "for example in retries plan fanout resource_keys album; do": (
        "tests/repository/test_examples.py runs each of these examples against a node and checks every line it prints"
    ),
}


def blocks(path: Path, language: str) -> list[str]:
    return [m.group(2) for m in FENCE.finditer(path.read_text()) if m.group(1) == language]


def documents() -> list[Path]:
    return [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]


def runnable(path: Path) -> list[str]:
    return [b for b in blocks(path, "sh") if b.splitlines()[0] not in SKIPPED]


def test_every_skip_names_a_block_that_exists():
    firsts = {b.splitlines()[0] for path in documents() for b in blocks(path, "sh")}
    assert set(SKIPPED) <= firsts


@pytest.fixture
async def docs_node(node_config, dsn, tmp_path):
    """A node on a scratch database, and the credentials file ``make run`` would write."""
    async with run_node(node_config, services=default_services()) as running:
        address = running.base_url.removeprefix("http://")
        creds = await bootstrap(dsn, tmp_path / "dev.credentials.json", env={"ORBIT_HTTP_ADDR": address})
        yield running, creds, address


def environment(dsn, address: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("ORBIT_")}
    env.update(ORBIT_MYSQL_DSN=dsn.url(), ORBIT_HTTP_ADDR=address)
    return env


@pytest.mark.parametrize("document", [p.relative_to(REPO).as_posix() for p in documents() if runnable(p)])
async def test_shell_blocks_run_as_written(document, docs_node, dsn, tmp_path):
    running, creds, address = docs_node
    rewrites = {
        "$(scripts/devdb.sh dsn)": f"'{dsn.url()}'",
        "var/dev.credentials.json": str(creds),
        "/tmp/orbit-priority.credentials.json": str(tmp_path / "priority.credentials.json"),
        "http://127.0.0.1:8080": running.base_url,
    }
    script = ["set -euo pipefail"]
    for index, block in enumerate(runnable(REPO / document)):
        for old, new in rewrites.items():
            block = block.replace(old, new)
        script += [f"echo '--- block {index}' >&2", block]
    with trio.fail_after(120):
        result = await trio.run_process(
            ["bash", "-c", "\n".join(script)],
            cwd=REPO,
            env=environment(dsn, address),
            capture_stdout=True,
            capture_stderr=True,
            check=False,
        )
    assert result.returncode == 0, result.stderr.decode()[-3000:] + result.stdout.decode()[-2000:]
    if document == "README.md":
        out = result.stdout.decode()
        assert '"handler":"object.prepare"' in out and '"name":"nightly"' in out
        assert "submitted_priorities=0,9,4 executed_priorities=9,4,0\n" in out


async def test_sdk_quick_start_runs_as_written(docs_node, dsn, tmp_path):
    """The Worker module under ``orbit-worker`` in one process, the producer in another:
    the producer prints what its task returned, and SIGTERM drains the Worker (exit 0)."""
    running, creds, address = docs_node
    text = (REPO / "docs" / "sdk.md").read_text()
    quick_start = text.split("## Quick start", 1)[1].split("\n## ", 1)[0]
    worker_module, producer = blocks_in(quick_start)
    assert "orbit-worker greeting_worker:worker`" in quick_start and "python greet.py`" in quick_start
    (tmp_path / "greeting_worker.py").write_text(worker_module)
    (tmp_path / "greet.py").write_text(producer)
    env = environment(dsn, address)
    del env["ORBIT_MYSQL_DSN"], env["ORBIT_HTTP_ADDR"]  # a client needs neither
    env["ORBIT_CREDENTIALS_FILE"] = str(creds)
    with trio.fail_after(60):
        worker = await trio.lowlevel.open_process(
            [str(BIN / "orbit-worker"), "greeting_worker:worker"], cwd=tmp_path, env=env
        )
        try:
            result = await trio.run_process(
                [sys.executable, "greet.py"],
                cwd=tmp_path,
                env=env,
                capture_stdout=True,
                capture_stderr=True,
                check=False,
            )
        finally:
            worker.send_signal(signal.SIGTERM)
            status = await worker.wait()
    assert result.returncode == 0, result.stderr.decode()
    assert result.stdout.decode() == "succeeded {'greeting': 'hello, Ada'}\n"
    assert status == 0


def blocks_in(text: str) -> list[str]:
    return [m.group(2) for m in FENCE.finditer(text) if m.group(1) == "python"]
