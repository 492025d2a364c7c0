"""The operator console at ``/console``: queues, priorities, fairness, Workers, plans,
tasks and one task's story in a browser, and the writes an operator makes there (cancel or
retry a task, pause or resume a queue, cancel or retry the tasks a filter matches) with
their audit record (docs/operations.md, "The console").

``views.blueprint`` is registered by the node's app; ``tasks_view``, ``actions`` and
``bulk`` add their routes to it (imported here, so that importing the blueprint brings every route).
Templates and static files ship in this package. ``session`` (signed session cookies and
form tokens), ``model`` (what a panel shows), ``values`` (how a stored value is shown),
``task_filters`` (a page's task filter) and ``answers`` (what a write answers) are pure:
no quart, trio or driver.
"""

# actions, tasks_view and bulk import views (the blueprint) and add their routes to it.
from . import actions, bulk, tasks_view, views

__all__ = ["actions", "bulk", "tasks_view", "views"]
