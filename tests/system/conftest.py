"""System tests: node and Worker processes, private mariadbd servers, faults and chaos
(harness/), the browser; most also use a test database (tests/database.py)."""

from ..database import (  # noqa: F401
    db,
    dsn,
    empty_dsn,
    full_node,
    migrated_template,
    node_config,
    private_mariadb,
    running_node,
)
