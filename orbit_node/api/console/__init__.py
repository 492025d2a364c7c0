"""The read-only operator console at ``/console``: queues, priorities, fairness, Workers,
plans and one task's story, in a browser (docs/operations.md, "The console").

``views.blueprint()`` is registered by the node's app; templates and static files ship
in this package. ``session`` (signed session cookies) and ``model`` (what a panel shows)
are pure: no quart, trio or driver.
"""
