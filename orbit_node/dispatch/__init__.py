"""Dispatch on the node: the recovery sweeper, the fair claim scheduler, the claim pool
and its empty-result cache, and the engine of the node's periodic database services
(``periodic``).

The ownership rules themselves (claims, leases, fencing, quotas) live in the database
transactions of ``orbit_node.store.leases``. Import submodules directly; this package
imports nothing so that importing one part never pulls in the others.
"""
