"""Who gets a Worker connection slot of a node (sans-IO): the pure decision ``WorkerHub``
awaits nothing around.

While the node has a free slot, anyone within its application's own limit
(``applications.max_worker_connections``) connects. When every slot is taken, the slots
are shared between the applications holding them, plus the newcomer's, in proportion to
their fairness weights: the fair share of application ``a`` is
``slots * weight(a) / sum of the weights``. A newcomer whose application would still be
within its share after it is admitted (it holds at most ``share - 1``) is admitted, and
one connection of the application most over its share is moved away to make room; any
other newcomer is refused.

Why a whole slot under the share, not just "under it": with 5 slots and two applications
of weight 1 (shares 2.5), A holding 2 and B 3, admitting A's third connection would make
B the one under its share; B's Worker reconnects, and A's is moved away, and so on for
ever. Admitting only while the newcomer stays within its share means a moved application
(strictly over its share before, so at least ``share`` after) is refused when it comes
back: one move per admission, no ping-pong.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Literal

import attrs

# Why a connection was refused (the ``reason`` label of orbit_worker_connections_refused).
RefusalReason = Literal["node_full", "application_limit"]
REFUSAL_REASONS: tuple[RefusalReason, ...] = ("node_full", "application_limit")


@attrs.frozen
class Admitted:
    """The connection gets a slot; ``evict`` names the application one of whose
    connections gives its slot up for it (None: the node had a free slot)."""

    evict: str | None = None


@attrs.frozen
class Refused:
    """The connection is refused: the node is full and its application is not a whole slot
    under its fair ``share`` (``node_full``), or the application already holds its own
    ``limit`` here (``application_limit``)."""

    reason: RefusalReason
    # The application's connections on this node.
    held: int
    # Its fair share of the slots (node_full) or its own limit (application_limit).
    bound: float


def fair_shares(slots: int, applications: Iterable[str], weight: Callable[[str], int]) -> dict[str, float]:
    """Each application's share of ``slots``, in proportion to its weight."""
    weights = {app: weight(app) for app in applications}
    total = sum(weights.values())
    return {app: slots * w / total for app, w in weights.items()}


def decide(
    application_id: str,
    held: Mapping[str, int],
    *,
    slots: int,
    weight: Callable[[str], int],
    limit: int | None = None,
    evictable: Mapping[str, int] | None = None,
) -> Admitted | Refused:
    """Whether a new connection of ``application_id`` gets one of ``slots``.

    ``held``: the connections each application holds on this node (zeros allowed);
    ``weight``: its fairness weight (at least 1); ``limit``: the newcomer's application's
    own maximum here (None: none); ``evictable``: of ``held``, the connections that can be
    moved away now (those past their hello; default all of ``held``). An application
    with nothing evictable is passed over for the next most over its share; when none is
    left, the newcomer is refused as if its application were at its share."""
    own = held.get(application_id, 0)
    if limit is not None and own >= limit:
        return Refused("application_limit", own, limit)
    if sum(held.values()) < slots:
        return Admitted()
    holders = {app for app, count in held.items() if count > 0} | {application_id}
    shares = fair_shares(slots, holders, weight)
    if own + 1 > shares[application_id]:
        return Refused("node_full", own, shares[application_id])
    movable = held if evictable is None else evictable
    over = [
        (held[app] - share, app)
        for app, share in shares.items()
        if app != application_id and held.get(app, 0) > share and movable.get(app, 0) > 0
    ]
    if not over:
        return Refused("node_full", own, shares[application_id])
    # The most over its share; ties go to the smallest id (any fixed order would do).
    _, victim = min(over, key=lambda item: (-item[0], item[1]))
    return Admitted(evict=victim)
