"""Every message one side builds, the other side reads back unchanged.

Messages are drawn from their models' own rules (``WIRE``: patterns, bounds, kinds). A
Worker's, built as the SDK sends them (``orbit_sdk.session.frame``), are read by the node
(``orbit_node.workers.protocol.parse_message``: strict JSON, strict fields); the node's,
built as the node sends them (``protocol.dumps``), are read by the SDK
(``orbit_sdk.messages.parse_message``). Every frame built also keeps to
schema/worker-protocol.schema.json."""

from __future__ import annotations

import datetime as dt
import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from orbit_node.workers import protocol as node
from orbit_protocol import messages as m
from orbit_sdk import messages as sdk
from orbit_sdk.session import frame as sdk_frame

from ..protocol_schema import validate_message

JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False) | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=4), inner, max_size=3),
    max_leaves=8,
)
TIMES = st.datetimes(dt.datetime(1970, 1, 1), dt.datetime(9999, 12, 31)).map(
    lambda t: t.strftime("%Y-%m-%dT%H:%M:%S.%fZ")
)


def values(rule: m.Rule) -> st.SearchStrategy[Any]:
    """Values that keep to ``rule``, as a model holds them."""
    if rule == m.TIME:
        return TIMES
    if isinstance(rule, m.Pattern):
        return st.from_regex(rule.regex, fullmatch=True)
    if isinstance(rule, m.Text):
        return st.text(min_size=rule.low, max_size=min(rule.high or 12, 12))
    if isinstance(rule, m.Integer):
        return st.integers(rule.low, rule.high if rule.high is not None else 2**53)
    if isinstance(rule, m.Seconds):
        return st.floats(0, 1e9, exclude_min=True)
    if isinstance(rule, m.Flag):
        return st.booleans()
    if isinstance(rule, m.OneOf):
        return st.sampled_from(rule.values)
    if isinstance(rule, m.ListOf):
        return st.lists(values(rule.item), min_size=rule.low, max_size=max(rule.low, 3)).map(tuple)
    if isinstance(rule, m.Nested):
        return models(rule.cls)
    assert isinstance(rule, m.AnyJson), rule
    return JSON


def field_values(field: m.Field) -> st.SearchStrategy[Any]:
    return values(field.rule) if field.required else st.just(field.default) | values(field.rule)


def models(cls: type[m.Wire]) -> st.SearchStrategy[Any]:
    """Models of ``cls`` whose every field keeps to its rule."""
    special = SPECIAL.get(cls)
    if special is not None:
        return special
    return st.builds(cls, *(field_values(f) for f in cls.WIRE))


ERRORS = st.fixed_dictionaries({}, optional={f.key: values(f.rule) for f in m.ERROR_WIRE})
TASK_IDS = values(m.TASK_ID)
TOKENS = values(m.FENCING_TOKEN)


@st.composite
def hellos(draw: st.DrawFn) -> m.Hello:
    """A hello as the node reads one: each queue and each presented task once, at most
    ``capacity`` tasks."""
    tasks = draw(st.lists(st.builds(m.TaskRef, TASK_IDS, TOKENS), max_size=3, unique_by=lambda r: r.task_id))
    client = draw(st.none() | models(m.Client))
    return m.Hello(
        queues=tuple(draw(st.lists(TASK_IDS, min_size=1, max_size=3, unique=True))),
        capabilities=frozenset(draw(st.lists(models(m.Capability), min_size=1, max_size=3))),
        capacity=draw(st.integers(max(1, len(tasks)), m.MAX_CAPACITY)),
        resource_keys=draw(st.booleans()),
        client_name=None if client is None else client.name,
        client_version=None if client is None else client.version,
        tasks=tuple(tasks),
    )


SPECIAL: dict[type[m.Wire], st.SearchStrategy[Any]] = {
    m.Hello: hellos(),
    m.FinishReport: st.builds(m.FinishReport, TASK_IDS, TOKENS, st.just("succeeded"), JSON)
    | st.builds(m.FinishReport, TASK_IDS, TOKENS, st.just("failed"), st.none(), ERRORS, st.booleans()),
}


@pytest.mark.parametrize("cls", list(m.WORKER_MESSAGES.values()), ids=list(m.WORKER_MESSAGES))
@settings(max_examples=40, deadline=None)
@given(data=st.data())
def test_what_the_sdk_builds_the_node_reads_unchanged(cls, data):
    message = data.draw(models(cls))
    frame = sdk_frame(message)
    validate_message(frame, direction="worker")
    assert node.parse_message(frame) == message


@pytest.mark.parametrize("cls", list(m.NODE_MESSAGES.values()), ids=list(m.NODE_MESSAGES))
@settings(max_examples=40, deadline=None)
@given(data=st.data())
def test_what_the_node_builds_the_sdk_reads_unchanged(cls, data):
    message = data.draw(models(cls))
    frame = node.dumps(message)
    validate_message(frame, direction="node")
    assert sdk.parse_message(frame) == message
    # Nothing but what the model names: the node's own messages read strictly too.
    assert m.read_node_message(json.loads(frame), strict=True) == message


@settings(max_examples=50, deadline=None)
@given(st.lists(SPECIAL[m.FinishReport] | st.builds(m.TaskRef, TASK_IDS, TOKENS), min_size=1, max_size=4))
def test_the_short_way_reads_what_the_field_by_field_way_does(items):
    """``quick`` (a well-formed task reference or success, read at once) and ``read`` (every
    field checked) agree on every item that either takes."""
    for item in items:
        obj = item.to_json()
        cls = type(item)
        quick = cls.quick(obj)
        assert quick is None or quick == cls.read(obj, "tasks[0].") == item
