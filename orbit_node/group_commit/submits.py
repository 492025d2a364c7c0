"""Single submits share transactions: concurrent ``POST /v1/tasks`` of one namespace are
accepted by one ``TaskStore.submit_many`` (one multi-row insert, one commit).

A submit that arrives while its namespace's transaction runs waits and joins the next
one (the engine of ``engine.py``, whose other use is the Worker transitions); a lone
submit waits for nothing. Each keeps what it had alone:

* its own idempotency record and its own answer: 201 created, 200 the same request
  again (also when an identical request sharing its key is in the same group), 409 the
  key taken by another request, 404 an unknown queue; a refused submission never fails
  the others of its group;
* it is answered only after the transaction holding its task has committed, so nothing
  acknowledged can be lost; a caller gone before the commit loses only the answer, and
  its retry under the same key finds the task;
* a group transaction that fails for a reason one submission may have caused is run
  again submission by submission.

The namespace is the lane: a namespace belongs to one application, so no transaction
touches two applications' rows (the shard key, docs/scaling.md).
"""

from __future__ import annotations

from collections.abc import Sequence

import attrs

from ..domain.acceptance import Submission
from ..domain.errors import OrbitError
from ..domain.rules import NewTask
from ..store.tasks import Accepted, TaskStore
from .engine import GroupCommit

# Submissions one group transaction accepts at most.
MAX_SUBMIT_GROUP = 256
# Namespaces whose groups run at once (beside the claim pool and the transitions' group
# commits, inside the node's database pool).
MAX_CONCURRENT_SUBMIT_GROUPS = 4


@attrs.define(eq=False, kw_only=True)
class SubmitGroups(GroupCommit[Submission, "Accepted | OrbitError"]):
    """Single submits, a group per namespace and transaction (module docstring)."""

    tasks: TaskStore = attrs.field(kw_only=False)
    max_group_size: int = MAX_SUBMIT_GROUP
    max_concurrent_groups: int = MAX_CONCURRENT_SUBMIT_GROUPS

    async def accept(self, namespace_id: str, idempotency_key: str, new: NewTask) -> Accepted:
        """``TaskStore.submit``, in a group: the task accepted (or repeated) under the key;
        raises the submission's refusal (NotFound, IdempotencyConflict)."""
        outcome = await self.submit(namespace_id, Submission(idempotency_key, new))
        if isinstance(outcome, OrbitError):
            raise outcome
        return outcome

    async def run_group(self, lane: str, items: Sequence[Submission]) -> list[Accepted | OrbitError]:
        return await self.tasks.submit_many(lane, items)
