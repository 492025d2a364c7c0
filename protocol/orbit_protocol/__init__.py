"""Orbit's wire contract, shared by the node and the SDK: the limits of what travels
between them and the Worker protocol's constants (``docs/worker-protocol.md``, the JSON
Schema in ``schema/worker-protocol.schema.json``).

Pure values, no I/O and no dependencies: both sides import them from here, so a limit or
a code cannot drift between the side that enforces it and the side that keeps within it.
The one version of Orbit's three distributions is written here.
"""

__version__ = "0.1.0"
