"""The sans-IO Worker protocol: strict parsing, and outbound messages that match the schema."""

from __future__ import annotations

import datetime as dt
import json

import attrs
import jsonschema
import pytest
from hypothesis import given
from hypothesis import strategies as st

from orbit_node.domain import strict_json
from orbit_node.workers import protocol as p

from ..protocol_schema import validate_message

TASK = "0" * 31 + "1"
QUEUE = "a" * 32
TOKEN = "1-0123456789abcdef"

GOOD_INBOUND = [
    {
        "type": "hello",
        "queues": [QUEUE],
        "capabilities": [{"handler": "object.prepare", "handler_version": "v1", "payload_version": "v1"}],
        "capacity": 4,
        "resource_keys": True,
        "client": {"name": "orbit-python", "version": "0.1.0"},
    },
    {"type": "heartbeat"},
    {"type": "start", "tasks": [{"task_id": TASK, "token": TOKEN}]},
    {"type": "renew", "tasks": [{"task_id": TASK, "token": TOKEN}, {"task_id": "b" * 32, "token": "2-" + "f" * 16}]},
    {"type": "release", "tasks": [{"task_id": TASK, "token": TOKEN}]},
    {"type": "finish", "tasks": [{"task_id": TASK, "token": TOKEN, "outcome": "succeeded", "result": {"n": 10**30}}]},
    {
        "type": "finish",
        "tasks": [
            {
                "task_id": TASK,
                "token": TOKEN,
                "outcome": "failed",
                "retryable": False,
                "error": {"message": "boom", "code": "E1"},
            }
        ],
    },
    {"type": "drain"},
    {"type": "drain", "reason": "deploy"},
    {
        "type": "hello",
        "queues": [QUEUE],
        "capabilities": [{"handler": "object.prepare", "handler_version": "v1", "payload_version": "v1"}],
        "capacity": 2,
        "tasks": [{"task_id": TASK, "token": TOKEN}],
    },
]

BAD_INBOUND = [
    ("{", "MALFORMED_MESSAGE", None),
    ("[1]", "MALFORMED_MESSAGE", None),
    ('{"type":"heartbeat","type":"heartbeat"}', "MALFORMED_MESSAGE", None),
    ('{"type":"start","tasks":[{"task_id":"' + TASK + '","token":NaN}]}', "MALFORMED_MESSAGE", None),
    ('{"type":"launch"}', "UNKNOWN_TYPE", "type"),
    ('{"tasks":[]}', "INVALID_MESSAGE", "type"),
    ('{"type":7}', "INVALID_MESSAGE", "type"),
    ('{"type":"heartbeat","extra":1}', "INVALID_MESSAGE", "extra"),
    ('{"type":"hello","queues":[],"capabilities":[],"capacity":1}', "INVALID_MESSAGE", "queues"),
    (
        '{"type":"hello","queues":["'
        + QUEUE
        + '"],"capabilities":[{"handler":"h","handler_version":"v1","payload_version":"v1"}],"capacity":0}',
        "INVALID_MESSAGE",
        "capacity",
    ),
    (
        '{"type":"hello","queues":["'
        + QUEUE
        + '"],"capabilities":[{"handler":"h","handler_version":"v1","payload_version":"v1"}],"capacity":true}',
        "INVALID_MESSAGE",
        "capacity",
    ),
    ('{"type":"start","tasks":[{"task_id":"xyz","token":"' + TOKEN + '"}]}', "INVALID_MESSAGE", "tasks[0].task_id"),
    ('{"type":"start","tasks":[{"task_id":"' + TASK + '","token":"forged"}]}', "INVALID_MESSAGE", "tasks[0].token"),
    (
        '{"type":"finish","tasks":[{"task_id":"' + TASK + '","token":"' + TOKEN + '","outcome":"maybe"}]}',
        "INVALID_MESSAGE",
        "tasks[0].outcome",
    ),
    (
        '{"type":"finish","tasks":[{"task_id":"' + TASK + '","token":"' + TOKEN + '","outcome":"failed","result":1}]}',
        "INVALID_MESSAGE",
        "tasks[0].result",
    ),
]


@pytest.mark.parametrize("message", GOOD_INBOUND, ids=lambda m: m["type"])
def test_good_inbound_messages_parse_and_match_the_schema(message):
    validate_message(message, direction="worker")
    parsed = p.parse_message(json.dumps(message))
    assert type(parsed).__name__.lower() == message["type"]


@pytest.mark.parametrize("text,code,field", BAD_INBOUND)
def test_bad_inbound_messages_are_refused_with_a_code_and_the_schema_agrees(text, code, field):
    with pytest.raises(p.MessageRefused) as info:
        p.parse_message(text)
    assert info.value.code == code
    if field is not None:
        assert info.value.field == field
    try:
        as_json = strict_json.loads(text)
    except strict_json.NotStrictJson:
        return  # not JSON a schema can see (syntax, duplicate keys, NaN)
    with pytest.raises(jsonschema.ValidationError):
        validate_message(as_json)


@pytest.mark.parametrize("message", GOOD_INBOUND, ids=lambda m: m["type"])
def test_a_binary_frame_is_refused_whatever_it_holds_and_closes_the_connection(message):
    with pytest.raises(p.MessageRefused) as info:
        p.parse_message(json.dumps(message).encode())
    assert (info.value.code, info.value.close_code) == ("MALFORMED_MESSAGE", p.CLOSE_PROTOCOL)
    assert "binary" in info.value.message


@pytest.mark.parametrize(
    "text,why",
    [
        ('{"type":"heartbeat","note":"\\ud800"}', "lone UTF-16 surrogate"),
        ('{"type":"heartbeat","note":' + "[" * 70 + "]" * 70 + "}", "nested deeper than 64"),
        ('{"type":"heartbeat","note":1e999}', "out of range"),
        ('{"type":"heartbeat","note":' + "9" * 5000 + "}", "digits is too long"),
    ],
)
def test_a_message_is_read_as_strictly_as_a_request_body(text, why):
    """One strict JSON reader (``strict_json``) serves request bodies and protocol messages:
    what a body may not hold, a message may not either, before its fields are looked at."""
    with pytest.raises(p.MessageRefused) as info:
        p.parse_message(text)
    assert info.value.code == "MALFORMED_MESSAGE" and why in info.value.message, info.value.message


TASK_IDS = st.text("0123456789abcdef", min_size=32, max_size=32)
TOKENS = st.builds("{}-{}".format, st.integers(0, 9_999_999_999), st.text("0123456789abcdef", min_size=16, max_size=16))
RESULTS = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=4), inner, max_size=3),
    max_leaves=6,
)


@given(st.lists(st.tuples(TASK_IDS, TOKENS, st.none() | st.just("absent") | RESULTS), min_size=1, max_size=64))
def test_well_formed_batches_read_as_written(items):
    """Start and Finish batches read into what each item says (well-formed items take a
    shorter way than the field-by-field checks; the values are the same)."""
    start = p.parse_message(json.dumps({"type": "start", "tasks": [{"task_id": t, "token": k} for t, k, _ in items]}))
    assert start == p.Start(tuple(p.TaskRef(t, k) for t, k, _ in items), None)
    reports = []
    for task_id, token, result in items:
        report = {"task_id": task_id, "token": token, "outcome": "succeeded"}
        if result != "absent":
            report["result"] = result
        reports.append(report)
    finish = p.parse_message(json.dumps({"type": "finish", "id": "m-1", "tasks": reports}))
    expected = [p.FinishReport(t, k, "succeeded", None if r == "absent" else r, None, False) for t, k, r in items]
    assert finish == p.Finish(tuple(expected), "m-1")
    stored = [json.dumps(None if r == "absent" else r, separators=(",", ":"), ensure_ascii=False) for _, _, r in items]
    assert [report.result_json for report in finish.tasks] == stored


@pytest.mark.parametrize(
    "bad,field",
    [
        ({"note": 1}, "tasks[1].note"),
        ({"token": "x"}, "tasks[1].token"),
        ({"task_id": 7}, "tasks[1].task_id"),
        ({"error": {}}, "tasks[1].error"),
    ],
)
def test_one_bad_item_among_well_formed_ones_is_named(bad, field):
    good = {"task_id": TASK, "token": TOKEN, "outcome": "succeeded", "result": 1}
    with pytest.raises(p.MessageRefused) as info:
        p.parse_message(json.dumps({"type": "finish", "tasks": [good, {**good, **bad}, good]}))
    assert info.value.field == field
    refs = [{"task_id": TASK, "token": TOKEN}, {"task_id": TASK, "token": TOKEN, **bad}]
    if "error" not in bad:
        with pytest.raises(p.MessageRefused) as info:
            p.parse_message(json.dumps({"type": "start", "tasks": refs}))
        assert info.value.field == field


def test_finish_keeps_big_integers_exact():
    msg = p.parse_message(json.dumps(GOOD_INBOUND[5]))
    assert msg.tasks[0].result_json == '{"n":1000000000000000000000000000000}'


@attrs.frozen
class FakeReservation:
    task_id: str = TASK
    fencing_token: str = TOKEN
    queue_id: str = QUEUE
    handler: str = "object.prepare"
    handler_version: str = "v1"
    payload_version: str = "v1"
    payload_json: str = '{"big": 123456789012345678901234567890}'
    attempt: int = 1
    max_attempts: int = 3
    lease_expires_at: dt.datetime = dt.datetime(2026, 1, 1, 0, 0, 30, 123456)
    deadline: dt.datetime | None = None
    resource_key: str | None = None
    priority: int = 0
    trace_context: str | None = None
    parents: tuple[str, ...] = ()


TRACEPARENT = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"


def test_outbound_messages_match_the_schema():
    default = p.dispatch([FakeReservation()]).to_json()
    validate_message(default, direction="node")
    assert "priority" not in default["tasks"][0]
    assert p.dumps(default).count("123456789012345678901234567890") == 1
    prioritized = p.dispatch(
        [FakeReservation(priority=9, deadline=dt.datetime(2026, 1, 1, 0, 1), resource_key="r")]
    ).to_json()
    validate_message(prioritized, direction="node")
    assert prioritized["tasks"][0]["priority"] == 9
    traced = p.dispatch([FakeReservation(trace_context=f"{TRACEPARENT} vendor=opaque")]).to_json()
    validate_message(traced, direction="node")
    assert (traced["tasks"][0]["traceparent"], traced["tasks"][0]["tracestate"]) == (TRACEPARENT, "vendor=opaque")
    assert "traceparent" not in default["tasks"][0] and "tracestate" not in default["tasks"][0]
    child = p.dispatch([FakeReservation(parents=("a" * 32, "b" * 32))]).to_json()
    validate_message(child, direction="node")
    assert child["tasks"][0]["parents"] == ["a" * 32, "b" * 32] and "parents" not in default["tasks"][0]
    for message in [
        p.Welcome(
            connection_id="c1",
            node_id="f" * 32,
            heartbeat_interval_s=10,
            heartbeat_timeout_s=30,
            max_message_bytes=1 << 20,
            reservation_lease_s=30,
            run_lease_s=60,
        ),
        p.Heartbeat(),
        p.Ack(
            "start",
            (p.AckResult(TASK, True, state="running", lease_expires_at="2026-01-01T00:00:00.000000Z"),),
        ),
        p.Ack("finish", (p.refused(TASK, "OWNERSHIP_LOST"),)),
        p.cancel([(TASK, "deadline")]),
        p.drain("shutdown"),
        p.drain("moved"),
        p.Ack("drain", ()),
        p.Ack("attach", (p.AckResult(TASK, True, state="running"),)),
        p.Error("OUT_OF_ORDER", "hello first", "type"),
    ]:
        validate_message(p.dumps(message), direction="node")
    with pytest.raises(jsonschema.ValidationError):
        validate_message({"type": "dispatch", "tasks": [{**default["tasks"][0], "priority": 0}]})


def test_message_ids_are_parsed_and_echoed_in_acks():
    msg = p.parse_message(json.dumps({"type": "start", "id": "m-7", "tasks": [{"task_id": TASK, "token": TOKEN}]}))
    assert msg.id == "m-7"
    ack = p.Ack("start", (p.AckResult(TASK, True),), msg.id).to_json()
    validate_message(ack, direction="node")
    assert ack["id"] == "m-7"
    with pytest.raises(p.MessageRefused) as info:
        p.parse_message(json.dumps({"type": "renew", "id": "bad id!", "tasks": [{"task_id": TASK, "token": TOKEN}]}))
    assert info.value.field == "id"
