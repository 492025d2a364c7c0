"""``orbit`` as a separate process that a test can SIGKILL and start again.

    node = NodeProcess(dsn, tmp_path / "node.log", env={"ORBIT_RESERVATION_LEASE_S": "30"})
    await node.start()            # returns once /healthz answers
    await node.kill()             # SIGKILL: no drain, no clean-up of any kind
    node.pause(); node.resume()   # SIGSTOP / SIGCONT: frozen, sockets open
    await node.start()            # a new process (new node id) on the same address
    node.log_text()               # everything both processes wrote

The process is the installed console script next to ``sys.executable``
(``.venv/bin/orbit``), with only the ``ORBIT_*`` variables given here.
"""

from __future__ import annotations

import os
import signal
import socket
import sys
from collections.abc import Callable, Mapping
from pathlib import Path

import attrs
import httpx
import trio

from orbit_node.domain.dsn import Dsn

# The console scripts of the running interpreter's environment (.venv/bin).
BIN = Path(sys.executable).parent
# Bound on a node process starting to answer /healthz.
START_TIMEOUT_S = 20


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def orbit_environment(dsn: Dsn, settings: Mapping[str, str]) -> dict[str, str]:
    """The environment of an Orbit process: this one's without its ``ORBIT_*`` variables
    (a setting of the caller's shell must not leak into the process under test), plus the
    DSN and ``settings``."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("ORBIT_")}
    env["ORBIT_MYSQL_DSN"] = dsn.url()
    env.update(settings)
    return env


async def wait_answering(
    url: str, process: trio.Process, timeout_s: float, log_tail: Callable[[], str], *, poll_s: float = 0.1
) -> None:
    """Until ``GET url`` answers 200; a RuntimeError with ``log_tail()`` when ``process``
    exits first or ``timeout_s`` runs out."""
    async with httpx.AsyncClient(timeout=2) as http:
        with trio.move_on_after(timeout_s):
            while True:
                if process.poll() is not None:
                    raise RuntimeError(f"orbit exited with status {process.returncode}: {log_tail()}")
                try:
                    if (await http.get(url)).status_code == 200:
                        return
                except httpx.TransportError:
                    pass
                await trio.sleep(poll_s)  # bounded poll: the process tells nothing else when it is up
    raise RuntimeError(f"orbit did not answer {url} within {timeout_s:g} s: {log_tail()}")


@attrs.define(eq=False)
class NodeProcess:
    dsn: Dsn
    log_path: Path
    env: Mapping[str, str] = attrs.field(factory=dict)
    port: int = attrs.field(factory=free_port)
    process: trio.Process | None = None
    # Environment of the process only (LD_PRELOAD and the like), not ORBIT_* settings.
    process_env: Mapping[str, str] = attrs.field(factory=dict)

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def environment(self) -> dict[str, str]:
        settings = {
            "ORBIT_HTTP_ADDR": f"127.0.0.1:{self.port}",
            "ORBIT_LOG_LEVEL": "info",
            "ORBIT_SHUTDOWN_GRACE_S": "1",
        }
        return orbit_environment(self.dsn, {**settings, **self.env, **self.process_env})

    async def start(self) -> None:
        assert not self.running, "already running"
        with open(self.log_path, "ab") as log:
            self.process = await trio.lowlevel.open_process(
                [str(BIN / "orbit")], env=self.environment(), stdout=log, stderr=log
            )
        await wait_answering(
            self.base_url + "/healthz", self.process, START_TIMEOUT_S, lambda: self.log_text()[-2000:], poll_s=0.05
        )

    async def kill(self) -> None:
        """SIGKILL: the process gets no chance to drain, release or deregister anything."""
        assert self.process is not None
        self.process.send_signal(signal.SIGKILL)
        await self.process.wait()
        self.process = None

    def pause(self) -> None:
        """SIGSTOP: the process keeps its sockets open and answers nothing until ``resume``."""
        assert self.process is not None
        self.process.send_signal(signal.SIGSTOP)

    def resume(self) -> None:
        assert self.process is not None
        self.process.send_signal(signal.SIGCONT)

    async def terminate(self, timeout_s: float = 15) -> int:
        assert self.process is not None
        self.process.send_signal(signal.SIGTERM)
        with trio.fail_after(timeout_s):
            code = await self.process.wait()
        self.process = None
        return code

    async def aclose(self) -> None:
        if self.running:
            await self.kill()

    def log_text(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""
