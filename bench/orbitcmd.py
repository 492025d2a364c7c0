"""Orbit's own commands as processes: ``orbit`` (a node exactly as production runs it, its
settings from ``ORBIT_*`` variables), ``orbit-migrate`` and ``orbit-admin``, each from this
source tree or another commit's (``git archive COMMIT | tar -x -C DIR``), so one harness
drives either version.

``bench.nodeproc`` builds its ``NodeConfig`` in the harness's terms; a setting that only
the newer code knows (``ORBIT_PRUNE_INTERVAL_S``) is passed here as the variable an
operator sets, and an older node is given none of them (it refuses an unknown one).
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import tempfile
from collections.abc import AsyncIterator, Mapping, Sequence
from contextlib import asynccontextmanager
from pathlib import Path

import attrs
import httpx
import trio

from harness.nodeproc import free_port, orbit_environment, wait_answering
from harness.processes import stop_process
from orbit_node.domain.dsn import Dsn

from . import REPO

# Bound on a node answering 200 on /readyz after its process started.
READY_TIMEOUT_S = 30.0
# Bound on a node draining after SIGTERM (it is given ORBIT_SHUTDOWN_GRACE_S=2).
STOP_TIMEOUT_S = 15.0
# Bound on one orbit-migrate or orbit-admin command.
COMMAND_TIMEOUT_S = 300.0
# Each command's module and the call that runs it with ``sys.argv[1:]`` (``python -c``
# puts the working directory first on the path: the tree's ``orbit_node`` is imported).
_ENTRY = "import sys; from orbit_node.cli.{module} import main; sys.exit(main())"


def command(module: str, *args: str) -> list[str]:
    """``python -c ...`` running ``orbit_node.cli.<module>``'s ``main`` with ``args``."""
    return [sys.executable, "-c", _ENTRY.format(module=module), *args]


def known_settings(tree: Path | None = None) -> frozenset[str]:
    """The ``ORBIT_*`` variables the node of ``tree`` (default this one) accepts."""
    if tree is None:
        from orbit_node.config import SETTING_VARIABLES

        return frozenset(SETTING_VARIABLES)
    out = subprocess.run(
        [
            sys.executable,
            "-c",
            "import json; from orbit_node.config import SETTING_VARIABLES; print(json.dumps(sorted(SETTING_VARIABLES)))",
        ],
        cwd=tree,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    return frozenset(json.loads(out))


async def run_command(module: str, args: Sequence[str], dsn: Dsn, *, tree: Path | None = None) -> str:
    """``orbit-migrate`` / ``orbit-admin`` (``module`` ``migrate`` / ``admin``) of ``tree``; its stdout."""
    with trio.fail_after(COMMAND_TIMEOUT_S):
        done = await trio.run_process(
            command(module, *args),
            cwd=tree or REPO,
            env=orbit_environment(dsn, {}),
            capture_stdout=True,
            capture_stderr=True,
            check=False,
        )
    if done.returncode != 0:
        raise RuntimeError(
            f"orbit_node.cli.{module} {' '.join(args)} exited {done.returncode}: {done.stderr.decode()[-500:]}"
        )
    return done.stdout.decode()


async def migrate(dsn: Dsn, *, tree: Path | None = None) -> None:
    """``orbit-migrate up`` of ``tree``: the database at the schema that code knows."""
    await run_command("migrate", ["up"], dsn, tree=tree)


@attrs.frozen
class Credentials:
    """What ``orbit-admin bootstrap`` wrote: the token and the queue's id."""

    application: str
    token: str
    queue_id: str


async def bootstrap(dsn: Dsn, application: str, *, tree: Path | None = None) -> Credentials:
    """``orbit-admin bootstrap`` of ``tree``: an application, namespace, queue ``q`` and a
    credential with Worker access."""
    with tempfile.TemporaryDirectory(prefix="orbit-bench-creds-") as tmp:
        path = Path(tmp) / "credentials.json"
        await run_command(
            "admin",
            [
                "bootstrap",
                "--application",
                application,
                "--namespace",
                "bench",
                "--environment",
                "test",
                "--queue",
                "q",
                "--worker-access",
                "--output",
                str(path),
            ],
            dsn,
            tree=tree,
        )
        data = json.loads(path.read_text())
    return Credentials(application, data["token"], data["queues"]["q"])


@attrs.define(eq=False)
class OrbitProcess:
    """A running ``orbit``: its URL, pid, metrics URL (None: metrics off) and log file."""

    url: str
    pid: int
    metrics_url: str | None
    log: Path

    async def metrics(self) -> dict[str, float]:
        """Every sample of ``GET /metrics`` (Prometheus text), keyed ``name{labels}``; empty without metrics."""
        if self.metrics_url is None:
            return {}
        async with httpx.AsyncClient(timeout=5.0) as client:
            response = await client.get(self.metrics_url)
        return parse_exposition(response.text) if response.status_code == 200 else {}

    def log_tail(self, chars: int = 1500) -> str:
        try:
            return self.log.read_text(errors="replace")[-chars:]
        except OSError:
            return ""


def parse_exposition(text: str) -> dict[str, float]:
    """``name{labels} value`` lines of the Prometheus text format (comments skipped)."""
    samples: dict[str, float] = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        key, _, value = line.rpartition(" ")
        try:
            samples[key] = float(value)
        except ValueError:
            continue
    return samples


@asynccontextmanager
async def orbit_process(
    dsn: Dsn, *, settings: Mapping[str, str] | None = None, tree: Path | None = None, metrics: bool = False
) -> AsyncIterator[OrbitProcess]:
    """Run ``orbit`` of ``tree`` (default this one) on a free port of 127.0.0.1 with
    ``settings`` (``ORBIT_*`` variables) until the block ends; it is ready once ``GET
    /readyz`` answers 200. ``metrics``: ``ORBIT_METRICS=open`` on another free port. Its
    log is read within the block (``log_tail``): the file goes with the process."""
    port = free_port()
    env = {
        "ORBIT_HTTP_ADDR": f"127.0.0.1:{port}",
        "ORBIT_LOG_FORMAT": "json",
        "ORBIT_LOG_LEVEL": "warning",
        "ORBIT_SHUTDOWN_GRACE_S": "2",
        "ORBIT_CONSOLE": "off",
    }
    metrics_url = None
    if metrics:
        metrics_port = free_port()
        env |= {"ORBIT_METRICS": "open", "ORBIT_METRICS_ADDR": f"127.0.0.1:{metrics_port}"}
        metrics_url = f"http://127.0.0.1:{metrics_port}/metrics"
    env |= dict(settings or {})
    workdir = Path(tempfile.mkdtemp(prefix="orbit-bench-cmd-"))
    log = workdir / "node.log"
    with log.open("wb") as out:
        proc = await trio.lowlevel.open_process(
            command("node"),
            cwd=tree or REPO,
            env=orbit_environment(dsn, env),
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=out,
        )
    node = OrbitProcess(f"http://127.0.0.1:{port}", proc.pid, metrics_url, log)
    try:
        await wait_answering(node.url + "/readyz", proc, READY_TIMEOUT_S, node.log_tail)
        yield node
    finally:
        with trio.CancelScope(shield=True):
            await stop_process(proc, STOP_TIMEOUT_S)
        shutil.rmtree(workdir, ignore_errors=True)
