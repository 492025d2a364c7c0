"""schema/worker-protocol.schema.json says what the models of ``orbit_protocol.messages``
do: the same messages, and for each the same fields, required ones, kinds, bounds,
patterns and defaults (the file adds only descriptions, for readers in other languages).

A field added to a model, removed, renamed, made optional or given another bound fails
here until the file says the same (the last test shows it does)."""

from __future__ import annotations

from typing import Any

import attrs
import pytest

from orbit_protocol import messages as m

from ..protocol_schema import SCHEMA

ALL_MESSAGES = {**m.WORKER_MESSAGES, **m.NODE_MESSAGES}
# What the file has for people, not for validators.
PROSE = frozenset({"description", "title", "$schema", "$id"})


def resolved(node: Any) -> Any:
    """``node`` with its ``$ref``s replaced by what they name and its prose left out; the
    fields a ``required`` lists, in name order."""
    if isinstance(node, list):
        return [resolved(item) for item in node]
    if not isinstance(node, dict):
        return node
    if "$ref" in node:
        name = node["$ref"].removeprefix("#/$defs/")
        return resolved({**SCHEMA["$defs"][name], **{k: v for k, v in node.items() if k != "$ref"}})
    return {k: sorted(v) if k == "required" else resolved(v) for k, v in node.items() if k not in PROSE}


def in_the_file(message_type: str) -> Any:
    return resolved(SCHEMA["$defs"][message_type])


def differences(file: Any, model: Any, path: str = "") -> list[str]:
    """Where the file's schema and the model's differ, by path."""
    if isinstance(file, dict) and isinstance(model, dict):
        found = []
        for key in sorted(file.keys() | model.keys()):
            if key not in model:
                found.append(f"{path}/{key}: only in the file")
            elif key not in file:
                found.append(f"{path}/{key}: only in the model")
            else:
                found += differences(file[key], model[key], f"{path}/{key}")
        return found
    if isinstance(file, list) and isinstance(model, list) and len(file) == len(model):
        return [d for i, (a, b) in enumerate(zip(file, model, strict=True)) for d in differences(a, b, f"{path}/{i}")]
    return [] if file == model else [f"{path}: the file says {file!r}, the model {model!r}"]


def test_the_file_describes_every_message_of_the_models_and_no_other():
    in_file = {ref["$ref"].removeprefix("#/$defs/") for ref in SCHEMA["oneOf"]}
    assert in_file == set(ALL_MESSAGES)


@pytest.mark.parametrize("message_type", sorted(ALL_MESSAGES))
def test_the_file_says_what_the_model_of_each_message_does(message_type):
    model = resolved(ALL_MESSAGES[message_type].schema())
    assert differences(in_the_file(message_type), model) == []


def with_field(cls: type[m.Wire], name: str, **changes: Any) -> list[m.Field]:
    """``cls``'s fields with the one named ``name`` changed."""
    fields = list(cls.WIRE)
    index = next(i for i, f in enumerate(fields) if f.key == name)
    fields[index] = attrs.evolve(fields[index], **changes)
    return fields


@pytest.mark.parametrize(
    ("cls", "wire", "said"),
    [
        # A bound moved.
        (m.Drain, with_field(m.Drain, "reason", rule=m.Text(1, 65)), "/properties/reason/maxLength"),
        # A required field made optional.
        (m.Welcome, with_field(m.Welcome, "node_id", required=False), "/required:"),
        # A field renamed.
        (m.Cancel, with_field(m.Cancel, "tasks", key="items"), "/properties/items: only in the model"),
        # A field added.
        (m.Heartbeat, [m.Field("at", m.Seconds(), required=False)], "/properties/at: only in the model"),
        # A pattern changed.
        (m.Start, with_field(m.Start, "id", rule=m.Pattern(m.HEX32, "an id")), "/properties/id/pattern"),
    ],
    ids=["bound", "required", "renamed", "added", "pattern"],
)
def test_a_model_field_that_changes_makes_the_check_fail(monkeypatch, cls, wire, said):
    message_type = cls.type
    assert differences(in_the_file(message_type), resolved(cls.schema())) == []
    monkeypatch.setattr(cls, "WIRE", tuple(wire))
    found = differences(in_the_file(message_type), resolved(cls.schema()))
    assert any(said in line for line in found), found
