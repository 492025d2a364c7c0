"""Plans: scheduled tasks from immutable plan versions.

Pure: ``schedule`` computes fire times, ``definition`` validates a version's
definition. The node service that creates the tasks is ``dispatch.plan_trigger``.
"""

from .definition import Definition, parse_definition, parse_stored
from .schedule import CATCH_UP_POLICIES, Firing, Schedule, due_fire_times

__all__ = [
    "CATCH_UP_POLICIES",
    "Definition",
    "Firing",
    "Schedule",
    "due_fire_times",
    "parse_definition",
    "parse_stored",
]
