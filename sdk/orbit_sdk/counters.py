"""What a Worker counts: the tasks that ended through its Finishes, by how they ended, and
its sessions and messages (``Worker``'s counters; ``docs/sdk.md``, "Counters")."""

from __future__ import annotations

from collections.abc import Mapping

import trio

from orbit_protocol.messages import FinishReport

from .handlers import TERMINAL_ENDS, task_end


class WorkerCounters:
    """The counters of ``Worker`` (which sets the state they read in its ``__init__``)."""

    _ends: dict[str, int]
    _progress: trio.Event
    _connections: int
    _messages_sent: dict[str, int]
    _drained: bool

    # -- counters

    @property
    def completed(self) -> int:
        """Tasks that ended ``succeeded`` by a Finish of this Worker."""
        return self._ends["completed"]

    @property
    def failed(self) -> int:
        """Tasks that ended ``failed`` by a Finish of this Worker: a ``PermanentError``, or a
        failure of their last attempt. A failed attempt that is retried is not counted here
        (see ``retried``)."""
        return self._ends["failed"]

    @property
    def cancelled(self) -> int:
        """Tasks that ended ``cancelled`` by a Finish of this Worker (their handler was
        stopped because a cancel was requested)."""
        return self._ends["cancelled"]

    @property
    def expired(self) -> int:
        """Tasks that ended ``expired`` by a Finish of this Worker (a failed attempt past the
        task's deadline, or whose retry could not start before it)."""
        return self._ends["expired"]

    @property
    def retried(self) -> int:
        """Failed attempts after which the node put the task back in its queue (it runs
        again, here or elsewhere): attempts, not tasks."""
        return self._ends["retried"]

    @property
    def finished(self) -> int:
        """Tasks that ended by a Finish of this Worker: ``completed + failed + cancelled + expired``."""
        return sum(self._ends[end] for end in TERMINAL_ENDS)

    @property
    def connections(self) -> int:
        """Sessions the node welcomed (1 + reconnects)."""
        return self._connections

    @property
    def messages_sent(self) -> Mapping[str, int]:
        """``start`` and ``finish`` messages sent (each carries every task ready in its batch)."""
        return self._messages_sent

    @property
    def drained(self) -> bool:
        """True once ``run`` ended because of ``drain()``."""
        return self._drained

    @property
    def worker_drained(self) -> bool:
        """The same as ``drained``."""
        return self._drained

    # -- waiting

    async def wait_completed(self, count: int) -> None:
        """Wait until ``completed`` reaches ``count``."""
        while self.completed < count:
            await self._progress.wait()

    async def wait_finished(self, count: int) -> None:
        """Wait until ``finished`` reaches ``count``: tasks that ended through this Worker,
        succeeded or not (retried attempts do not count)."""
        while self.finished < count:
            await self._progress.wait()

    def _finished(self, report: FinishReport, state: str | None, attempt: int, max_attempts: int) -> None:
        self._ends[task_end(report, state, attempt, max_attempts)] += 1
        self._progress.set()
        self._progress = trio.Event()
