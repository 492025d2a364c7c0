"""Processes a scenario runs: a node (``python -m bench.nodeproc``, optionally of another
source tree) or any helper that writes a ready file; stopped with SIGTERM, then SIGKILL."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import tempfile
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import attrs
import trio

from harness.processes import stop_process
from orbit_node.domain.dsn import Dsn

from . import REPO

# Bound on a node process start (migrations are done before it starts).
NODE_START_TIMEOUT_S = 30
# Bound on a node process stop (graceful drain is 2 s in nodeproc).
NODE_STOP_TIMEOUT_S = 15


@attrs.define(eq=False)
class NodeProcess:
    url: str
    pid: int
    stats_path: Path

    def stats(self) -> list[dict[str, Any]]:
        """Every statistics line the node wrote so far (wall-clock ``t``)."""
        try:
            lines = self.stats_path.read_text().splitlines()
        except OSError:
            return []
        out = []
        for line in lines:
            try:
                out.append(json.loads(line))
            except ValueError:
                pass
        return out

    def last_stats(self) -> dict[str, Any]:
        stats = self.stats()
        return stats[-1] if stats else {}


@asynccontextmanager
async def ready_process(
    cmd: Sequence[str],
    ready: Path,
    *,
    name: str,
    start_timeout_s: float,
    stop_timeout_s: float,
    cwd: Path = REPO,
) -> AsyncIterator[tuple[trio.Process, dict[str, Any]]]:
    """Run ``cmd`` (from ``cwd``, the repository root by default) until it writes JSON to
    ``ready``; yield the process and that JSON; SIGTERM it on exit (SIGKILL after
    ``stop_timeout_s``)."""
    proc = await trio.lowlevel.open_process(list(cmd), cwd=cwd, stdin=subprocess.DEVNULL)
    try:
        with trio.fail_after(start_timeout_s):
            while not ready.exists():
                if proc.poll() is not None:
                    raise RuntimeError(f"{name} process exited with status {proc.returncode}")
                await trio.sleep(0.05)
        yield proc, json.loads(ready.read_text())
    finally:
        with trio.CancelScope(shield=True):
            await stop_process(proc, stop_timeout_s)


@asynccontextmanager
async def node_process(
    dsn: Dsn,
    *,
    claims_per_connection_per_cycle: int | None = None,
    claim_batch_size: int | None = None,
    stats_interval_s: float | None = None,
    run_lease_s: float | None = None,
    shards: str = "",
    tree: Path | None = None,
    task_clock: bool = False,
) -> AsyncIterator[NodeProcess]:
    """Start ``python -m bench.nodeproc`` on a free port of 127.0.0.1; SIGTERM it on exit.

    ``shards``: the node's ORBIT_SHARDS (none: every application on ``dsn``). ``tree``: a
    source tree of another commit (``git worktree add`` or ``git archive``) whose node to
    run, for a before/after pair in one run; its ``bench/nodeproc.py`` and ``orbit_node``
    are imported from there (``python -m`` puts the working directory first).
    ``task_clock``: the node times its trio tasks' steps (``bench.steps``)."""
    workdir = Path(tempfile.mkdtemp(prefix="orbit-bench-node-"))
    ready = workdir / "ready.json"
    stats = workdir / "stats.jsonl"
    cmd = [sys.executable, "-m", "bench.nodeproc", "--dsn", dsn.url(), "--ready", str(ready), "--stats", str(stats)]
    if claims_per_connection_per_cycle is not None:
        cmd += ["--claims-per-connection-per-cycle", str(claims_per_connection_per_cycle)]
    if claim_batch_size is not None:
        cmd += ["--claim-batch-size", str(claim_batch_size)]
    if stats_interval_s is not None:
        cmd += ["--stats-interval-s", str(stats_interval_s)]
    if run_lease_s is not None:
        cmd += ["--run-lease-s", str(run_lease_s)]
    if shards:
        cmd += ["--shards", shards]
    if task_clock:
        cmd.append("--task-clock")
    try:
        async with ready_process(
            cmd,
            ready,
            name="node",
            start_timeout_s=NODE_START_TIMEOUT_S,
            stop_timeout_s=NODE_STOP_TIMEOUT_S,
            cwd=REPO if tree is None else tree,
        ) as (proc, info):
            yield NodeProcess(info["url"], proc.pid, stats)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
