"""A private ``mariadbd`` for tests that kill the database server.

``--no-defaults``, its own temporary datadir (``mariadb-install-db --no-defaults
--auth-root-authentication-method=normal --skip-test-db``) and ``tmpdir``, its own port
and socket.
It never touches the shared server or the project's development server. It runs with
``innodb_flush_log_at_trx_commit=1``, the setting ``docs/guarantees.md`` requires, so a
``kill -9`` loses no committed transaction.
"""

from __future__ import annotations

import getpass
import shutil
import signal
import tempfile
from pathlib import Path

import attrs
import trio

from orbit_node.db import Database
from orbit_node.domain.dsn import Dsn
from orbit_node.domain.errors import OrbitError

from .nodeproc import free_port
from .processes import stop_process

# Bound on starting (or crash-recovering) the server.
START_TIMEOUT_S = 60


def find_bin(*names: str) -> str:
    for name in names:
        for directory in ("/usr/sbin", "/usr/bin", "/usr/local/sbin", "/usr/local/bin"):
            path = Path(directory) / name
            if path.exists():
                return str(path)
        found = shutil.which(name)
        if found:
            return found
    raise RuntimeError(f"none of {names} is installed")


@attrs.define(eq=False)
class PrivateMariaDB:
    # Short on purpose: a unix socket path is limited to 107 bytes.
    root: Path = attrs.field(factory=lambda: Path(tempfile.mkdtemp(prefix="orbit-mdb-")))
    port: int = attrs.field(factory=free_port)
    process: trio.Process | None = None

    @property
    def datadir(self) -> Path:
        return self.root / "data"

    @property
    def tmpdir(self) -> Path:
        """The server's ``tmpdir`` (temporary files and on-disk internal temporary tables)."""
        return self.root / "tmp"

    def dsn(self, database: str = "orbit") -> Dsn:
        return Dsn(user="root", password="", host="127.0.0.1", port=self.port, database=database)

    async def install(self) -> None:
        # The bootstrap server gets the private tmpdir too: in the shared /tmp, installs
        # running side by side drop each other's internal temporary tables ("Could not
        # remove temporary table", then "Unknown table 'mysql.tmp_user_sys'"): 5 of 12
        # concurrent installs failed that way.
        self.tmpdir.mkdir(parents=True, exist_ok=True)
        done = await trio.run_process(
            [
                find_bin("mariadb-install-db", "mysql_install_db"),
                "--no-defaults",
                f"--datadir={self.datadir}",
                f"--tmpdir={self.tmpdir}",
                "--auth-root-authentication-method=normal",
                "--skip-test-db",
                f"--user={getpass.getuser()}",
            ],
            capture_stdout=True,
            capture_stderr=True,
            check=False,
        )
        if done.returncode != 0:
            output = (done.stdout + done.stderr).decode(errors="replace").strip().splitlines()
            raise RuntimeError(f"mariadb-install-db exited {done.returncode}: " + "\n".join(output[:8]))

    def server_args(self) -> list[str]:
        """Options beyond the common ones (a Galera server adds its provider's)."""
        return []

    def needs_install(self) -> bool:
        return not (self.datadir / "mysql").exists()

    async def start(self) -> None:
        if self.needs_install():
            await self.install()
        self.tmpdir.mkdir(exist_ok=True)
        log = open(self.root / "error.log", "ab")
        try:
            self.process = await trio.lowlevel.open_process(
                [
                    find_bin("mariadbd", "mysqld"),
                    "--no-defaults",
                    f"--datadir={self.datadir}",
                    f"--tmpdir={self.tmpdir}",
                    f"--socket={self.root / 'mysqld.sock'}",
                    f"--port={self.port}",
                    "--bind-address=127.0.0.1",
                    f"--pid-file={self.root / 'mariadbd.pid'}",
                    f"--user={getpass.getuser()}",
                    "--innodb-flush-log-at-trx-commit=1",
                    "--innodb-buffer-pool-size=64M",
                    "--innodb-lock-wait-timeout=10",
                    "--skip-name-resolve",
                    "--max-connections=200",
                    *self.server_args(),
                ],
                stdout=log,
                stderr=log,
            )
        finally:
            log.close()
        await self.wait_ready()

    async def wait_ready(self) -> None:
        await self.create_database()

    async def create_database(self) -> None:
        admin = Database(self.dsn("mysql"), size=1, connect_timeout_s=1)
        try:
            with trio.fail_after(START_TIMEOUT_S):
                while True:
                    if self.process is not None and self.process.poll() is not None:
                        raise RuntimeError(f"mariadbd exited: {self.log_tail()}")
                    try:
                        await admin.run(lambda tx: tx.execute_raw("CREATE DATABASE IF NOT EXISTS orbit"))
                        return
                    except OrbitError:
                        await trio.sleep(0.05)  # bounded poll: the server tells nothing else when it is up
        finally:
            await admin.aclose()

    async def kill9(self) -> None:
        """``kill -9`` the server: no shutdown, InnoDB recovers at the next start."""
        assert self.process is not None
        self.process.send_signal(signal.SIGKILL)
        await self.process.wait()
        self.process = None

    async def stop(self) -> None:
        if self.process is None:
            return
        await stop_process(self.process, START_TIMEOUT_S)
        self.process = None

    def log_tail(self) -> str:
        path = self.root / "error.log"
        return path.read_text(errors="replace")[-2000:] if path.exists() else ""

    def remove(self) -> None:
        shutil.rmtree(self.root, ignore_errors=True)
