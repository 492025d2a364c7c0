"""The Worker protocol's messages as values, both directions: the one codec of the node and
the SDK (``docs/worker-protocol.md``).

Worker -> node: ``hello``, ``heartbeat``, ``start``, ``renew``, ``finish``, ``release``, ``drain``.
Node -> Worker: ``welcome``, ``heartbeat``, ``dispatch``, ``ack``, ``cancel``, ``drain``, ``error``.

Every message is a frozen attrs class whose ``WIRE`` names each of its JSON fields once:
the key, the ``Rule`` its value keeps to (its kind, its bounds from ``limits``, its
pattern), whether it is required, and its default. A message is built with ``to_json()``
(the JSON object; ``dumps`` gives the text of its frame) and read from a decoded frame by
``read_worker_message`` or ``read_node_message``, which raise ``Invalid`` naming the field
at fault. ``schema/worker-protocol.schema.json`` describes the same messages for other
languages; ``tests/unit/test_protocol_schema.py`` checks it against ``WIRE``.

One set of rules, two readers. The node reads a Worker's messages strictly: a field or a
type it does not know is refused. The SDK reads the node's tolerantly: fields and types it
does not know are passed over, so a Worker keeps working with a node that adds one. Every
known field is checked alike on both sides.

Batching: one ``dispatch`` carries every reservation of a claim, and ``start``, ``renew``,
``finish`` and ``release`` each carry a list of tasks, acknowledged by one ``ack`` with a
result per task, so a busy Worker pays one round trip per batch, not per task per
transition.

Messages are frozen. The parts a message holds one of per task (``TaskRef``,
``FinishReport``, ``DispatchedTask``, ``AckResult``, ``CancelTask``) are plain attrs
classes compared by value, never changed once built: the node builds or reads one per
task per transition, and a frozen class costs three times as much to construct.

Pure: no I/O, and no JSON decoding either (each side decodes a frame as it must: the node
strictly, ``orbit_node.domain.strict_json``).
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from typing import Any, ClassVar

import attrs

from .limits import (
    MAX_CAPABILITIES,
    MAX_CAPACITY,
    MAX_DISPATCHED_PARENTS,
    MAX_DRAIN_REASON_CHARS,
    MAX_ERROR_CODE_CHARS,
    MAX_ERROR_MESSAGE_CHARS,
    MAX_PRIORITY,
    MAX_QUEUES,
    MAX_RESOURCE_KEY_CHARS,
    MAX_TASKS_PER_MESSAGE,
    MAX_TRACEBACK_CHARS,
    MAX_TRACESTATE_CHARS,
)

# WebSocket close codes the node uses (docs/worker-protocol.md).
CLOSE_NORMAL = 1000
CLOSE_GOING_AWAY = 1001  # node shutting down, after drain
CLOSE_POLICY = 1008  # permission problems found after the handshake
CLOSE_TOO_BIG = 1009  # message over the configured limit
CLOSE_INTERNAL = 1011
CLOSE_HEARTBEAT_TIMEOUT = 4000  # nothing received for heartbeat_timeout_s
CLOSE_PROTOCOL = 4002  # out-of-order or repeated protocol violations, binary frames
CLOSE_SLOW_CONSUMER = 4003  # the Worker reads too slowly: its outbound buffer is full
CLOSE_MOVED = 4004  # the node is full: the slot went to an application under its fair share

# Names a Worker declares and a task carries (the node's task rules use the same, so every
# capability a Worker declares can match an accepted task).
HEX32 = re.compile(r"[0-9a-f]{32}")
HANDLER_NAME = re.compile(r"[A-Za-z0-9._:/-]{1,200}")
VERSION = re.compile(r"[A-Za-z0-9._+-]{1,64}")
# A fencing token: the attempt number and 16 random hex digits.
TOKEN = re.compile(r"[0-9]{1,10}-[0-9a-f]{16}")
# Chosen by the Worker, echoed in the ack.
MESSAGE_ID = re.compile(r"[A-Za-z0-9._:-]{1,64}")
# RFC 3339 (the node writes UTC with microseconds, on the database's clock).
TIMESTAMP = re.compile(
    r"[0-9]{4}-[0-9]{2}-[0-9]{2}[Tt][0-9]{2}:[0-9]{2}:[0-9]{2}(?:\.[0-9]+)?(?:[Zz]|[+-][0-9]{2}:[0-9]{2})"
)
TRACEPARENT = re.compile(r"00-[0-9a-f]{32}-[0-9a-f]{16}-[0-9a-f]{2}")

# Why the node asks a Worker to drain: it shuts down, or it gave the connection's slot to
# an application under its fair share. Either way the Worker moves: it reconnects (to
# another node, given several) and re-attaches what runs there.
DRAIN_REASONS = ("shutdown", "moved")
CANCEL_REASONS = ("cancel_requested", "deadline")
# What an ack answers: a transition, the tasks a hello presented (attach), a drain.
ACK_OF = ("start", "renew", "finish", "release", "attach", "drain")
# A task's state as an ack result says it.
TASK_STATES = ("queued", "reserved", "running", "succeeded", "failed", "cancelled", "expired")
# Ack codes of a transition the node could not decide (its database out of reach, its
# queue of transitions full): nothing changed, the connection still holds the task, and
# the same transition is to be sent again.
UNDECIDED = frozenset({"UNAVAILABLE", "RESOURCE_EXHAUSTED"})

# Every message's text: compact, UTF-8 as it is, strict (no NaN).
_MESSAGE_JSON = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False, allow_nan=False)
# A succeeded task's result as the node stores it: compact, UTF-8 as it is.
_RESULT_JSON = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False)


class Invalid(ValueError):
    """A message that breaks a rule of the protocol.

    ``code`` is the node's ``error`` code (``MALFORMED_MESSAGE``, ``UNKNOWN_TYPE``,
    ``INVALID_MESSAGE``), ``text`` what the node tells the Worker, ``field`` the path of
    the field at fault (``tasks[0].token``; None for the frame as a whole) and ``problem``
    what is wrong with it without its path (``missing``, ``expected a string, got null``),
    for a reader that names the path itself. ``message_type`` is the type of the message
    it was found in, once known."""

    def __init__(self, code: str, text: str, *, field: str | None = None, problem: str | None = None) -> None:
        super().__init__(text)
        self.code = code
        self.text = text
        self.field = field
        self.problem = text if problem is None else problem
        self.message_type: str | None = None


def _invalid(text: str, field: str, problem: str) -> Invalid:
    return Invalid("INVALID_MESSAGE", text, field=field, problem=problem)


def kind(value: Any) -> str:
    """What a JSON value is, as an error says it."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return "a number"
    if isinstance(value, str):
        return "a string"
    return "a list" if isinstance(value, list) else "an object"


def _shown(value: Any) -> str:
    """A value of the right kind that breaks its rule, as an error shows it."""
    if isinstance(value, str):
        return repr(value if len(value) <= 40 else value[:37] + "...")
    if isinstance(value, int | float) and not isinstance(value, bool):
        return repr(value)
    return kind(value)


# -- rules -----------------------------------------------------------------------------


class Rule:
    """What one JSON value of a message must be.

    ``json_kind`` is the JSON kind it must be of and ``expected`` the whole rule, as an
    error says them; an ``opaque`` rule (a pattern) is told to a Worker as "invalid value".
    ``quick`` returns the value read when it keeps to the rule, else None (then ``check``
    looks closer and raises ``Invalid`` naming the field): the one-call way for the
    values that are almost always right."""

    json_kind: ClassVar[str] = "a value"
    opaque: ClassVar[bool] = False

    @property
    def expected(self) -> str:
        return self.json_kind

    def of_kind(self, value: Any) -> bool:
        return True

    def accepts(self, value: Any) -> bool:
        return self.of_kind(value)

    def quick(self, value: Any) -> Any:
        return value if self.accepts(value) else None

    def check(self, value: Any, field: str, strict: bool, label: str | None = None) -> Any:
        if self.accepts(value):
            return value
        raise self.refused(value, field, label)

    def refused(self, value: Any, field: str, label: str | None = None) -> Invalid:
        said = field if label is None else label
        text = f"{said}: invalid value" if self.opaque else f"{said}: expected {self.expected}"
        if self.of_kind(value):
            return _invalid(text, field, f"expected {self.expected}, got {_shown(value)}")
        return _invalid(text, field, f"expected {self.json_kind}, got {kind(value)}")

    def build(self, value: Any) -> Any:
        """The JSON value of a model's ``value``."""
        return value

    def schema(self) -> dict[str, Any]:
        return {}


class AnyJson(Rule):
    """Any JSON value (a payload, a result, an error's details)."""


@attrs.frozen
class Pattern(Rule):
    regex: re.Pattern[str]
    what: str
    # The JSON Schema format it stands for, instead of its pattern (date-time).
    format: str | None = None
    json_kind: ClassVar[str] = "a string"
    opaque: ClassVar[bool] = True

    @property
    def expected(self) -> str:
        return self.what

    def of_kind(self, value: Any) -> bool:
        return type(value) is str

    def accepts(self, value: Any) -> bool:
        return type(value) is str and self.regex.fullmatch(value) is not None

    def schema(self) -> dict[str, Any]:
        if self.format is not None:
            return {"type": "string", "format": self.format}
        return {"type": "string", "pattern": f"^{self.regex.pattern}$"}


@attrs.frozen
class Text(Rule):
    low: int = 0
    high: int | None = None
    json_kind: ClassVar[str] = "a string"

    @property
    def expected(self) -> str:
        if self.high is None:
            return "a string" if not self.low else f"a string of at least {self.low} characters"
        if not self.low:
            return f"a string of at most {self.high} characters"
        return f"a string of {self.low}..{self.high} characters"

    def of_kind(self, value: Any) -> bool:
        return type(value) is str

    def accepts(self, value: Any) -> bool:
        return type(value) is str and self.low <= len(value) and (self.high is None or len(value) <= self.high)

    def schema(self) -> dict[str, Any]:
        schema: dict[str, Any] = {"type": "string"}
        if self.low:
            schema["minLength"] = self.low
        if self.high is not None:
            schema["maxLength"] = self.high
        return schema


@attrs.frozen
class Integer(Rule):
    low: int
    high: int | None = None
    json_kind: ClassVar[str] = "an integer"

    @property
    def expected(self) -> str:
        return f"an integer of at least {self.low}" if self.high is None else f"an integer {self.low}..{self.high}"

    def of_kind(self, value: Any) -> bool:
        return type(value) is int

    def accepts(self, value: Any) -> bool:
        return type(value) is int and self.low <= value and (self.high is None or value <= self.high)

    def schema(self) -> dict[str, Any]:
        schema: dict[str, Any] = {"type": "integer", "minimum": self.low}
        if self.high is not None:
            schema["maximum"] = self.high
        return schema


class Seconds(Rule):
    """A positive number of seconds, read as a float."""

    json_kind: ClassVar[str] = "a number"

    @property
    def expected(self) -> str:
        return "a positive number of seconds"

    def of_kind(self, value: Any) -> bool:
        return type(value) is float or type(value) is int

    def accepts(self, value: Any) -> bool:
        return (type(value) is float or type(value) is int) and value > 0

    def quick(self, value: Any) -> Any:
        return float(value) if self.accepts(value) else None

    def check(self, value: Any, field: str, strict: bool, label: str | None = None) -> Any:
        return float(super().check(value, field, strict, label))

    def schema(self) -> dict[str, Any]:
        return {"type": "number", "exclusiveMinimum": 0}


class Flag(Rule):
    json_kind: ClassVar[str] = "true or false"

    def of_kind(self, value: Any) -> bool:
        return type(value) is bool

    def schema(self) -> dict[str, Any]:
        return {"type": "boolean"}


class Dict(Rule):
    """A JSON object kept as it is (a failed task's error)."""

    json_kind: ClassVar[str] = "an object"

    def of_kind(self, value: Any) -> bool:
        return type(value) is dict


@attrs.frozen
class OneOf(Rule):
    values: tuple[str, ...]
    json_kind: ClassVar[str] = "a string"

    @property
    def expected(self) -> str:
        return "one of " + ", ".join(repr(v) for v in self.values)

    def of_kind(self, value: Any) -> bool:
        return type(value) is str

    def accepts(self, value: Any) -> bool:
        return type(value) is str and value in self.values

    def schema(self) -> dict[str, Any]:
        return {"enum": list(self.values)}


@attrs.frozen
class ListOf(Rule):
    """A list of ``low``..``high`` items, each keeping to ``item``; read as a tuple."""

    item: Rule
    low: int = 0
    high: int | None = None
    json_kind: ClassVar[str] = "a list"

    @property
    def expected(self) -> str:
        if self.high is not None:
            return f"a list of {self.low}..{self.high} items"
        return f"a list of at least {self.low} items" if self.low else "a list"

    def of_kind(self, value: Any) -> bool:
        return type(value) is list

    def accepts(self, value: Any) -> bool:
        return type(value) is list and self.low <= len(value) and (self.high is None or len(value) <= self.high)

    def quick(self, value: Any) -> Any:
        return None

    def check(self, value: Any, field: str, strict: bool, label: str | None = None) -> Any:
        if not self.accepts(value):
            raise self.refused(value, field, label)
        item = self.item
        read = []
        for index, entry in enumerate(value):
            got = item.quick(entry)
            read.append(got if got is not None else item.check(entry, f"{field}[{index}]", strict))
        return tuple(read)

    def refused(self, value: Any, field: str, label: str | None = None) -> Invalid:
        if not self.of_kind(value):
            return super().refused(value, field, label)
        said = field if label is None else label
        if self.high is None:
            problem = f"expected at least {self.low} item(s), got {len(value)}"
        else:
            problem = f"expected {self.low}..{self.high} items, got {len(value)}"
        return _invalid(f"{said}: expected {self.expected}", field, problem)

    def build(self, value: Any) -> Any:
        build = self.item.build
        return [build(entry) for entry in value]

    def schema(self) -> dict[str, Any]:
        schema: dict[str, Any] = {"type": "array"}
        if self.low:
            schema["minItems"] = self.low
        if self.high is not None:
            schema["maxItems"] = self.high
        schema["items"] = self.item.schema()
        return schema


@attrs.frozen
class Nested(Rule):
    """A JSON object read into the model ``cls`` (a ``Wire`` class)."""

    cls: type[Wire]
    json_kind: ClassVar[str] = "an object"

    def of_kind(self, value: Any) -> bool:
        return type(value) is dict

    def quick(self, value: Any) -> Any:
        return self.cls.quick(value)

    def check(self, value: Any, field: str, strict: bool, label: str | None = None) -> Any:
        if type(value) is not dict:
            raise self.refused(value, field, label)
        return self.cls.read(value, f"{field}.", strict)

    def build(self, value: Any) -> Any:
        return value.to_json()

    def schema(self) -> dict[str, Any]:
        return self.cls.schema()


@attrs.frozen
class Field:
    """One field of a JSON object: its key (the model's attribute of the same name), its
    rule, whether it is required, and the value of an absent optional one. A built object
    leaves an optional field out when it holds that value, unless ``always``."""

    key: str
    rule: Rule
    required: bool = True
    default: Any = None
    always: bool = False


# The rules of the fields several messages have.
TASK_ID = Pattern(HEX32, "a 32-hex id")
FENCING_TOKEN = Pattern(TOKEN, "a fencing token")
ID = Field("id", Pattern(MESSAGE_ID, "a message id"), required=False)
NAME = Pattern(HANDLER_NAME, "a handler name")
VERSION_NAME = Pattern(VERSION, "a version")
TIME = Pattern(TIMESTAMP, "an RFC 3339 time", format="date-time")


def _known(obj: Mapping[str, Any], keys: frozenset[str], required: frozenset[str], where: str, strict: bool) -> None:
    """No unknown field (when ``strict``), no missing one: the first of either, by name."""
    if strict and not obj.keys() <= keys:
        unknown = sorted(obj.keys() - keys)[0]
        raise _invalid(f"unknown field {unknown!r}", f"{where}{unknown}", "unknown field")
    if not required <= obj.keys():
        missing = sorted(required - obj.keys())[0]
        raise _invalid(f"missing field {missing!r}", f"{where}{missing}", "missing")


class Wire:
    """A JSON object of the protocol as a frozen value whose fields are ``WIRE``, in the
    order of the model's attributes (and of the checks: the first field at fault is named)."""

    __slots__ = ()
    WIRE: ClassVar[tuple[Field, ...]] = ()
    # The message's type (None: an object inside a message).
    type: ClassVar[str | None] = None
    _keys: ClassVar[frozenset[str]] = frozenset()
    _required: ClassVar[frozenset[str]] = frozenset()

    def __init_subclass__(cls) -> None:
        keys = {f.key for f in cls.WIRE}
        cls._keys = frozenset(keys | {"type"} if cls.type is not None else keys)
        cls._required = frozenset(f.key for f in cls.WIRE if f.required)

    @classmethod
    def quick(cls, obj: Any) -> Any:
        """The value of ``obj`` when it is a well-formed object of this kind, read the short
        way, or None (then ``read`` checks it field by field). None unless overridden."""
        return None

    @classmethod
    def values(cls, obj: Mapping[str, Any], where: str, strict: bool) -> list[Any]:
        """The fields' values, checked, in ``WIRE`` order (an absent one's default);
        ``where`` is the path of ``obj`` (``tasks[0].``, empty for a message)."""
        _known(obj, cls._keys, cls._required, where, strict)
        read = []
        for field in cls.WIRE:
            key = field.key
            if key in obj:
                value = obj[key]
                got = field.rule.quick(value)
                read.append(got if got is not None else field.rule.check(value, where + key, strict))
            else:
                read.append(field.default)
        return read

    @classmethod
    def read(cls, obj: Mapping[str, Any], where: str = "", strict: bool = True) -> Any:
        make: Any = cls
        return make(*cls.values(obj, where, strict))

    def to_json(self) -> dict[str, Any]:
        built: dict[str, Any] = {} if self.type is None else {"type": self.type}
        for field in self.WIRE:
            value = getattr(self, field.key)
            if field.required or field.always or not (value is None or value == field.default):
                built[field.key] = field.rule.build(value)
        return built

    @classmethod
    def schema(cls) -> dict[str, Any]:
        """The JSON Schema of this object (no descriptions): what the protocol's schema
        file must say of it."""
        return object_schema(cls.WIRE, cls.type)


def object_schema(fields: tuple[Field, ...], message_type: str | None = None) -> dict[str, Any]:
    properties: dict[str, Any] = {} if message_type is None else {"type": {"const": message_type}}
    required = [] if message_type is None else ["type"]
    for field in fields:
        schema = field.rule.schema()
        if field.always and not field.required:
            schema = {**schema, "default": field.default}
        properties[field.key] = schema
        if field.required:
            required.append(field.key)
    schema = {"type": "object", "additionalProperties": False}
    if required:
        schema["required"] = required
    schema["properties"] = properties
    return schema


# -- Worker -> node ----------------------------------------------------------------------


_REF_KEYS = frozenset({"task_id", "token"})


def _well_formed(task_id: Any, token: Any) -> bool:
    return (
        type(task_id) is str
        and type(token) is str
        and HEX32.fullmatch(task_id) is not None
        and TOKEN.fullmatch(token) is not None
    )


@attrs.define
class TaskRef(Wire):
    """A task as a Worker names it: its id and its fencing token."""

    task_id: str
    token: str
    WIRE: ClassVar[tuple[Field, ...]] = (Field("task_id", TASK_ID), Field("token", FENCING_TOKEN))

    @classmethod
    def quick(cls, obj: Any) -> TaskRef | None:
        if type(obj) is dict and obj.keys() == _REF_KEYS and _well_formed(obj["task_id"], obj["token"]):
            return cls(obj["task_id"], obj["token"])
        return None


TASK_REFS = ListOf(Nested(TaskRef), 1, MAX_TASKS_PER_MESSAGE)


@attrs.frozen
class Capability(Wire):
    """One (handler, handler_version, payload_version) a Worker can run."""

    handler: str
    handler_version: str
    payload_version: str
    WIRE: ClassVar[tuple[Field, ...]] = (
        Field("handler", NAME),
        Field("handler_version", VERSION_NAME),
        Field("payload_version", VERSION_NAME),
    )

    def as_tuple(self) -> tuple[str, str, str]:
        return (self.handler, self.handler_version, self.payload_version)


@attrs.frozen
class Client(Wire):
    """The Worker's name and version of itself (a hello's ``client``)."""

    name: str | None = None
    version: str | None = None
    WIRE: ClassVar[tuple[Field, ...]] = (
        Field("name", NAME, required=False),
        Field("version", VERSION_NAME, required=False),
    )


@attrs.frozen(kw_only=True)
class Hello(Wire):
    """The Worker's first message: its queues (each once), its capabilities, whether it
    takes resource-keyed tasks, how many tasks it runs at once, its client, and the tasks
    of its earlier connection it asks this one to adopt (at most ``capacity``, each once)."""

    type: ClassVar[str] = "hello"
    queues: tuple[str, ...]
    capabilities: frozenset[Capability]
    capacity: int
    resource_keys: bool = False
    client_name: str | None = None
    client_version: str | None = None
    tasks: tuple[TaskRef, ...] = ()
    WIRE: ClassVar[tuple[Field, ...]] = (
        Field("queues", ListOf(TASK_ID, 1, MAX_QUEUES)),
        Field("capabilities", ListOf(Nested(Capability), 1, MAX_CAPABILITIES)),
        Field("client", Nested(Client), required=False),
        Field("capacity", Integer(1, MAX_CAPACITY)),
        Field("tasks", ListOf(Nested(TaskRef), 0, MAX_TASKS_PER_MESSAGE), required=False, default=()),
        Field("resource_keys", Flag(), required=False, default=False, always=True),
    )

    @classmethod
    def read(cls, obj: Mapping[str, Any], where: str = "", strict: bool = True) -> Hello:
        queues, capabilities, client, capacity, tasks, resource_keys = cls.values(obj, where, strict)
        seen: set[str] = set()
        for index, ref in enumerate(tasks):
            if ref.task_id in seen:
                text = f"tasks: task {ref.task_id} is presented twice"
                raise _invalid(text, f"{where}tasks[{index}].task_id", f"task {ref.task_id} is presented twice")
            seen.add(ref.task_id)
        if len(tasks) > capacity:
            problem = f"{len(tasks)} running tasks presented, more than the capacity {capacity}"
            raise _invalid(f"tasks: {problem}", f"{where}tasks", problem)
        return cls(
            queues=tuple(dict.fromkeys(queues)),
            capabilities=frozenset(capabilities),
            capacity=capacity,
            resource_keys=resource_keys,
            client_name=None if client is None else client.name,
            client_version=None if client is None else client.version,
            tasks=tasks,
        )

    def to_json(self) -> dict[str, Any]:
        built: dict[str, Any] = {
            "type": "hello",
            "queues": list(self.queues),
            "capabilities": [c.to_json() for c in sorted(self.capabilities, key=Capability.as_tuple)],
            "resource_keys": self.resource_keys,
            "capacity": self.capacity,
        }
        if self.client_name is not None or self.client_version is not None:
            built["client"] = Client(self.client_name, self.client_version).to_json()
        if self.tasks:
            built["tasks"] = [ref.to_json() for ref in self.tasks]
        return built


@attrs.frozen
class Heartbeat(Wire):
    """Either direction; the node answers each of a Worker's at once."""

    type: ClassVar[str] = "heartbeat"


@attrs.frozen
class TaskRefs(Wire):
    """A transition of the tasks named (``start``, ``renew``, ``release``), with the
    message's id when the Worker gives one (its ack carries it)."""

    tasks: tuple[TaskRef, ...]
    id: str | None = None
    WIRE: ClassVar[tuple[Field, ...]] = (Field("tasks", TASK_REFS), ID)


@attrs.frozen
class Start(TaskRefs):
    """Begin these reserved tasks (reserved -> running)."""

    type: ClassVar[str] = "start"


@attrs.frozen
class Renew(TaskRefs):
    """Extend the leases of these running tasks."""

    type: ClassVar[str] = "renew"


@attrs.frozen
class Release(TaskRefs):
    """Give back reservations the Worker will not start (no attempt is used)."""

    type: ClassVar[str] = "release"


# A failed task's error: its text fields, each with its most characters, and any details.
ERROR_WIRE = (
    Field("message", Text(0, MAX_ERROR_MESSAGE_CHARS), required=False),
    Field("code", Text(0, MAX_ERROR_CODE_CHARS), required=False),
    Field("details", AnyJson(), required=False),
    Field("traceback", Text(0, MAX_TRACEBACK_CHARS), required=False),
)
_ERROR_KEYS = frozenset(f.key for f in ERROR_WIRE)
_FINISH_KEYS = frozenset({"task_id", "token", "outcome", "result", "error", "retryable"})
_FINISH_REQUIRED = frozenset({"task_id", "token", "outcome"})
_SUCCEEDED_KEYS = frozenset({"task_id", "token", "outcome", "result"})
_ERROR = Dict()
_OUTCOME = OneOf(("succeeded", "failed"))
_RETRYABLE = Flag()


@attrs.define
class FinishReport(Wire):
    """One task's outcome: ``succeeded`` with its ``result`` (any JSON value), or ``failed``
    with its ``error`` (an object, kept as sent) and whether another attempt may follow."""

    task_id: str
    token: str
    outcome: str  # succeeded | failed
    result: Any = None
    error: Mapping[str, Any] | None = None
    retryable: bool = False

    @property
    def result_json(self) -> str | None:
        """A succeeded task's result as the node stores it: compact JSON text."""
        return _RESULT_JSON.encode(self.result) if self.outcome == "succeeded" else None

    @classmethod
    def quick(cls, obj: Any) -> FinishReport | None:
        if (
            type(obj) is dict
            and obj.get("outcome") == "succeeded"
            and obj.keys() <= _SUCCEEDED_KEYS
            and _well_formed(obj.get("task_id"), obj.get("token"))
        ):
            return cls(obj["task_id"], obj["token"], "succeeded", obj.get("result"))
        return None

    @classmethod
    def read(cls, obj: Mapping[str, Any], where: str = "", strict: bool = True) -> FinishReport:
        _known(obj, _FINISH_KEYS, _FINISH_REQUIRED, where, strict)
        outcome = obj["outcome"]
        error: Mapping[str, Any] | None = None
        retryable = False
        if outcome == "succeeded":
            if "error" in obj or "retryable" in obj:
                problem = "a succeeded task carries result, not error/retryable"
                raise _invalid(problem, f"{where}error", problem)
        elif outcome == "failed":
            if "result" in obj:
                problem = "a failed task carries error, not result"
                raise _invalid(problem, f"{where}result", problem)
            error = obj.get("error", {})
            if type(error) is not dict:
                raise _ERROR.refused(error, f"{where}error")
            _known(error, _ERROR_KEYS, frozenset(), f"{where}error.", strict)
            for field in ERROR_WIRE:
                if field.key in error:
                    field.rule.check(error[field.key], f"{where}error.{field.key}", strict, f"error.{field.key}")
            retryable = _RETRYABLE.check(obj.get("retryable", True), f"{where}retryable", strict)
        else:
            refused = _OUTCOME.refused(outcome, f"{where}outcome")
            raise _invalid('outcome must be "succeeded" or "failed"', f"{where}outcome", refused.problem)
        return cls(
            TASK_ID.check(obj["task_id"], f"{where}task_id", strict),
            FENCING_TOKEN.check(obj["token"], f"{where}token", strict),
            outcome,
            obj.get("result"),
            error,
            retryable,
        )

    def to_json(self) -> dict[str, Any]:
        built: dict[str, Any] = {"task_id": self.task_id, "token": self.token, "outcome": self.outcome}
        if self.outcome == "succeeded":
            built["result"] = self.result
        else:
            built["retryable"] = self.retryable
            built["error"] = dict(self.error or {})
        return built

    @classmethod
    def schema(cls) -> dict[str, Any]:
        ref = {"task_id": TASK_ID.schema(), "token": FENCING_TOKEN.schema()}
        required = ["task_id", "token", "outcome"]
        succeeded = {**ref, "outcome": {"const": "succeeded"}, "result": {}}
        failed = {
            **ref,
            "outcome": {"const": "failed"},
            "retryable": {**_RETRYABLE.schema(), "default": True},
            "error": object_schema(ERROR_WIRE),
        }
        return {
            "oneOf": [
                {"type": "object", "additionalProperties": False, "required": required, "properties": succeeded},
                {"type": "object", "additionalProperties": False, "required": required, "properties": failed},
            ]
        }


@attrs.frozen
class Finish(Wire):
    """Outcomes of running tasks."""

    type: ClassVar[str] = "finish"
    tasks: tuple[FinishReport, ...]
    id: str | None = None
    WIRE: ClassVar[tuple[Field, ...]] = (
        Field("tasks", ListOf(Nested(FinishReport), 1, MAX_TASKS_PER_MESSAGE)),
        ID,
    )


@attrs.frozen
class Drain(Wire):
    """Worker -> node: send nothing more (its reason, if it gives one, is logged). Node ->
    Worker: move (``DRAIN_REASONS``)."""

    type: ClassVar[str] = "drain"
    reason: str | None = None
    WIRE: ClassVar[tuple[Field, ...]] = (Field("reason", Text(1, MAX_DRAIN_REASON_CHARS), required=False),)


# -- node -> Worker ----------------------------------------------------------------------


@attrs.frozen
class Welcome(Wire):
    """The answer to the hello: the session's bounds."""

    type: ClassVar[str] = "welcome"
    connection_id: str
    node_id: str
    heartbeat_interval_s: float
    heartbeat_timeout_s: float
    max_message_bytes: int
    reservation_lease_s: float
    run_lease_s: float
    WIRE: ClassVar[tuple[Field, ...]] = (
        Field("connection_id", Text(1, 64)),
        Field("node_id", TASK_ID),
        Field("heartbeat_interval_s", Seconds()),
        Field("heartbeat_timeout_s", Seconds()),
        Field("max_message_bytes", Integer(1)),
        Field("reservation_lease_s", Seconds()),
        Field("run_lease_s", Seconds()),
    )


@attrs.define
class DispatchedTask(Wire):
    """One reservation of a ``dispatch``: the attempt, its fencing token and its lease.
    ``priority`` travels only when non-zero; ``traceparent`` and ``tracestate`` only
    when the task was submitted with them; ``parents`` (its parents' ids, each of which
    succeeded) only for a task submitted with ``depends_on``."""

    task_id: str
    token: str
    queue_id: str
    handler: str
    handler_version: str
    payload_version: str
    payload: Any
    attempt: int
    max_attempts: int
    lease_expires_at: str
    deadline: str | None = None
    resource_key: str | None = None
    priority: int = 0
    traceparent: str | None = None
    tracestate: str | None = None
    parents: tuple[str, ...] = ()
    WIRE: ClassVar[tuple[Field, ...]] = (
        Field("task_id", TASK_ID),
        Field("token", FENCING_TOKEN),
        Field("queue_id", TASK_ID),
        Field("handler", NAME),
        Field("handler_version", VERSION_NAME),
        Field("payload_version", VERSION_NAME),
        Field("payload", AnyJson()),
        Field("attempt", Integer(1)),
        Field("max_attempts", Integer(1)),
        Field("lease_expires_at", TIME),
        Field("deadline", TIME, required=False),
        Field("resource_key", Text(1, MAX_RESOURCE_KEY_CHARS), required=False),
        Field("priority", Integer(1, MAX_PRIORITY), required=False, default=0),
        Field("traceparent", Pattern(TRACEPARENT, "a W3C traceparent"), required=False),
        Field("tracestate", Text(1, MAX_TRACESTATE_CHARS), required=False),
        Field("parents", ListOf(TASK_ID, 1, MAX_DISPATCHED_PARENTS), required=False, default=()),
    )

    def to_json(self) -> dict[str, Any]:
        # Written out: the node builds one per task it dispatches.
        built = {
            "task_id": self.task_id,
            "token": self.token,
            "queue_id": self.queue_id,
            "handler": self.handler,
            "handler_version": self.handler_version,
            "payload_version": self.payload_version,
            "payload": self.payload,
            "attempt": self.attempt,
            "max_attempts": self.max_attempts,
            "lease_expires_at": self.lease_expires_at,
        }
        if self.deadline is not None:
            built["deadline"] = self.deadline
        if self.resource_key is not None:
            built["resource_key"] = self.resource_key
        if self.priority:
            built["priority"] = self.priority
        if self.traceparent is not None:
            built["traceparent"] = self.traceparent
        if self.tracestate is not None:
            built["tracestate"] = self.tracestate
        if self.parents:
            built["parents"] = list(self.parents)
        return built


@attrs.frozen
class Dispatch(Wire):
    """Reservations of one claim: start them (or release them) before their lease expires."""

    type: ClassVar[str] = "dispatch"
    tasks: tuple[DispatchedTask, ...]
    WIRE: ClassVar[tuple[Field, ...]] = (Field("tasks", ListOf(Nested(DispatchedTask), 1)),)


@attrs.define
class AckResult(Wire):
    """The node's answer for one task of a start, renew, finish, release or attach."""

    task_id: str
    ok: bool
    # Why not ok: OWNERSHIP_LOST, NOT_HELD, WRONG_STATE, TASK_CANCELLED, TASK_EXPIRED, or one of UNDECIDED.
    code: str | None = None
    # The task's state after the transition, when the node says it.
    state: str | None = None
    # Start, renew, attach: when the lease now runs out, and whether the handler should stop.
    lease_expires_at: str | None = None
    cancel_requested: bool | None = None
    WIRE: ClassVar[tuple[Field, ...]] = (
        Field("task_id", TASK_ID),
        Field("ok", Flag()),
        Field("code", Text(), required=False),
        Field("state", OneOf(TASK_STATES), required=False),
        Field("lease_expires_at", TIME, required=False),
        Field("cancel_requested", Flag(), required=False),
    )

    @property
    def undecided(self) -> bool:
        """Refused without a decision: the same transition is to be sent again."""
        return not self.ok and self.code in UNDECIDED

    def to_json(self) -> dict[str, Any]:
        # Written out: the node builds one per task of every transition.
        built: dict[str, Any] = {"task_id": self.task_id, "ok": self.ok}
        if self.code is not None:
            built["code"] = self.code
        if self.state is not None:
            built["state"] = self.state
        if self.lease_expires_at is not None:
            built["lease_expires_at"] = self.lease_expires_at
        if self.cancel_requested is not None:
            built["cancel_requested"] = self.cancel_requested
        return built


@attrs.frozen
class Ack(Wire):
    """One result per task of the message acknowledged, with its id when it had one."""

    type: ClassVar[str] = "ack"
    of: str
    results: tuple[AckResult, ...]
    id: str | None = None
    WIRE: ClassVar[tuple[Field, ...]] = (Field("of", OneOf(ACK_OF)), Field("results", ListOf(Nested(AckResult))), ID)


@attrs.define
class CancelTask(Wire):
    task_id: str
    reason: str  # CANCEL_REASONS
    WIRE: ClassVar[tuple[Field, ...]] = (Field("task_id", TASK_ID), Field("reason", OneOf(CANCEL_REASONS)))


@attrs.frozen
class Cancel(Wire):
    """Stop these tasks: their cancellation was requested, or their deadline passed."""

    type: ClassVar[str] = "cancel"
    tasks: tuple[CancelTask, ...]
    WIRE: ClassVar[tuple[Field, ...]] = (Field("tasks", ListOf(Nested(CancelTask), 1)),)


@attrs.frozen
class Error(Wire):
    """The node refused a message of the Worker's (a value, not an exception)."""

    type: ClassVar[str] = "error"
    code: str
    message: str
    field: str | None = None
    WIRE: ClassVar[tuple[Field, ...]] = (
        Field("code", Text()),
        Field("message", Text()),
        Field("field", Text(), required=False),
    )


WorkerMessage = Hello | Heartbeat | Start | Renew | Release | Finish | Drain
NodeMessage = Welcome | Heartbeat | Dispatch | Ack | Cancel | Drain | Error
Message = WorkerMessage | NodeMessage

# The messages of each direction, by type.
WORKER_MESSAGES: Mapping[str, type[Wire]] = {
    cls.type: cls for cls in (Hello, Heartbeat, Start, Renew, Release, Finish, Drain) if cls.type is not None
}
NODE_MESSAGES: Mapping[str, type[Wire]] = {
    cls.type: cls for cls in (Welcome, Heartbeat, Dispatch, Ack, Cancel, Drain, Error) if cls.type is not None
}


def _read(obj: Any, messages: Mapping[str, type[Wire]], strict: bool) -> Any:
    if type(obj) is not dict:
        problem = f"expected an object, got {kind(obj)}"
        raise Invalid("MALFORMED_MESSAGE", "a message must be a JSON object", problem=problem)
    if "type" not in obj:
        raise _invalid("missing field 'type'", "type", "missing")
    message_type = obj["type"]
    if not isinstance(message_type, str):
        raise _invalid("type: expected a string", "type", f"expected a string, got {kind(message_type)}")
    cls = messages.get(message_type)
    if cls is None:
        shown = message_type if len(message_type) <= 64 else message_type[:64] + "..."
        raise Invalid("UNKNOWN_TYPE", f"unknown message type {shown!r}", field="type", problem="unknown type")
    try:
        return cls.read(obj, "", strict)
    except Invalid as exc:
        exc.message_type = message_type
        raise


def read_worker_message(obj: Any, *, strict: bool = True) -> WorkerMessage:
    """The Worker's message a decoded frame holds, or ``Invalid`` (``strict``: a field or a
    type this side does not know is refused)."""
    message: WorkerMessage = _read(obj, WORKER_MESSAGES, strict)
    return message


def read_node_message(obj: Any, *, strict: bool = False) -> NodeMessage:
    """The node's message a decoded frame holds, or ``Invalid`` (code ``UNKNOWN_TYPE`` for a
    type this side does not know; fields it does not know are passed over unless ``strict``)."""
    message: NodeMessage = _read(obj, NODE_MESSAGES, strict)
    return message


def dumps(message: Message) -> str:
    """The text of the frame that carries ``message``."""
    return _MESSAGE_JSON.encode(message.to_json())
