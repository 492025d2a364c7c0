"""The database layer: pool, transactions with safe replay, named SQL, migrations."""

from .pool import Database, Tx
from .queries import QUERIES

__all__ = ["Database", "Tx", "QUERIES"]
