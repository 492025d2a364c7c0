"""Integration tests: a real MariaDB (each test its own database, tests/database.py) and
an in-process node."""

from ..database import (  # noqa: F401
    db,
    dsn,
    empty_dsn,
    full_node,
    migrated_template,
    node_config,
    running_node,
)
