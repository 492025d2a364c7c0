"""What each submission of one acceptance transaction becomes, pure.

``TaskStore.submit_many`` (one task or a batch of up to 1,000) reads the idempotency
records of the batch's keys and the queues it names, then asks ``decide`` what every
submission becomes, in request order, exactly as if the submissions had been sent one
after another with ``POST /v1/tasks``:

* a key with a record: the same request digest repeats the recorded task (200), another
  digest is ``IdempotencyConflict`` (409);
* otherwise a queue that is not in the namespace is ``NotFound`` (404);
* otherwise a parent (``depends_on``) that is not a task of the application, or a
  ``depends_on_keys`` key that neither an earlier submission of the call nor an earlier
  request took, is ``NotFound`` (404) naming it;
* otherwise a new task (201), and its key counts as taken for the later submissions of
  the same batch (so a second identical item repeats it, a changed one conflicts, and a
  later item may name it as a parent).

A refused submission takes no key: a later item with the same key is decided on its own.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

import attrs

from .errors import IdempotencyConflict, NotFound, OrbitError
from .rules import NewTask


@attrs.frozen
class Submission:
    """One task to accept under its idempotency key.

    The field names are how refusals name the key and the queue: the single submit's
    header and body field by default, ``tasks[3].idempotency_key`` and
    ``tasks[3].queue_id`` in a batch.
    """

    idempotency_key: str
    new: NewTask
    key_field: str = "Idempotency-Key"
    queue_field: str = "queue_id"
    # What names its other fields (``depends_on[2]``): ``tasks[3].`` in a batch.
    field_prefix: str = ""


@attrs.frozen
class Record:
    """An idempotency record: the digest of the request that took the key, and its task."""

    digest: str
    task_id: str


@attrs.frozen
class Create:
    task_id: str
    application_id: str
    digest: str
    # Its parents by id (depends_on, then the tasks of its depends_on_keys), each once.
    parents: tuple[str, ...] = ()


@attrs.frozen
class Repeat:
    task_id: str


Decision = Create | Repeat | OrbitError


def conflict(field: str) -> IdempotencyConflict:
    return IdempotencyConflict(f"{field}: this key already accepted a different request", field=field)


def decide(
    submissions: Sequence[Submission],
    digests: Sequence[str],
    records: Mapping[str, Record],
    queues: Mapping[str, str],
    new_id: Callable[[], str],
    parents: Mapping[str, str] | None = None,
) -> list[Decision]:
    """One decision per submission, in order.

    ``records``: key -> record of the keys already taken (those of the submissions and of
    their ``depends_on_keys``); ``queues``: queue id -> its
    application id, for the queues of the namespace; ``new_id``: a new task id;
    ``parents``: task id -> application id of the tasks the submissions name in
    ``depends_on`` that exist.
    """
    taken = dict(records)
    # What depends_on_keys may name: the tasks of keys accepted before this call, then of
    # this call's submissions decided so far (a refused one takes no key).
    earlier: dict[str, str] = {key: record.task_id for key, record in records.items()}
    decisions: list[Decision] = []
    for submission, digest in zip(submissions, digests, strict=True):
        record = taken.get(submission.idempotency_key)
        if record is not None:
            if record.digest == digest:
                decisions.append(Repeat(record.task_id))
                earlier[submission.idempotency_key] = record.task_id
            else:
                decisions.append(conflict(submission.key_field))
            continue
        application_id = queues.get(submission.new.queue_id)
        if application_id is None:
            field = submission.queue_field
            decisions.append(NotFound(f"{field}: queue {submission.new.queue_id} not found", field=field))
            continue
        found = _parents(submission, application_id, parents or {}, earlier)
        if isinstance(found, OrbitError):
            decisions.append(found)
            continue
        created = Create(new_id(), application_id, digest, found)
        taken[submission.idempotency_key] = Record(digest, created.task_id)
        earlier[submission.idempotency_key] = created.task_id
        decisions.append(created)
    return decisions


def _parents(
    submission: Submission, application_id: str, known: Mapping[str, str], earlier: Mapping[str, str]
) -> tuple[str, ...] | NotFound:
    """The parent ids of a submission to create, or the refusal naming the first parent
    that is not a task of its application (or a key no earlier item of the call took)."""
    prefix = submission.field_prefix
    found: dict[str, None] = {}
    for index, task_id in enumerate(submission.new.depends_on):
        if known.get(task_id) != application_id:
            field = f"{prefix}depends_on[{index}]"
            return NotFound(f"{field}: task {task_id} not found in this application", field=field)
        found[task_id] = None
    for index, key in enumerate(submission.new.depends_on_keys):
        taken = earlier.get(key)
        if taken is None:
            field = f"{prefix}depends_on_keys[{index}]"
            return NotFound(f"{field}: no task was accepted under the key {key!r}", field=field)
        found[taken] = None
    return tuple(found)
