"""The background services a production node runs beside the HTTP server."""

from __future__ import annotations


def default_services() -> list:
    """Each service is ``async def service(node, task_status)``; started in order."""
    from .dispatch.recovery import recovery_service
    from .plans.trigger import plan_service
    from .workers.hub import worker_service

    return [worker_service, recovery_service, plan_service]
