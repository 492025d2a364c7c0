"""The claim value, defined once: from the Worker's hello to the claim SQL.

Pure values (attrs only): the Worker protocol parses a hello into ``Capability``
values (``orbit_protocol.messages``), the connection builds one ``ClaimRequest`` from
it, the fair scheduler queues and grants that request, and the lease store runs the
claim SQL for it, narrowed to the queue whose turn it is (``ClaimRequest.for_queue``).
"""

from __future__ import annotations

from collections.abc import Iterable

import attrs

# One (handler, handler_version, payload_version) a Worker can run, as its hello says it.
from orbit_protocol.messages import Capability as Capability


def _non_negative(instance: object, attribute: attrs.Attribute[int], value: int) -> None:
    if value < 0:
        raise ValueError(f"{attribute.name} must not be negative, got {value!r}")


def _queue_ids(values: Iterable[str]) -> tuple[str, ...]:
    return tuple(values)


def _capabilities(values: Iterable[Capability]) -> frozenset[Capability]:
    return frozenset(values)


@attrs.frozen(kw_only=True)
class ClaimRequest:
    """One Worker connection's claim: where, what it can run, how many it can take."""

    connection_id: str
    node_id: str
    application_id: str
    namespace_id: str
    # Queues in the order the caller wants them served (the scheduler's queue turn first).
    queue_ids: tuple[str, ...] = attrs.field(converter=_queue_ids)
    capabilities: frozenset[Capability] = attrs.field(converter=_capabilities)
    resource_key_support: bool
    # The connection's free capacity; capped by the store's batch size.
    limit: int = attrs.field(validator=_non_negative)

    def for_queue(self, queue_id: str) -> ClaimRequest:
        """The same request, for the one queue whose turn the scheduler granted."""
        return attrs.evolve(self, queue_ids=(queue_id,))
