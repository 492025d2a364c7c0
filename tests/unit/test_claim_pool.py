"""The trio claim pool and a connection's timers, on trio's clock (no database needed:
the claim SQL is replaced by a function that records when it was called)."""

from __future__ import annotations

import inspect
import json
from types import SimpleNamespace

import attrs
import pytest
import trio
import trio.testing

from orbit_node.config import NodeConfig, SchedulerLimits
from orbit_node.dispatch.claim_pool import ClaimPool, PoolClosed
from orbit_node.dispatch.scheduler import FairScheduler, cache_key
from orbit_node.domain.claims import ClaimRequest
from orbit_node.domain.dsn import Dsn
from orbit_node.store.tenancy import Principal
from orbit_node.workers import protocol as p
from orbit_node.workers.connection import (
    Observer,
    QueueLookup,
    Registry,
    TransitionStore,
    Transport,
    WorkerConnection,
    WorkerConnectionClosed,
)

CAPS = frozenset({("h", "v1", "v1")})


def ticket(conn="c1", app="A", queue="q") -> ClaimRequest:
    return ClaimRequest(
        connection_id=conn,
        node_id="n",
        application_id=app,
        namespace_id="ns",
        queue_ids=(queue,),
        capabilities=CAPS,
        resource_key_support=False,
        limit=1,
    )


async def test_pool_paces_a_connection_to_four_claims_per_cycle(autojump_clock):
    calls: list[float] = []

    async def claim(request):
        calls.append(trio.current_time())
        await trio.sleep(0.001)
        return ["task"]

    pool = ClaimPool(FairScheduler(SchedulerLimits()), claim=claim, release=None)
    with trio.fail_after(10):
        async with trio.open_nursery() as nursery:
            await nursery.start(pool.run)
            results = []

            def deliver(result):
                results.append(result)
                if len(results) < 12:
                    pool.request(ticket(), deliver)  # always busy: asks again at once

            start = trio.current_time()
            pool.request(ticket(), deliver)
            while len(results) < 12:
                await trio.sleep(0.05)
            pool.close()
    cycles = [int((t - start) // 1.0) for t in calls]
    assert cycles == [0] * 4 + [1] * 4 + [2] * 4


async def test_pool_serves_empty_results_from_the_cache_for_one_cycle(autojump_clock):
    calls: list[float] = []

    async def claim(request):
        calls.append(trio.current_time())
        return []

    pool = ClaimPool(FairScheduler(SchedulerLimits()), claim=claim, release=None)
    with trio.fail_after(10):
        async with trio.open_nursery() as nursery:
            await nursery.start(pool.run)
            delivered = []

            def deliver(result):
                if isinstance(result, PoolClosed):
                    return
                delivered.append(trio.current_time())
                pool.request(ticket(), deliver)

            start = trio.current_time()
            pool.request(ticket(), deliver)
            await trio.sleep(3.5)
            pool.close()
    # One SQL probe per scan cycle, not one per request.
    assert [round(t - start, 3) for t in calls] == [0.0, 1.0, 2.0, 3.0]
    assert delivered[-1] <= start + 3.5


async def test_each_grant_reports_how_long_its_request_waited_for_its_turn(autojump_clock):
    async def claim(request):
        await trio.sleep(1.0)
        return ["task"]

    waited: list[tuple[str, float]] = []
    pool = ClaimPool(
        FairScheduler(SchedulerLimits(sql_slots=1)),
        claim=claim,
        release=None,
        observe_wait=lambda grant, seconds: waited.append((grant.request.application_id, seconds)),
    )
    with trio.fail_after(10):
        async with trio.open_nursery() as nursery:
            await nursery.start(pool.run)
            start = trio.current_time()
            delivered = []

            def again(result):  # A asks again as soon as its first claim ended (t=1)
                delivered.append(result)
                pool.request(ticket("c1", "A", "qA"), delivered.append)

            pool.request(ticket("c1", "A", "qA"), again)
            for conn, app in (("c2", "B"), ("c3", "C"), ("c4", "D")):
                pool.request(ticket(conn, app, f"q{app}"), delivered.append)
            await trio.sleep(0.5)
            pool.leave("c4")  # D leaves before its turn: no wait to report
            while len(delivered) < 4:
                await trio.sleep(0.1)
            pool.close()
    # One SQL slot, claims of 1 s: B waits one claim, C two; A's second request, made at
    # t=1, comes after B's and C's turns (t=3).
    assert [(app, round(seconds, 6)) for app, seconds in waited] == [("A", 0.0), ("B", 1.0), ("C", 2.0), ("A", 2.0)]
    assert round(trio.current_time() - start, 6) == 4.0


async def test_close_cancels_pending_requests_and_lets_in_flight_claims_deliver(autojump_clock):
    release_claim = trio.Event()

    async def claim(request):
        await release_claim.wait()
        return ["reservation"]

    pool = ClaimPool(FairScheduler(SchedulerLimits(in_flight_per_application=1)), claim=claim, release=None)
    got = {}
    with trio.fail_after(10):
        async with trio.open_nursery() as nursery:
            await nursery.start(pool.run)
            pool.request(ticket("c1"), lambda r: got.__setitem__("c1", r))
            pool.request(ticket("c2"), lambda r: got.__setitem__("c2", r))  # same application: waits
            await trio.testing.wait_all_tasks_blocked()
            pool.close()
            assert isinstance(got["c2"], PoolClosed)
            with pytest.raises(PoolClosed):
                pool.request(ticket("c3"), lambda r: None)
            release_claim.set()
    assert got["c1"] == ["reservation"]


async def test_results_of_a_departed_connection_are_released(autojump_clock):
    released = []
    go = trio.Event()

    async def claim(request):
        await go.wait()
        return [
            SimpleNamespace(task_id="t1", fencing_token="1-aa"),
            SimpleNamespace(task_id="t2", fencing_token="1-bb"),
        ]

    async def release(application_id, reservations):
        released.extend((application_id, *r) for r in reservations)

    pool = ClaimPool(FairScheduler(SchedulerLimits()), claim=claim, release=release)
    with trio.fail_after(10):
        async with trio.open_nursery() as nursery:
            await nursery.start(pool.run)
            pool.request(ticket(), lambda r: pytest.fail("delivered to a departed connection"))
            await trio.testing.wait_all_tasks_blocked()
            pool.leave("c1")
            go.set()
            await trio.testing.wait_all_tasks_blocked()
            pool.close()
    # Given back to the application's shard, named by the application of the request.
    assert released == [(ticket().application_id, "t1", "1-aa"), (ticket().application_id, "t2", "1-bb")]


@pytest.mark.parametrize("blocked_by", ["application_in_flight", "paced_out"])
async def test_the_pool_sleeps_while_a_waiting_request_can_only_wait(autojump_clock, blocked_by):
    """A request that cannot run (its application's claim is in flight, or its connection is
    paced out) next to an expired empty-result entry must not spin the pool's loop."""
    release_claim = trio.Event()
    limits = SchedulerLimits(in_flight_per_application=1, claims_per_connection_per_cycle=1)

    async def claim(request):
        if request.connection_id == "c1":
            await release_claim.wait()
            return []
        return []

    pool = ClaimPool(FairScheduler(limits), claim=claim, release=None)
    with trio.fail_after(100):
        async with trio.open_nursery() as nursery:
            await nursery.start(pool.run)
            if blocked_by == "application_in_flight":
                pool.request(ticket("c1"), lambda r: None)  # app A: its one claim stays in flight
                await trio.testing.wait_all_tasks_blocked()
                pool.request(ticket("c2", queue="q2"), lambda r: None)  # app A again: must wait
            else:
                pool.request(ticket("c2", app="B", queue="q2"), lambda r: None)
                await trio.testing.wait_all_tasks_blocked()
                pool.request(ticket("c2", app="B", queue="q2"), lambda r: None)  # paced out this cycle
            # An empty entry of the waiting request's queue that has expired by now.
            pool.scheduler.cache.store_empty(cache_key(ticket("c2", queue="q2"), "q2"), trio.current_time() - 5)
            pool.task_arrived("other-queue")  # one wake-up of the loop
            before = pool.statistics().rounds
            for _ in range(200):
                await trio.lowlevel.checkpoint()
            assert pool.statistics().rounds - before <= 3
            release_claim.set()
            pool.close()


class MemoryTransport:
    def __init__(self):
        self.to_node_send, self.to_node_recv = trio.open_memory_channel(100)
        self.sent: list[str] = []
        self.closed: tuple[int, str] | None = None

    async def receive(self):
        try:
            return await self.to_node_recv.receive()
        except trio.EndOfChannel:
            raise WorkerConnectionClosed("peer closed") from None

    async def send(self, text: str) -> None:
        self.sent.append(text)

    async def close(self, code: int, reason: str) -> None:
        self.closed = (code, reason)


@attrs.define
class StubRegistry:
    registered: int = 0
    unregistered: int = 0

    async def register(self, conn):
        self.registered += 1

    async def unregister(self, conn):
        self.unregistered += 1


class SilentObserver:
    def observe_dispatch(self, reservations):
        pass

    def observe_started(self, seconds):
        pass

    def observe_finish(self, results):
        pass

    def tasks_requeued(self, application_id, queue_id, due_at, due_in_s):
        pass

    def tasks_finished(self, application_id, task_ids):
        pass


class NoStore:
    """The stores of a connection that never gets past its hello."""

    async def start_many(self, items):
        raise AssertionError("no transition before hello")

    async def renew_many(self, items):
        raise AssertionError("no transition before hello")

    async def release_many(self, items):
        raise AssertionError("no transition before hello")

    async def finish_many(self, items, *, recorded_only=None):
        raise AssertionError("no transition before hello")

    async def attach_many(self, items):
        raise AssertionError("no transition before hello")

    async def get_queue(self, namespace_id, queue_id):
        raise AssertionError("no hello")


PRINCIPAL = Principal("c" * 32, "n" * 32, "default", "test", "a" * 32, "app", {})


def protocol_members(protocol: type) -> dict[str, inspect.Signature]:
    """Each method a Protocol names, with its signature."""
    return {name: inspect.signature(value) for name, value in vars(protocol).items() if not name.startswith("_")}


@pytest.mark.parametrize(
    "stub, protocol",
    [
        (MemoryTransport, Transport),
        (StubRegistry, Registry),
        (SilentObserver, Observer),
        (NoStore, TransitionStore),
        (NoStore, QueueLookup),
    ],
)
def test_the_stubs_implement_all_a_connection_asks_of_its_parts(stub, protocol):
    members = protocol_members(protocol)
    assert members, protocol
    for name, signature in members.items():
        assert hasattr(stub, name), f"{stub.__name__} lacks {protocol.__name__}.{name}"
        own = getattr(stub, name)
        assert list(inspect.signature(own).parameters) == list(signature.parameters), name
        assert inspect.iscoroutinefunction(own) == inspect.iscoroutinefunction(getattr(protocol, name)), name


async def test_a_silent_connection_is_closed_after_the_heartbeat_timeout(autojump_clock):
    config = NodeConfig(dsn=Dsn.parse("mysql://root@127.0.0.1/x"), heartbeat_timeout_s=30)
    registry = StubRegistry()
    transport = MemoryTransport()
    conn = WorkerConnection(
        "c_1",
        PRINCIPAL,
        transport,
        config=config,
        node_id="node-1",
        pool=ClaimPool(FairScheduler(config.scheduler), claim=None, release=None),
        shutdown_requested=trio.Event(),
        transitions=NoStore(),
        queues=NoStore(),
        registry=registry,
        observer=SilentObserver(),
    )
    start = trio.current_time()
    with trio.fail_after(100):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(conn.serve)
            await trio.sleep(20)
            await transport.to_node_send.send('{"type":"heartbeat"}')  # alive: the clock restarts
            await trio.sleep(25)
            assert transport.closed is None
            while transport.closed is None:
                await trio.sleep(1)
            await transport.to_node_send.aclose()
    assert transport.closed == (p.CLOSE_HEARTBEAT_TIMEOUT, "heartbeat timeout")
    assert trio.current_time() - start == pytest.approx(50, abs=1.5)
    assert [json.loads(t)["type"] for t in transport.sent] == ["heartbeat", "error"]
    assert (registry.registered, registry.unregistered) == (0, 1)


async def test_a_paced_out_request_widened_while_it_waits_claims_the_freed_capacity(autojump_clock):
    """Full claims: a request waiting for the next cycle takes what was freed meanwhile."""
    limits: list[int] = []
    times: list[float] = []

    async def claim(request):
        limits.append(request.limit)
        times.append(trio.current_time())
        return ["task"] * request.limit

    pool = ClaimPool(FairScheduler(SchedulerLimits()), claim=claim, release=None)
    delivered: list[object] = []
    with trio.fail_after(10):
        async with trio.open_nursery() as nursery:
            await nursery.start(pool.run)
            start = trio.current_time()
            for n in range(4):  # the connection's four claims of this cycle, at its four slots
                pool.request(ticket(), delivered.append)
                while len(delivered) <= n:
                    await trio.sleep(0.01)
            pool.request(attrs.evolve(ticket(), limit=2), delivered.append)
            await trio.sleep(0.1)
            pool.widen("c1", 5)  # capacity freed while it waits for the next cycle
            pool.widen("c1", 3)  # never lowered
            while len(delivered) < 5:
                await trio.sleep(0.05)
            pool.close()
    assert limits == [1, 1, 1, 1, 5]
    assert [round(t - start, 3) for t in times[:4]] == [0.0, 0.25, 0.5, 0.75]
    assert times[4] - start >= 1.0  # still paced: the fifth claim waited for the next cycle


async def test_a_claim_that_takes_fewer_than_it_asked_spends_no_further_grant_until_a_task_arrives(autojump_clock):
    """Tasks arriving one by one to an idle Worker (capacity 8): no claim without a task to
    take. The follow-up request after a short claim is held like one after an empty claim,
    so three arrivals in one cycle are served within it, beside the cycle's probe of the
    expired empty result (a second, empty claim per task would pace the connection out:
    probe, task, empty, task)."""
    available: list[str] = []
    claims: list[float] = []

    async def claim(request):
        claims.append(trio.current_time())
        taken = available[: request.limit]
        del available[: request.limit]
        return taken

    pool = ClaimPool(FairScheduler(SchedulerLimits(scan_cycle_s=1.0)), claim=claim, release=None)
    dispatched: dict[str, float] = {}
    with trio.fail_after(10):
        async with trio.open_nursery() as nursery:
            await nursery.start(pool.run)
            start = trio.current_time()

            def deliver(result):
                if isinstance(result, PoolClosed):
                    return
                for task in result:
                    dispatched[task] = trio.current_time() - start
                pool.request(attrs.evolve(ticket(), limit=8), deliver)  # room left: asks again

            pool.request(attrs.evolve(ticket(), limit=8), deliver)
            await trio.testing.wait_all_tasks_blocked()
            await trio.sleep(1.0)  # the next cycle: its probe (the empty result expired) runs first
            for n in range(3):
                await trio.sleep(0.1)
                available.append(f"t{n}")
                pool.task_arrived("q")
                await trio.testing.wait_all_tasks_blocked()
            await trio.sleep(0.5)
            pool.close()
    assert sorted(dispatched) == ["t0", "t1", "t2"]
    assert max(dispatched.values()) < 1.6
    # A probe per cycle, then a claim at each of the cycle's slots (a quarter second apart)
    # that has a task to take: t0 (1.1) and t1 (1.2) at 1.25, t2 (1.3) at 1.5.
    assert [round(t - start, 3) for t in claims] == [0.0, 1.0, 1.25, 1.5]
