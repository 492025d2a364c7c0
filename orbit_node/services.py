"""The background services a production node runs beside the HTTP server."""

from __future__ import annotations


def default_services() -> list:
    """Each service is ``async def service(node, task_status)``; started in order."""
    return []
