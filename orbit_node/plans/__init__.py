"""Plans: scheduled tasks from immutable plan versions.

``schedule`` computes fire times (pure), ``definition`` validates a version's
definition, ``trigger`` is the node service that creates the tasks.
"""

from .definition import Definition, parse_definition, parse_stored
from .schedule import CATCH_UP_POLICIES, Firing, Schedule, due_fire_times

__all__ = ["CATCH_UP_POLICIES", "Definition", "Firing", "Schedule", "due_fire_times", "parse_definition", "parse_stored"]
