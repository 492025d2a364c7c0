"""The SDK's reading of the node's Worker messages (``sdk/orbit_sdk/messages.py`` over the
shared codec, ``orbit_protocol.messages``): every message the node builds parses into its
value, a malformed one is a ``ProtocolError`` naming its type and field, an unknown type
is ``Unknown``; and how the Worker reacts to the last two on a live connection."""

from __future__ import annotations

import datetime as dt
import json
import logging

import attrs
import pytest
import trio
from trio_websocket import WebSocketRequest, serve_websocket

from orbit_node.workers import protocol as p
from orbit_sdk import ProtocolError, Worker, WorkerRejected, WorkerTask
from orbit_sdk.handlers import task_of
from orbit_sdk.messages import (
    Ack,
    AckResult,
    Cancel,
    CancelTask,
    Dispatch,
    DispatchedTask,
    Drain,
    Error,
    Heartbeat,
    Unknown,
    Welcome,
    parse_message,
)

from .test_worker_protocol import QUEUE, TASK, TOKEN, TRACEPARENT, FakeReservation

NODE = "f" * 32


def reservation(**changes: object) -> FakeReservation:
    """A reservation as ``protocol.dispatch_task`` reads it (a handler version apart from the payload's)."""
    return attrs.evolve(FakeReservation(payload_version="v2", attempt=2), **changes)


def welcome(**overrides: object) -> dict:
    values = {
        "connection_id": "c1",
        "node_id": NODE,
        "heartbeat_interval_s": 10.0,
        "heartbeat_timeout_s": 30.0,
        "max_message_bytes": 1 << 20,
        "reservation_lease_s": 30.0,
        "run_lease_s": 60.0,
        **overrides,
    }
    return p.Welcome(**values).to_json()


def frame(message: p.NodeMessage | dict) -> str:
    return p.dumps(message)


TASK_VALUE = WorkerTask(
    task_id=TASK,
    queue_id=QUEUE,
    handler="object.prepare",
    handler_version="v1",
    payload_version="v2",
    payload={"big": 123456789012345678901234567890},
    attempt=2,
    max_attempts=3,
)
LEASE = "2026-01-01T00:00:30.123456Z"
DISPATCHED = DispatchedTask(
    TASK, TOKEN, QUEUE, "object.prepare", "v1", "v2", {"big": 123456789012345678901234567890}, 2, 3, LEASE
)

# What the node builds (orbit_node/workers/protocol.py), and the value the SDK reads in it.
NODE_MESSAGES = [
    (p.Welcome("c1", NODE, 10.0, 30.0, 1 << 20, 30.0, 60.0), Welcome("c1", NODE, 10.0, 30.0, 1 << 20, 30.0, 60.0)),
    (p.Heartbeat(), Heartbeat()),
    (p.dispatch([reservation()]), Dispatch((DISPATCHED,))),
    (
        p.dispatch([reservation(priority=9, deadline=dt.datetime(2026, 1, 1, 0, 1), resource_key="printer-1")]),
        Dispatch(
            (attrs.evolve(DISPATCHED, priority=9, deadline="2026-01-01T00:01:00.000000Z", resource_key="printer-1"),)
        ),
    ),
    (
        p.dispatch([reservation(trace_context=f"{TRACEPARENT} vendor=opaque")]),
        Dispatch((attrs.evolve(DISPATCHED, traceparent=TRACEPARENT, tracestate="vendor=opaque"),)),
    ),
    (
        p.dispatch([reservation(parents=("a" * 32, "b" * 32))]),
        Dispatch((attrs.evolve(DISPATCHED, parents=("a" * 32, "b" * 32)),)),
    ),
    (
        p.Ack("finish", (p.AckResult(TASK, True, state="succeeded"), p.refused("b" * 32, "NOT_HELD")), "m7"),
        Ack("finish", (AckResult(TASK, True, state="succeeded"), AckResult("b" * 32, False, code="NOT_HELD")), "m7"),
    ),
    (
        p.Ack("renew", (p.AckResult(TASK, True, lease_expires_at="2026-01-01T00:01:00Z", cancel_requested=False),)),
        Ack("renew", (AckResult(TASK, True, lease_expires_at="2026-01-01T00:01:00Z", cancel_requested=False),)),
    ),
    (
        p.cancel([(TASK, "cancel_requested"), ("b" * 32, "deadline")]),
        Cancel((CancelTask(TASK, "cancel_requested"), CancelTask("b" * 32, "deadline"))),
    ),
    (p.drain("shutdown"), Drain("shutdown")),
    (p.drain("moved"), Drain("moved")),
    (p.Drain(), Drain()),
    (p.Error("NOT_FOUND", "no such queue", "queues[0]"), Error("NOT_FOUND", "no such queue", "queues[0]")),
    (p.Error("OUT_OF_ORDER", "a second hello"), Error("OUT_OF_ORDER", "a second hello")),
]


@pytest.mark.parametrize(("message", "value"), NODE_MESSAGES, ids=[m.type for m, _ in NODE_MESSAGES])
def test_each_message_the_node_sends_parses_into_its_value(message, value):
    parsed = parse_message(frame(message))
    assert parsed == value
    assert parsed.type == message.type
    assert parse_message(frame(message).encode()) == value


def test_a_handler_sees_the_dispatched_attempt():
    (dispatched,) = parse_message(frame(p.dispatch([reservation()]))).tasks
    assert task_of(dispatched) == TASK_VALUE
    traced = attrs.evolve(dispatched, priority=9, deadline="2026-01-01T00:01:00Z", traceparent=TRACEPARENT)
    assert task_of(traced) == attrs.evolve(
        TASK_VALUE, priority=9, deadline="2026-01-01T00:01:00Z", traceparent=TRACEPARENT
    )
    child = attrs.evolve(dispatched, parents=("a" * 32,))
    assert task_of(child) == attrs.evolve(TASK_VALUE, parent_ids=("a" * 32,))


def test_what_the_sdk_does_not_know_is_passed_over_and_absent_options_take_their_default():
    task = p.dispatch_task(reservation()).to_json()
    parsed = parse_message(json.dumps({"type": "dispatch", "tasks": [{**task, "later": 1}], "also": [2]}))
    assert parsed == Dispatch((DISPATCHED,))
    (dispatched,) = parsed.tasks
    assert (dispatched.priority, dispatched.deadline, dispatched.resource_key) == (0, None, None)
    # A payload may be null.
    null = parse_message(json.dumps({"type": "dispatch", "tasks": [{**task, "payload": None}]}))
    assert null.tasks[0].payload is None
    assert parse_message(
        json.dumps({"type": "cancel", "tasks": [{"task_id": TASK, "reason": "deadline", "x": 1}]})
    ) == (Cancel((CancelTask(TASK, "deadline"),)))
    assert parse_message('{"type": "heartbeat", "at": 1}') == Heartbeat()
    # Whole seconds are seconds.
    assert parse_message(frame(welcome(heartbeat_interval_s=5))).heartbeat_interval_s == 5.0


def test_an_unknown_type_is_its_own_value():
    assert parse_message('{"type": "surprise", "tasks": 1}') == Unknown("surprise")
    assert parse_message('{"type": "hello"}') == Unknown("hello")  # the Worker's, never the node's


def test_an_ack_result_is_undecided_only_when_refused_for_want_of_the_database_or_room():
    assert AckResult(TASK, False, code="UNAVAILABLE").undecided
    assert AckResult(TASK, False, code="RESOURCE_EXHAUSTED").undecided
    assert not AckResult(TASK, False, code="OWNERSHIP_LOST").undecided
    assert not AckResult(TASK, False).undecided
    assert not AckResult(TASK, True, code="UNAVAILABLE").undecided


def dispatched(**changes: object) -> dict:
    task = {**p.dispatch_task(reservation()).to_json(), **changes}
    return {"type": "dispatch", "tasks": [{k: v for k, v in task.items() if v is not ...}]}


ACK = p.Ack("start", (p.AckResult(TASK, True),), "m1").to_json()
# A message of each type with one field missing, of the wrong kind or out of its rule: the field's path.
MALFORMED = [
    ({k: v for k, v in welcome().items() if k != "heartbeat_timeout_s"}, "heartbeat_timeout_s", "missing"),
    (welcome(heartbeat_interval_s=0), "heartbeat_interval_s", "expected a positive number of seconds, got 0"),
    (welcome(run_lease_s="60"), "run_lease_s", "got a string"),
    (welcome(run_lease_s=True), "run_lease_s", "got true"),
    (welcome(max_message_bytes=1.5), "max_message_bytes", "expected an integer, got a number"),
    (welcome(max_message_bytes=0), "max_message_bytes", "expected an integer of at least 1, got 0"),
    (welcome(connection_id=None), "connection_id", "expected a string, got null"),
    (welcome(node_id="node-1"), "node_id", "expected a 32-hex id, got 'node-1'"),
    ({"type": "dispatch"}, "tasks", "missing"),
    ({"type": "dispatch", "tasks": {"0": {}}}, "tasks", "expected a list, got an object"),
    # A dispatch of nothing would be answered with an empty start, which the node refuses.
    ({"type": "dispatch", "tasks": []}, "tasks", "expected at least 1 item(s), got 0"),
    ({"type": "dispatch", "tasks": [[TASK]]}, "tasks[0]", "expected an object, got a list"),
    (dispatched(token=...), "tasks[0].token", "missing"),
    (dispatched(token="forged"), "tasks[0].token", "expected a fencing token, got 'forged'"),
    (dispatched(task_id=1), "tasks[0].task_id", "expected a string, got a number"),
    (dispatched(payload=...), "tasks[0].payload", "missing"),
    (dispatched(lease_expires_at=...), "tasks[0].lease_expires_at", "missing"),
    (dispatched(attempt=True), "tasks[0].attempt", "expected an integer, got true"),
    (dispatched(max_attempts="3"), "tasks[0].max_attempts", "expected an integer, got a string"),
    (dispatched(priority="9"), "tasks[0].priority", "expected an integer, got a string"),
    (dispatched(priority=0), "tasks[0].priority", "expected an integer 1..9, got 0"),
    (dispatched(deadline=1), "tasks[0].deadline", "expected a string, got a number"),
    ({**ACK, "results": [{"task_id": TASK}]}, "results[0].ok", "missing"),
    ({**ACK, "results": [{"task_id": TASK, "ok": "yes"}]}, "results[0].ok", "expected true or false, got a string"),
    ({**ACK, "results": [{"ok": True}]}, "results[0].task_id", "missing"),
    ({**ACK, "results": [{"task_id": TASK, "ok": False, "code": 503}]}, "results[0].code", "got a number"),
    ({**ACK, "id": 1}, "id", "expected a string, got a number"),
    ({k: v for k, v in ACK.items() if k != "of"}, "of", "missing"),
    ({**ACK, "of": "launch"}, "of", "expected one of 'start', 'renew', 'finish', 'release', 'attach', 'drain'"),
    ({"type": "cancel", "tasks": [{"task_id": None, "reason": "deadline"}]}, "tasks[0].task_id", "got null"),
    ({"type": "cancel", "tasks": [{"task_id": TASK, "reason": ["deadline"]}]}, "tasks[0].reason", "got a list"),
    ({"type": "cancel", "tasks": [{"task_id": TASK}]}, "tasks[0].reason", "missing"),
    ({"type": "error", "message": "refused"}, "code", "missing"),
    ({"type": "error", "code": "INTERNAL", "message": {}}, "message", "expected a string, got an object"),
    ({"type": "error", "code": "INTERNAL", "message": "x", "field": 3}, "field", "got a number"),
]


@pytest.mark.parametrize(("message", "field", "problem"), MALFORMED, ids=[f"{m['type']}.{f}" for m, f, _ in MALFORMED])
def test_a_malformed_message_is_a_protocol_error_naming_its_type_and_field(message, field, problem):
    with pytest.raises(ProtocolError) as caught:
        parse_message(json.dumps(message))
    assert caught.value.field == field
    assert str(caught.value).startswith(f"malformed {message['type']!r} message from the node: {field}: ")
    assert problem in str(caught.value)


@pytest.mark.parametrize(
    ("text", "field", "said"),
    [
        ("welcome", None, "not JSON"),
        (b"\xff", None, "not JSON"),
        ('["dispatch"]', None, "a list, not a JSON object"),
        ("null", None, "null, not a JSON object"),
        ('{"tasks": []}', "type", "no type: type: missing"),
        ('{"type": 7}', "type", "no type: type: expected a string, got a number"),
        ('{"type": null}', "type", "no type: type: expected a string, got null"),
    ],
)
def test_a_frame_that_is_no_message_is_a_protocol_error(text, field, said):
    with pytest.raises(ProtocolError, match=said) as caught:
        parse_message(text)
    assert caught.value.field == field


# -- how the Worker reacts, against a node of the test's own


def worker_for(port: int) -> Worker:
    worker = Worker(f"http://127.0.0.1:{port}", "orb_test", [QUEUE], capacity=2)
    worker.register("object.prepare", "v1", "v2", lambda task: None)
    return worker


async def test_an_unknown_type_answering_the_hello_rejects_the_worker(autojump_clock):
    async def answers_unknown(request: WebSocketRequest) -> None:
        ws = await request.accept()
        await ws.get_message()
        await ws.send_message('{"type": "surprise"}')
        await trio.sleep_forever()

    async with trio.open_nursery() as nursery:
        server = await nursery.start(serve_websocket, answers_unknown, "127.0.0.1", 0, None)
        with pytest.raises(WorkerRejected, match="answered the hello with 'surprise', expected 'welcome'") as caught:
            await worker_for(server.port).run()
        assert caught.value.code == "PROTOCOL"
        nursery.cancel_scope.cancel()


async def test_an_unknown_type_in_a_session_is_ignored(autojump_clock, caplog):
    """The session goes on: the Worker keeps its heartbeats going and never reconnects."""
    caplog.set_level(logging.WARNING, logger="orbit.sdk.worker")
    heard: list[str] = []

    async def node(request: WebSocketRequest) -> None:
        ws = await request.accept()
        heard.append(json.loads(await ws.get_message())["type"])
        await ws.send_message(frame(welcome()))
        await ws.send_message('{"type": "surprise", "tasks": "anything"}')
        await ws.send_message(frame(welcome()))
        while True:
            heard.append(json.loads(await ws.get_message())["type"])
            await ws.send_message(frame(p.Heartbeat()))

    async with trio.open_nursery() as nursery:
        server = await nursery.start(serve_websocket, node, "127.0.0.1", 0, None)
        worker = worker_for(server.port)
        await nursery.start(worker.run)
        with trio.fail_after(120):  # of the mock clock: past the heartbeat timeout, twice
            while heard.count("heartbeat") < 7:
                await trio.sleep(1)
        nursery.cancel_scope.cancel()
    assert heard[0] == "hello" and "hello" not in heard[1:]
    assert worker.connections == 1
    assert not [r for r in caplog.records if r.name == "orbit.sdk.worker"]


@pytest.mark.parametrize(
    ("after_hello", "said"),
    [
        (
            [welcome(), dispatched(token=...)],
            "worker connection lost (127.0.0.1:{port}: malformed 'dispatch' message from the node: tasks[0].token: missing)",
        ),
        (
            [{k: v for k, v in welcome().items() if k != "run_lease_s"}],
            "worker could not connect (127.0.0.1:{port}: malformed 'welcome' message from the node: run_lease_s: missing)",
        ),
    ],
    ids=["dispatch", "welcome"],
)
async def test_a_malformed_message_is_a_lost_connection_retried(autojump_clock, caplog, after_hello, said):
    caplog.set_level(logging.WARNING, logger="orbit.sdk.worker")
    hellos: list[float] = []

    async def node(request: WebSocketRequest) -> None:
        ws = await request.accept()
        await ws.get_message()
        hellos.append(trio.current_time())
        for message in after_hello:
            await ws.send_message(frame(message))
        await trio.sleep_forever()

    async with trio.open_nursery() as nursery:
        server = await nursery.start(serve_websocket, node, "127.0.0.1", 0, None)
        port = server.port
        worker = worker_for(port)
        nursery.start_soon(worker.run)
        with trio.fail_after(60):  # of the mock clock
            while len(hellos) < 2:
                await trio.sleep(0.1)
        nursery.cancel_scope.cancel()
    lines = [r.getMessage() for r in caplog.records if r.name == "orbit.sdk.worker"]
    assert lines and lines[0].startswith(said.format(port=port) + "; reconnecting in "), lines
