"""Stopping a child process: the polite signal first, SIGKILL when it does not end in time."""

from __future__ import annotations

import signal

import trio


async def stop_process(proc: trio.Process, timeout_s: float) -> None:
    """SIGTERM ``proc`` and wait for it; SIGKILL it after ``timeout_s``."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        with trio.move_on_after(timeout_s):
            await proc.wait()
        if proc.poll() is None:
            proc.kill()
    await proc.wait()
