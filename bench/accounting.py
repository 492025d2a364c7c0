"""CPU accounting of a measured phase (/proc: the node, the harness, the machine) and
py-spy sampling of the node."""

from __future__ import annotations

import math
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import attrs
import trio

from .report import profile_summary


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of a live process (from /proc)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, IndexError, ValueError):
        return math.nan


def self_cpu_seconds() -> float:
    t = os.times()
    return t.user + t.system


def machine_busy_seconds() -> float:
    """CPU seconds all cores spent not idle since boot (/proc/stat), for load checks."""
    try:
        first = Path("/proc/stat").read_text().splitlines()[0].split()[1:]
        values = [int(v) for v in first]
        idle = values[3] + (values[4] if len(values) > 4 else 0)
        return (sum(values[:8]) - idle) / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return math.nan


@attrs.define(eq=False)
class CpuMeter:
    """CPU used during a phase: this process, extra processes by pid, and the whole machine."""

    pids: dict[str, int] = attrs.field(factory=dict)
    _start: dict[str, float] = attrs.field(factory=dict)
    _wall: float = 0.0

    def start(self) -> None:
        self._wall = time.perf_counter()
        self._start = {"harness": self_cpu_seconds(), "machine": machine_busy_seconds()}
        self._start.update({name: cpu_seconds(pid) for name, pid in self.pids.items()})

    def stop(self) -> dict[str, float]:
        wall = time.perf_counter() - self._wall
        now = {"harness": self_cpu_seconds(), "machine": machine_busy_seconds()}
        now.update({name: cpu_seconds(pid) for name, pid in self.pids.items()})
        used = {f"{name}_cpu_s": round(now[name] - self._start[name], 2) for name in now}
        used["wall_s"] = round(wall, 3)
        used["machine_utilisation"] = (
            round(used["machine_cpu_s"] / (wall * (os.cpu_count() or 1)), 3) if wall else math.nan
        )
        return used


@attrs.define(eq=False)
class Profiler:
    """py-spy sampling a process (on-CPU samples only); ``stop()`` returns a summary."""

    pid: int
    rate: int = 200
    _proc: trio.Process | None = None
    _out: Path | None = None
    _err: Path | None = None

    @staticmethod
    def available() -> bool:
        return (
            shutil.which("py-spy", path=os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")]))
            is not None
        )

    async def start(self) -> None:
        exe = shutil.which(
            "py-spy", path=os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")])
        )
        if exe is None:
            return
        self._out = Path(tempfile.mkstemp(prefix="orbit-pyspy-", suffix=".txt")[1])
        self._err = Path(tempfile.mkstemp(prefix="orbit-pyspy-", suffix=".err")[1])
        with open(self._err, "wb") as err:
            self._proc = await trio.lowlevel.open_process(
                [
                    exe,
                    "record",
                    "--pid",
                    str(self.pid),
                    "--rate",
                    str(self.rate),
                    "--nonblocking",
                    "--nolineno",
                    "--format",
                    "raw",
                    "--output",
                    str(self._out),
                ],
                stdout=subprocess.DEVNULL,
                stderr=err,
            )

    async def stop(self) -> dict[str, Any]:
        if self._proc is None or self._out is None or self._err is None:
            return {"samples": 0, "self": [], "inclusive": [], "error": "py-spy not available"}
        self._proc.send_signal(signal.SIGINT)
        with trio.move_on_after(30):
            await self._proc.wait()
        if self._proc.poll() is None:
            self._proc.kill()
            await self._proc.wait()
        try:
            text = self._out.read_text()
            err = self._err.read_bytes()
            if os.environ.get("ORBIT_BENCH_PROFILE_RAW"):
                Path(os.environ["ORBIT_BENCH_PROFILE_RAW"]).write_text(text)
        except OSError:
            text, err = "", b""
        finally:
            self._out.unlink(missing_ok=True)
            self._err.unlink(missing_ok=True)
        summary = profile_summary(text)
        if not summary["samples"]:
            summary["error"] = err.decode(errors="replace")[-300:]
        return summary


@attrs.define(eq=False)
class Measured:
    """What ``measured_phase`` found: CPU use and, when asked, the node's profile summary."""

    cpu: dict[str, float] = attrs.field(factory=dict)
    profile: dict[str, Any] | None = None


@asynccontextmanager
async def measured_phase(node_pid: int, *, profile: bool) -> AsyncIterator[Measured]:
    """CPU accounting of the phase (node, harness, machine) and, with ``profile``, py-spy on the node."""
    meter = CpuMeter({"node": node_pid})
    profiler = Profiler(node_pid) if profile else None
    result = Measured()
    meter.start()
    if profiler:
        await profiler.start()
    try:
        yield result
    finally:
        result.cpu = meter.stop()
        if profiler:
            with trio.CancelScope(shield=True):
                result.profile = await profiler.stop()
