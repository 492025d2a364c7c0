"""One live Worker connection: matching acks to requests, and batching Starts and Finishes.

``Session`` sends messages and hands each ack to the request that waits for it;
``Batcher`` coalesces the start (or finish) items of many tasks into one message;
``until_decided`` sends items again until the node decides them. The Worker
(``worker.py``) drives them; nothing here knows about handlers.
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Callable, Sequence
from typing import Any

import attrs
import trio
from trio_websocket import ConnectionClosed

from orbit_protocol.limits import MAX_TASKS_PER_MESSAGE
from orbit_protocol.messages import Finish, FinishReport, Release, Renew, Start, TaskRef, WorkerMessage

from .messages import Ack, AckResult, Welcome

# A message's frame as the SDK sends it: compact, every character beyond ASCII escaped (a
# lone surrogate in a handler's text then reaches the node as an escape it refuses, instead
# of failing the frame's UTF-8 encoding here).
_FRAME_JSON = json.JSONEncoder(separators=(",", ":"))


def frame(message: WorkerMessage) -> str:
    """The text of the frame that carries ``message``."""
    return _FRAME_JSON.encode(message.to_json())


# What a request names: a task (start, renew, release), or a task's outcome (finish).
Item = TaskRef | FinishReport
# The message of each kind of request.
REQUESTS: dict[str, Callable[[tuple[Any, ...], str], WorkerMessage]] = {
    "start": Start,
    "renew": Renew,
    "release": Release,
    "finish": Finish,
}

# Pause before an undecided Start or Finish is sent again: first, and cap (doubling).
UNDECIDED_RETRY_INITIAL_S = 0.25
UNDECIDED_RETRY_MAX_S = 2.0


class SessionLost(Exception):
    """The session's connection ended before the node answered: what was asked may or may
    not have been done, and is asked again on the next connection."""


@attrs.define(eq=False)
class Session:
    """One live connection: sending, and matching acks to requests by message id."""

    ws: Any
    welcome: Welcome
    # trio time of the last message from the node (heartbeat answers included).
    last_heard: float = attrs.field(factory=trio.current_time)
    _ids: itertools.count[int] = attrs.field(factory=lambda: itertools.count(1))
    _waiting: dict[str, trio.MemorySendChannel[tuple[AckResult, ...]]] = attrs.field(factory=dict)
    # Starts sent and not yet answered (a drain waits for them).
    busy: int = 0
    idle: trio.Event = attrs.field(factory=trio.Event)
    # Start and finish messages sent, by kind (the Worker's counters).
    sent: dict[str, int] = attrs.field(factory=lambda: {"start": 0, "finish": 0})
    starts: Batcher = attrs.field(init=False)
    finishes: Batcher = attrs.field(init=False)
    # The answer to the hello's ``tasks`` (an ``ack`` of ``attach``), once it came.
    attached: tuple[AckResult, ...] = ()
    attach_answered: trio.Event = attrs.field(factory=trio.Event)
    ended: bool = False

    def __attrs_post_init__(self) -> None:
        self.starts = Batcher(self, "start", self.sent)
        self.finishes = Batcher(self, "finish", self.sent)

    def end(self) -> None:
        """The connection is gone: every request still waiting raises ``SessionLost``."""
        self.ended = True
        for send in self._waiting.values():
            send.close()
        self._waiting.clear()
        self.starts.abandon()
        self.finishes.abandon()
        self.attach_answered.set()

    def enter(self) -> None:
        self.busy += 1
        self.idle = trio.Event()

    def leave(self) -> None:
        self.busy -= 1
        if self.busy == 0:
            self.idle.set()

    async def send(self, message: WorkerMessage) -> None:
        if self.ended:
            raise SessionLost("the connection is closed")
        try:
            await self.ws.send_message(frame(message))
        except (ConnectionClosed, trio.BrokenResourceError, trio.ClosedResourceError) as exc:
            raise SessionLost("the connection closed while sending") from exc

    async def request(self, kind: str, tasks: Sequence[Item]) -> tuple[AckResult, ...]:
        """Send a start/renew/finish/release and wait for its ack's results; ``SessionLost``
        if the connection ends first."""
        message_id = f"m{next(self._ids)}"
        send, recv = trio.open_memory_channel[tuple[AckResult, ...]](1)
        self._waiting[message_id] = send
        try:
            await self.send(REQUESTS[kind](tuple(tasks), message_id))
            return await recv.receive()
        except trio.EndOfChannel:
            raise SessionLost("the connection closed before the node answered") from None
        finally:
            self._waiting.pop(message_id, None)

    def resolve(self, ack: Ack) -> None:
        if ack.of == "attach" and ack.id is None:
            self.attached = ack.results
            self.attach_answered.set()
            return
        send = self._waiting.pop(ack.id, None) if ack.id is not None else None
        if send is not None:
            send.send_nowait(ack.results)


@attrs.define(eq=False)
class Batcher:
    """Coalesces the start (or finish) items of many tasks into one message.

    ``submit`` queues items and waits for their own results. ``run`` sends what is queued
    once the tick in which it was queued is over, waits for the ack, and meanwhile lets
    new items queue up for the next message (so one message is in flight per kind)."""

    session: Session
    kind: str
    # Messages sent per kind, shared with the Worker (a figure for tests and benchmarks).
    sent: dict[str, int]
    _queued: list[tuple[Item, trio.MemorySendChannel[AckResult | None]]] = attrs.field(factory=list)
    _sending: list[tuple[Item, trio.MemorySendChannel[AckResult | None]]] = attrs.field(factory=list)
    _wake: trio.Event = attrs.field(factory=trio.Event)

    async def submit(self, items: Sequence[Item]) -> list[AckResult | None]:
        """Queue ``items``; returns each one's result (None if the ack did not name it).
        ``SessionLost`` if the connection ends before the node answered them."""
        if self.session.ended:
            raise SessionLost("the connection is closed")
        waits = []
        for item in items:
            send, recv = trio.open_memory_channel[AckResult | None](1)
            self._queued.append((item, send))
            waits.append(recv)
        self._wake.set()
        try:
            return [await recv.receive() for recv in waits]
        except trio.EndOfChannel:
            raise SessionLost("the connection closed before the node answered") from None

    def abandon(self) -> None:
        """The connection is gone: whatever waits for an answer gets ``SessionLost``."""
        for _, send in (*self._queued, *self._sending):
            send.close()
        self._queued, self._sending = [], []

    async def run(self) -> None:
        while True:
            await self._wake.wait()
            # Whatever else is ready to run in this tick queues its items first.
            await trio.lowlevel.checkpoint()
            batch, self._queued = self._queued[:MAX_TASKS_PER_MESSAGE], self._queued[MAX_TASKS_PER_MESSAGE:]
            if not self._queued:
                self._wake = trio.Event()
            self.sent[self.kind] += 1
            self._sending = batch
            try:
                results = await self.session.request(self.kind, [item for item, _ in batch])
            except SessionLost:
                # The connection's end ends the session as well (its reader sees it).
                self.abandon()
                return
            self._sending = []
            by_id = {r.task_id: r for r in results}
            for item, send in batch:
                send.send_nowait(by_id.get(item.task_id))


async def until_decided(batcher: Batcher, items: Sequence[Item]) -> list[AckResult | None]:
    """Submit ``items``; the ones the node answers without deciding (``AckResult.undecided``)
    are submitted again after a pause (doubling up to ``UNDECIDED_RETRY_MAX_S``) until each has an answer that decides
    it. The session's end (the connection lost) stops the retries: ``SessionLost``."""
    results: list[AckResult | None] = [None] * len(items)
    waiting = list(range(len(items)))
    pause = UNDECIDED_RETRY_INITIAL_S
    while True:
        answers = await batcher.submit([items[i] for i in waiting])
        again = []
        for index, answer in zip(waiting, answers, strict=True):
            results[index] = answer
            if answer is not None and answer.undecided:
                again.append(index)
        if not again:
            return results
        waiting = again
        await trio.sleep(pause)
        pause = min(pause * 2, UNDECIDED_RETRY_MAX_S)
