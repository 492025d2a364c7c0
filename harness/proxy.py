"""A loopback TCP proxy that injects network faults, switchable while a test runs.

    async with open_fault_proxy("127.0.0.1", 3306) as proxy:   # proxy.port is the new port
        proxy.latency_s = 0.05          # every chunk is forwarded 50 ms late
        proxy.stall()                   # bytes are held (and no more are read) until heal()
        proxy.blackhole(Direction.DOWN) # answers are read and dropped
        proxy.heal()                    # everything flows again (held bytes first)
        proxy.reset()                   # every open connection gets a TCP RST, both sides
        await proxy.half_close(Direction.DOWN)  # the clients see EOF; the servers do not
        proxy.refuse_new = True         # new connections are reset at once
        proxy.holding                   # how many connection directions hold stalled bytes now
        proxy.swallowed[Direction.UP]   # every byte a black hole dropped, per direction

Faults apply per direction: ``UP`` is client -> server, ``DOWN`` server -> client.
A peer's EOF is passed on as EOF (half-close), a broken side resets the other one.
"""

from __future__ import annotations

import enum
import socket
import struct
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import attrs
import trio

from orbit_node.domain.dsn import Dsn

# Bytes read per receive: large enough that a MySQL result or a WebSocket frame
# usually moves as one chunk.
CHUNK = 65536


class Flow(enum.Enum):
    PASS = "pass"
    # Bytes are held, and no more are read, until the flow changes (a partition that heals).
    STALL = "stall"
    # Bytes are read and dropped, and so is a FIN or RST (a partition that loses traffic).
    BLACKHOLE = "blackhole"


class Direction(enum.Flag):
    UP = enum.auto()  # client -> server
    DOWN = enum.auto()  # server -> client
    BOTH = UP | DOWN


def _rst(stream: trio.SocketStream) -> None:
    """Close a socket so that the peer gets a RST, not a FIN."""
    try:
        stream.socket.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    except OSError:
        pass
    stream.socket.close()


@attrs.define(eq=False)
class _Link:
    client: trio.SocketStream
    server: trio.SocketStream
    scope: trio.CancelScope = attrs.field(factory=trio.CancelScope)
    # Directions whose receiving side was sent an EOF by half_close(): bytes are dropped.
    shut: Direction = Direction(0)
    aborted: bool = False

    def abort(self) -> None:
        if not self.aborted:
            self.aborted = True
            self.scope.cancel()
            _rst(self.client)
            _rst(self.server)


@attrs.define(eq=False)
class FaultProxy:
    target_host: str
    target_port: int
    port: int = 0
    # Added before each chunk is forwarded, in both directions.
    latency_s: float = 0.0
    # New connections are accepted and reset at once (the target looks down).
    refuse_new: bool = False
    accepted: int = 0
    # Connection directions that hold bytes back because of a stall, right now.
    holding: int = 0
    # What black holes dropped, per direction (a test can tell which statement was lost).
    swallowed: dict[Direction, bytearray] = attrs.field(
        factory=lambda: {Direction.UP: bytearray(), Direction.DOWN: bytearray()}
    )
    _flows: dict[Direction, Flow] = attrs.field(factory=lambda: {Direction.UP: Flow.PASS, Direction.DOWN: Flow.PASS})
    _changed: trio.Event = attrs.field(factory=trio.Event)
    _links: set[_Link] = attrs.field(factory=set)

    @property
    def open_links(self) -> int:
        return len(self._links)

    def dsn_for(self, dsn: Dsn) -> Dsn:
        """``dsn`` (whose server this proxy forwards to) as reached through the proxy."""
        return attrs.evolve(dsn, host="127.0.0.1", port=self.port, unix_socket=None)

    # -- switching faults ---------------------------------------------------------------

    def _set(self, direction: Direction, flow: Flow) -> None:
        for d in (Direction.UP, Direction.DOWN):
            if d in direction:
                self._flows[d] = flow
        self._changed.set()
        self._changed = trio.Event()

    def stall(self, direction: Direction = Direction.BOTH) -> None:
        self._set(direction, Flow.STALL)

    def blackhole(self, direction: Direction = Direction.BOTH) -> None:
        self._set(direction, Flow.BLACKHOLE)

    def heal(self) -> None:
        self.latency_s = 0.0
        self.refuse_new = False
        self._set(Direction.BOTH, Flow.PASS)

    def reset(self) -> int:
        """RST every open connection on both sides; returns how many."""
        links = list(self._links)
        for link in links:
            link.abort()
        return len(links)

    async def half_close(self, direction: Direction) -> None:
        """Send EOF to the receiving side of ``direction`` on every open connection."""
        for link in list(self._links):
            for d, receiver in ((Direction.UP, link.server), (Direction.DOWN, link.client)):
                if d in direction and d not in link.shut:
                    link.shut |= d
                    try:
                        await receiver.send_eof()
                    except (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
                        pass

    # -- forwarding -----------------------------------------------------------------------

    async def _handle(self, client: trio.SocketStream) -> None:
        self.accepted += 1
        if self.refuse_new:
            _rst(client)
            return
        try:
            server = await trio.open_tcp_stream(self.target_host, self.target_port)
        except OSError:
            _rst(client)
            return
        link = _Link(client, server)
        self._links.add(link)
        try:
            with link.scope:
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(self._pump, link, client, server, Direction.UP)
                    nursery.start_soon(self._pump, link, server, client, Direction.DOWN)
        finally:
            self._links.discard(link)
            if not link.aborted:
                with trio.CancelScope(shield=True):
                    await client.aclose()
                    await server.aclose()

    async def _pump(self, link: _Link, src: trio.SocketStream, dst: trio.SocketStream, direction: Direction) -> None:
        while True:
            try:
                data = await src.receive_some(CHUNK)
            except (trio.BrokenResourceError, trio.ClosedResourceError):
                if self._flows[direction] is not Flow.BLACKHOLE:
                    link.abort()
                return
            if not data:
                # A black hole swallows the FIN too: the receiver never learns the peer left.
                if direction not in link.shut and self._flows[direction] is not Flow.BLACKHOLE:
                    try:
                        await dst.send_eof()
                    except (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
                        pass
                return
            if self._flows[direction] is Flow.STALL:
                self.holding += 1
                try:
                    while self._flows[direction] is Flow.STALL:
                        await self._changed.wait()
                finally:
                    self.holding -= 1
            if self._flows[direction] is Flow.BLACKHOLE:
                self.swallowed[direction] += data
                continue
            if direction in link.shut:
                continue
            if self.latency_s:
                await trio.sleep(self.latency_s)  # the fault itself: added latency
            try:
                await dst.send_all(data)
            except (trio.BrokenResourceError, trio.ClosedResourceError):
                link.abort()
                return


@asynccontextmanager
async def open_fault_proxy(target_host: str, target_port: int) -> AsyncIterator[FaultProxy]:
    """A proxy on a free port of 127.0.0.1 to ``target``; closed (connections reset) on exit."""
    proxy = FaultProxy(target_host, target_port)
    listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
    proxy.port = listeners[0].socket.getsockname()[1]
    async with trio.open_nursery() as nursery:
        nursery.start_soon(trio.serve_listeners, proxy._handle, listeners)
        try:
            yield proxy
        finally:
            proxy.reset()
            nursery.cancel_scope.cancel()
