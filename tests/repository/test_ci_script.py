""".ci/run leaves no server running: it stops the private MariaDB `make test` started.

The real ``.ci/run`` and ``scripts/devdb.sh`` are copied into a scratch checkout (their
own ``var/mariadb`` datadir and port); ``make`` is replaced on PATH by a script that does
what ``make test`` does to the database (``scripts/devdb.sh start`` when
``ORBIT_MYSQL_DSN`` is unset) and then passes or fails as told. A real ``mariadbd``
starts and must be gone when ``.ci/run`` ends, unless it was running before.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from pathlib import Path

import attrs
import pytest

from harness.nodeproc import free_port

from ..helpers import REPO

FAKE_MAKE = """#!/usr/bin/env bash
set -euo pipefail
echo "$*" >> "$PWD/make.calls"
if [ -z "${ORBIT_MYSQL_DSN:-}" ]; then scripts/devdb.sh start >/dev/null; fi
exit "${FAKE_MAKE_STATUS:-0}"
"""


@attrs.frozen
class Checkout:
    """A scratch checkout with the real .ci/run and scripts/devdb.sh, and a fake make."""

    root: Path
    port: int

    def env(self, **extra: str) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("ORBIT_")}
        env["PATH"] = f"{self.root / 'fake-bin'}{os.pathsep}{env.get('PATH', '')}"
        env["ORBIT_DEV_DB_PORT"] = str(self.port)
        env.update(extra)
        return env

    def ci_run(self, **extra: str) -> subprocess.CompletedProcess:
        return subprocess.run(
            [str(self.root / ".ci" / "run")], env=self.env(**extra), capture_output=True, text=True, timeout=120
        )

    def devdb(self, command: str) -> subprocess.CompletedProcess:
        return subprocess.run(
            [str(self.root / "scripts" / "devdb.sh"), command], env=self.env(), capture_output=True, timeout=120
        )

    def db_running(self) -> bool:
        return self.devdb("status").returncode == 0

    def db_gone(self) -> bool:
        """No mariadbd of this checkout answers, and its pid file is gone (it has exited)."""
        return not self.db_running() and not (self.root / "var" / "mariadb" / "mariadbd.pid").exists()


@pytest.fixture
def checkout():
    root = Path(tempfile.mkdtemp(prefix="orbit-ci-"))  # short: the server's socket path is bounded
    scratch = Checkout(root, free_port())
    try:
        for relative in (".ci/run", "scripts/devdb.sh"):
            (root / relative).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(REPO / relative, root / relative)
        bin_dir = root / "fake-bin"
        bin_dir.mkdir()
        (bin_dir / "make").write_text(FAKE_MAKE)
        (bin_dir / "make").chmod(0o755)
        yield scratch
    finally:
        scratch.devdb("stop")
        shutil.rmtree(root, ignore_errors=True)


def test_ci_run_stops_the_database_it_started_and_only_that(checkout):
    # Passing run: the server make test started is stopped at the end.
    passed = checkout.ci_run()
    assert passed.returncode == 0, passed.stderr
    assert (checkout.root / "make.calls").read_text() == "test\n"
    assert checkout.db_gone()

    # Failing run: the failure is reported as before and the server is stopped all the same.
    failed = checkout.ci_run(FAKE_MAKE_STATUS="3")
    assert failed.returncode == 3, failed.stderr
    assert checkout.db_gone()

    # A developer's server, running before, is left running.
    started = checkout.devdb("start")
    assert started.returncode == 0, started.stderr
    kept = checkout.ci_run()
    assert kept.returncode == 0, kept.stderr
    assert checkout.db_running()

    # With ORBIT_MYSQL_DSN the private server is not the run's business: not stopped either.
    elsewhere = checkout.ci_run(ORBIT_MYSQL_DSN="mysql://root@127.0.0.1:1/orbit")
    assert elsewhere.returncode == 0, elsewhere.stderr
    assert checkout.db_running()
