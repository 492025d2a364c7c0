"""An application's submit rate limit across the cluster (``applications.submits_per_second``
/ ``submit_burst``), and each node's share of it: read by the tenancy repository, enforced
by the node's token buckets (``orbit_node.admission.submit_rate``)."""

from __future__ import annotations

import attrs


@attrs.frozen
class SubmitLimit:
    """An application's limit across the cluster, as stored."""

    # Tasks per second (0 admits nothing).
    per_second: int
    # Tasks at once above the rate (the bucket's depth); None: one second of the rate.
    burst: int | None = None

    @property
    def depth(self) -> int:
        return self.per_second if self.burst is None else self.burst

    def share(self, nodes: int) -> tuple[float, float]:
        """(rate, depth) of one node's bucket among ``nodes`` live nodes: an even share of
        each, the depth at least one task (so a node always admits some burst) unless the
        limit admits nothing at all."""
        nodes = max(1, nodes)
        rate = self.per_second / nodes
        if self.per_second == 0 or self.depth == 0:
            return rate, 0.0
        return rate, max(1.0, self.depth / nodes)
