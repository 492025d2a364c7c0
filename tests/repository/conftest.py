"""Checks of the repository's files: the docs and their commands, the Makefile, the CI
script, the examples, the SQL text; some run them against a test database
(tests/database.py)."""

from ..database import (  # noqa: F401
    db,
    dsn,
    empty_dsn,
    full_node,
    migrated_template,
    node_config,
    running_node,
)
