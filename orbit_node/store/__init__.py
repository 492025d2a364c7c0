"""Repositories: the only code that runs SQL (through the named queries of ``orbit_node.db``)."""
