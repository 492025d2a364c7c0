"""A Worker in its own process, for tests that SIGSTOP or lose it.

    python -m harness.worker_proc script URL   # raw protocol driven through stdin/stdout
    python -m harness.worker_proc poison URL QUEUE_ID   # SDK Worker whose handler kills its process

The credential comes from ``ORBIT_TEST_WORKER_TOKEN`` (never the command line).
``script``: every line on stdin is a JSON message sent as is; every message received is
written to stdout as one JSON line; EOF on stdin closes the connection.
``poison``: the automatic Worker (capacity 1) for handler ``h`` v1/v1; the handler
SIGKILLs its own process, as a poison task that crashes its Worker would.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import attrs
import trio
from trio_websocket import ConnectionClosed, open_websocket_url

REPO = Path(__file__).resolve().parents[1]
# Bound on a Worker process connecting (it imports trio and the SDK first).
SPAWN_TIMEOUT_S = 30


def _ws_url(base_url: str) -> str:
    return base_url.replace("http://", "ws://") + "/v1/workers/connect"


async def script(base_url: str, token: str) -> None:
    headers = [(b"authorization", f"Bearer {token}".encode())]
    stdin = trio.lowlevel.FdStream(os.dup(0))
    async with open_websocket_url(_ws_url(base_url), extra_headers=headers) as ws:
        print(json.dumps({"type": "connected"}), flush=True)
        async with trio.open_nursery() as nursery:

            async def receive():
                try:
                    while True:
                        print(await ws.get_message(), flush=True)
                except ConnectionClosed as exc:
                    code = None if exc.reason is None else exc.reason.code
                    print(json.dumps({"type": "closed", "code": code}), flush=True)
                    nursery.cancel_scope.cancel()

            nursery.start_soon(receive)
            buffer = b""
            while True:
                chunk = await stdin.receive_some()
                if not chunk:
                    break
                buffer += chunk
                while b"\n" in buffer:
                    line, buffer = buffer.split(b"\n", 1)
                    if line.strip():
                        await ws.send_message(line.decode())
            nursery.cancel_scope.cancel()


async def poison(base_url: str, token: str, queue_id: str) -> None:
    from orbit_sdk.worker import Worker

    worker = Worker(url=base_url, token=token, queues=[queue_id], capacity=1)

    async def handler(task):
        print(json.dumps({"type": "running", "task_id": task.task_id, "attempt": task.attempt}), flush=True)
        os.kill(os.getpid(), signal.SIGKILL)

    worker.register("h", "v1", "v1", handler)
    await worker.run()


# -- the test side ---------------------------------------------------------------------------


def spawn_env(token: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("ORBIT_")}
    return {**env, "ORBIT_TEST_WORKER_TOKEN": token}


async def open_worker_process(mode: str, base_url: str, token: str, *args: str, **kwargs) -> trio.Process:
    return await trio.lowlevel.open_process(
        [sys.executable, "-m", "harness.worker_proc", mode, base_url, *args],
        env=spawn_env(token),
        cwd=str(REPO),
        **kwargs,
    )


@attrs.define(eq=False)
class ProcessSocket:
    """A ``script`` Worker process seen through the two calls ``wsclient.RawWorker`` uses."""

    process: trio.Process
    _buffer: bytes = b""

    @classmethod
    async def spawn(cls, base_url: str, token: str) -> ProcessSocket:
        process = await open_worker_process("script", base_url, token, stdin=subprocess.PIPE, stdout=subprocess.PIPE)
        sock = cls(process)
        with trio.fail_after(SPAWN_TIMEOUT_S):
            assert json.loads(await sock.get_message()) == {"type": "connected"}
        return sock

    async def send_message(self, text: str) -> None:
        assert self.process.stdin is not None  # spawned with a pipe
        await self.process.stdin.send_all(text.encode() + b"\n")

    async def get_message(self) -> str:
        assert self.process.stdout is not None  # spawned with a pipe
        while b"\n" not in self._buffer:
            chunk = await self.process.stdout.receive_some()
            if not chunk:
                raise EOFError("worker process ended")
            self._buffer += chunk
        line, self._buffer = self._buffer.split(b"\n", 1)
        return line.decode()

    def pause(self) -> None:
        self.process.send_signal(signal.SIGSTOP)

    def resume(self) -> None:
        self.process.send_signal(signal.SIGCONT)

    async def aclose(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGCONT)
            self.process.kill()
        await self.process.wait()


def main() -> None:
    mode, base_url, *rest = sys.argv[1:]
    token = os.environ["ORBIT_TEST_WORKER_TOKEN"]
    if mode == "script":
        trio.run(script, base_url, token)
    elif mode == "poison":
        [queue_id] = rest
        trio.run(poison, base_url, token, queue_id)
    else:
        raise SystemExit(f"unknown mode {mode!r}")


if __name__ == "__main__":
    main()
