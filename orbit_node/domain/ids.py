"""Identifiers: 32 lowercase hex characters.

Task ids are time-ordered (48-bit millisecond prefix, 80 random bits, like UUIDv7)
so the task_id tie-break of the dispatch order roughly follows acceptance order and
inserts stay at the right edge of the primary key. Other ids are fully random.
"""

from __future__ import annotations

import re
import secrets
import time

HEX32 = re.compile(r"^[0-9a-f]{32}$")


def random_id() -> str:
    return secrets.token_hex(16)


def time_ordered_id() -> str:
    millis = time.time_ns() // 1_000_000
    return f"{millis & 0xFFFF_FFFF_FFFF:012x}{secrets.token_hex(10)}"


def is_hex32(value: object) -> bool:
    return isinstance(value, str) and HEX32.match(value) is not None
