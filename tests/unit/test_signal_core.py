"""Signals between nodes without a database: the pure bookkeeping (``signal_core``), the
due times of the empty-result cache, and the claim pool waking a queue at a due time on
trio's clock."""

from __future__ import annotations

import math
import subprocess
import sys

import pytest
import trio
import trio.testing

from orbit_node.config import SchedulerLimits, SignalTiming
from orbit_node.dispatch.cache import EmptyResultCache
from orbit_node.dispatch.claim_pool import ClaimPool
from orbit_node.dispatch.scheduler import FairScheduler
from orbit_node.dispatch.signal_core import Heard, Outbox, ReadCursor, ReadPace, Watches, sort_out
from orbit_node.domain.errors import ConfigError
from orbit_node.store.signals import CANCEL, FINISHED, TASKS, WATCH, ReadSignal, Signal

from .test_claim_pool import ticket

ME, OTHER = "m" * 32, "o" * 32


def read(signal_id: int, kind: str = TASKS, *, origin: str = OTHER, queue="q", task=None, due_in_s=None):
    return ReadSignal(signal_id, origin, kind, queue if kind == TASKS else None, task, due_in_s)


# -- Outbox --------------------------------------------------------------------------------


def test_the_outbox_writes_each_signal_once_oldest_first_and_drops_beyond_its_limit():
    box = Outbox(limit=3)
    for signal in (Signal.tasks("a"), Signal.tasks("b"), Signal.tasks("a"), Signal.cancel("t")):
        assert box.add(signal)
    assert len(box) == 3
    assert not box.add(Signal.tasks("c"))
    assert box.dropped == 1
    assert box.take(2) == [Signal.tasks("a"), Signal.tasks("b")]
    assert box.take(5) == [Signal.cancel("t")]
    assert len(box) == 0


# -- ReadCursor ----------------------------------------------------------------------------


def ids(signals) -> list[int]:
    return [s.signal_id for s in signals]


def test_the_cursor_reads_after_its_start_and_hands_out_each_signal_once():
    cursor = ReadCursor(gap_wait_s=0.5)
    assert not cursor.started
    with pytest.raises(ValueError):
        cursor.read_from  # noqa: B018 - the property raises
    cursor.start(10)
    assert (cursor.read_from, cursor.missing) == (10, ())
    assert ids(cursor.accept([read(11), read(12)], now=0.0)) == [11, 12]
    assert (cursor.read_from, cursor.missing) == (12, ())
    # A page repeating what was handled (a read that raced) hands out nothing again.
    assert ids(cursor.accept([read(12)], now=0.1)) == []
    assert ids(cursor.accept([], now=0.2)) == []


def test_a_hole_in_the_ids_is_looked_for_until_it_commits():
    """Id 12 committed before id 11 (its insert started first but committed later)."""
    cursor = ReadCursor(gap_wait_s=0.5)
    cursor.start(10)
    assert ids(cursor.accept([read(12)], now=0.0)) == [12]
    assert (cursor.read_from, cursor.missing) == (12, (11,))
    assert ids(cursor.accept([read(13)], now=0.1)) == [13]
    assert cursor.missing == (11,)
    assert ids(cursor.accept([read(11), read(14)], now=0.2)) == [11, 14]
    assert (cursor.read_from, cursor.missing, cursor.gaps_given_up) == (14, (), 0)


def test_a_hole_that_never_fills_is_given_up_after_the_wait():
    """A rolled-back insert, or a cluster's auto-increment step: the id never appears."""
    cursor = ReadCursor(gap_wait_s=0.5)
    cursor.start(0)
    cursor.accept([read(1), read(3)], now=0.0)
    assert cursor.missing == (2,)
    cursor.accept([], now=0.49)
    assert cursor.missing == (2,)
    cursor.accept([], now=0.5)
    assert (cursor.missing, cursor.gaps_given_up) == ((), 1)


def test_a_jump_wider_than_the_holes_tracked_is_taken_as_it_is():
    cursor = ReadCursor(gap_wait_s=0.5, max_gaps=4)
    cursor.start(0)
    assert ids(cursor.accept([read(1), read(100)], now=0.0)) == [1, 100]
    assert (cursor.read_from, cursor.missing) == (100, ())
    cursor.accept([read(103)], now=0.1)
    assert cursor.missing == (101, 102)


def test_stopping_forgets_the_position():
    cursor = ReadCursor(gap_wait_s=0.5)
    cursor.start(5)
    cursor.accept([read(7)], now=0.0)
    cursor.stop()
    assert not cursor.started and cursor.missing == ()
    cursor.start(20)
    assert ids(cursor.accept([read(7), read(21)], now=1.0)) == [21]


# -- ReadPace ------------------------------------------------------------------------------


def test_reads_are_fast_while_signals_come_and_back_off_to_the_slow_interval():
    timing = SignalTiming(fast_interval_s=0.02, slow_interval_s=0.25, busy_s=10.0)
    pace = ReadPace(timing)
    assert pace.next_delay(0.0) == 0.25  # a node that heard nothing yet reads slowly
    pace.busy(1.0)
    assert pace.next_delay(1.0) == 0.02
    assert pace.next_delay(10.9) == 0.02
    delays = [pace.next_delay(11.0 + n) for n in range(6)]
    assert delays == [0.04, 0.08, 0.16, 0.25, 0.25, 0.25]
    pace.busy(20.0)
    assert pace.next_delay(20.0) == 0.02


def test_an_idle_node_reads_a_few_times_a_second():
    timing = SignalTiming()
    assert 1 / timing.slow_interval_s <= 5
    assert timing.fast_interval_s <= 0.02


def test_the_slow_interval_is_not_below_the_fast_one():
    with pytest.raises(ConfigError, match="slow_interval_s"):
        SignalTiming(fast_interval_s=0.5, slow_interval_s=0.1)


# -- sort_out ------------------------------------------------------------------------------


def test_what_a_page_of_signals_asks_of_a_node():
    page = [
        read(1, queue="a"),
        read(2, queue="a"),  # the same queue once
        read(3, queue="b", origin=ME),  # its own, acted on when written
        read(4, queue="c", due_in_s=1.5),
        read(5, queue="d", due_in_s=0.0),  # due already: wake now
        read(6, queue="e", origin=ME, due_in_s=2.0),  # its own due time: set when written
        read(7, CANCEL, task="t1"),
        read(8, CANCEL, task="t2", origin=ME),  # pushed when asked
        read(9, WATCH, task="t3"),
        read(10, WATCH, task="t3"),  # repeated: once
        read(11, WATCH, task="t4", origin=ME),  # its own request's
        read(12, FINISHED, task="t5"),
        read(13, FINISHED, task="t6", origin=ME),  # its own waiting requests were woken then
        read(14, "a kind of a later version"),  # ignored, as older nodes ignore watch and finished
    ]
    heard = sort_out(page, ME)
    assert heard == Heard(wake=("a", "d"), due=(("c", 1.5),), cancel=("t1",), watch=("t3",), finished=("t5",))
    assert heard and not Heard() and Heard(finished=("t",))


# -- Watches -------------------------------------------------------------------------------


def watches(**changes) -> Watches:
    return Watches(**({"keep_s": 60.0, "repeat_s": 20.0, "recent_s": 5.0, "limit": 100} | changes))


def test_a_node_writes_a_watch_of_a_task_once_per_repeat():
    book = watches()
    assert book.to_send("t", 0.0)
    assert not book.to_send("t", 19.9)
    assert book.to_send("u", 10.0)
    assert book.to_send("t", 20.1)
    assert not book.to_send("u", 29.0)


def test_only_a_finish_another_node_waits_for_is_told():
    book = watches()
    assert book.finished(["a"], 0.0) == []  # nobody waits: nothing is written
    assert book.heard(["b", "c"], 1.0) == []
    assert book.finished(["b", "d"], 2.0) == ["b"]
    # A watch is kept keep_s after it was heard (a repeat renews it).
    assert book.heard(["c"], 30.0) == []
    assert book.finished(["c"], 89.0) == ["c"]
    assert book.heard(["e"], 100.0) == []
    assert book.finished(["e"], 160.1) == []


def test_a_watch_heard_just_after_its_task_finished_here_is_told_at_once():
    """The waiting request read its task before it finished here, and its watch arrived
    after: the finish is remembered recent_s for exactly that."""
    book = watches()
    assert book.finished(["a", "b"], 10.0) == []
    assert book.heard(["a"], 14.9) == ["a"]
    assert book.heard(["b"], 15.1) == []  # finished more than recent_s ago: the node's check finds it


def test_the_watches_kept_are_bounded_oldest_first():
    book = watches(limit=2)
    book.heard(["a", "b", "c"], 0.0)
    assert book.finished(["a", "b", "c"], 1.0) == ["b", "c"]
    assert book.finished(["x", "y", "z"], 2.0) == []
    assert book.heard(["x", "z"], 3.0) == ["z"]  # x was forgotten: its waiter's own check finds it


# -- due times: the cache and the pool ----------------------------------------------------


def test_the_cache_names_each_queue_once_when_its_due_time_comes():
    cache = EmptyResultCache(ttl_s=60.0, max_entries=8, max_due=3)
    assert cache.next_due() is None
    cache.forget_queue_at("a", 5.0)
    cache.forget_queue_at("b", 2.0)
    cache.forget_queue_at("a", 3.0)
    assert cache.next_due() == 2.0
    assert cache.due_queues(1.9) == []
    assert cache.due_queues(3.0) == ["b", "a"]
    assert cache.next_due() == 5.0
    # Full: the latest due time goes (it costs that queue latency, nothing else).
    for when, queue in ((7.0, "c"), (6.0, "d"), (8.0, "e")):
        cache.forget_queue_at(queue, when)
    assert cache.dues_dropped == 1
    assert cache.due_queues(math.inf) == ["a", "d", "c"]


def sixty_second_cycle(claim) -> tuple[ClaimPool, list[object]]:
    """A pool whose empty results are remembered for 60 s, and the list it delivers to. The
    pace keeps P3's rate per second (4 claims a second, a quarter second apart), as
    ``test_signals.slow_cycle`` does: 4 claims per 60 s cycle would space them 15 s apart."""
    limits = SchedulerLimits(scan_cycle_s=60.0, claims_per_connection_per_cycle=240)
    return ClaimPool(FairScheduler(limits), claim=claim, release=None), []


async def test_a_waiting_claim_runs_at_its_queues_due_time_not_at_the_cache_expiry(autojump_clock):
    """Scan cycle 60 s: the first claim finds the queue empty; a task of it comes due 2.5 s
    later: the claim runs again at 2.5 s, not at 60 s."""
    calls: list[float] = []

    async def claim(request):
        calls.append(trio.current_time())
        return [] if len(calls) == 1 else ["task"]

    pool, delivered = sixty_second_cycle(claim)
    with trio.fail_after(100):
        async with trio.open_nursery() as nursery:
            await nursery.start(pool.run)
            start = trio.current_time()
            pool.request(ticket(), delivered.append)
            await trio.testing.wait_all_tasks_blocked()
            pool.request(ticket(), delivered.append)  # asks again: cached empty, waits
            pool.task_due("other", start + 1.0)  # another queue's due time wakes nobody
            pool.task_due("q", start + 2.5)
            while len(delivered) < 2:
                await trio.sleep(0.01)
            pool.close()
    assert delivered == [[], ["task"]]
    assert [round(t - start, 3) for t in calls] == [0.0, 2.5]


async def test_a_claim_running_when_its_queue_comes_due_is_not_remembered_empty(autojump_clock):
    """The claim's read may have been before the due time: its empty result says nothing
    about the task that came due, so the next request claims at once."""
    calls: list[float] = []
    release = trio.Event()

    async def claim(request):
        calls.append(trio.current_time())
        if len(calls) == 1:
            await release.wait()
        return []

    pool, delivered = sixty_second_cycle(claim)
    with trio.fail_after(100):
        async with trio.open_nursery() as nursery:
            await nursery.start(pool.run)
            start = trio.current_time()
            pool.request(ticket(), delivered.append)
            pool.task_due("q", start + 1.0)
            await trio.sleep(2.0)
            release.set()
            await trio.testing.wait_all_tasks_blocked()
            assert delivered == [[]]
            pool.request(ticket(), delivered.append)
            while len(delivered) < 2:
                await trio.sleep(0.01)
            pool.close()
    assert [round(t - start, 3) for t in calls] == [0.0, 2.0]


def test_the_bookkeeping_imports_neither_trio_nor_a_driver():
    code = (
        "import sys, orbit_node.dispatch.signal_core, orbit_node.dispatch.cache; "
        "sys.exit(bool({'trio', 'trio_mysql'} & set(sys.modules)))"
    )
    assert subprocess.run([sys.executable, "-c", code], check=False).returncode == 0
