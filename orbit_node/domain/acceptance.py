"""What each submission of one acceptance transaction becomes, pure.

``TaskStore.submit_many`` (one task or a batch of up to 1,000) reads the idempotency
records of the batch's keys and the queues it names, then asks ``decide`` what every
submission becomes, in request order, exactly as if the submissions had been sent one
after another with ``POST /v1/tasks``:

* a key with a record: the same request digest repeats the recorded task (200), another
  digest is ``IdempotencyConflict`` (409);
* otherwise a queue that is not in the namespace is ``NotFound`` (404);
* otherwise a new task (201), and its key counts as taken for the later submissions of
  the same batch (so a second identical item repeats it, a changed one conflicts).

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
) -> list[Decision]:
    """One decision per submission, in order.

    ``records``: key -> record of the keys already taken; ``queues``: queue id -> its
    application id, for the queues of the namespace; ``new_id``: a new task id.
    """
    taken = dict(records)
    decisions: list[Decision] = []
    for submission, digest in zip(submissions, digests, strict=True):
        record = taken.get(submission.idempotency_key)
        if record is not None:
            decisions.append(Repeat(record.task_id) if record.digest == digest else conflict(submission.key_field))
            continue
        application_id = queues.get(submission.new.queue_id)
        if application_id is None:
            field = submission.queue_field
            decisions.append(NotFound(f"{field}: queue {submission.new.queue_id} not found", field=field))
            continue
        created = Create(new_id(), application_id, digest)
        taken[submission.idempotency_key] = Record(digest, created.task_id)
        decisions.append(created)
    return decisions
