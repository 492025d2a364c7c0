"""Named SQL blocks loaded from the ``.sql`` files beside this module.

Each block starts with ``-- name: some_name`` and runs until the next such line.
Only the repository layer reads ``QUERIES``; nothing else builds SQL strings.
Parameters use the driver's ``%(name)s`` style; a tuple parameter expands to a
parenthesised list, so ``IN %(ids)s`` takes a tuple of ids.
"""

from __future__ import annotations

import re
from pathlib import Path

_NAME = re.compile(r"^--\s*name:\s*([a-z0-9_]+)\s*$", re.MULTILINE)


def parse_blocks(text: str, *, source: str = "<sql>") -> dict[str, str]:
    blocks: dict[str, str] = {}
    matches = list(_NAME.finditer(text))
    for index, match in enumerate(matches):
        end = matches[index + 1].start() if index + 1 < len(matches) else len(text)
        body = text[match.end() : end]
        lines = [line for line in body.splitlines() if not line.lstrip().startswith("--")]
        sql = "\n".join(lines).strip().rstrip(";").strip()
        name = match.group(1)
        if name in blocks:
            raise ValueError(f"{source}: query {name!r} defined twice")
        if not sql:
            raise ValueError(f"{source}: query {name!r} is empty")
        blocks[name] = sql
    return blocks


def load_queries(directory: Path) -> dict[str, str]:
    queries: dict[str, str] = {}
    for path in sorted(directory.glob("*.sql")):
        for name, sql in parse_blocks(path.read_text(), source=path.name).items():
            if name in queries:
                raise ValueError(f"{path.name}: query {name!r} already defined in another file")
            queries[name] = sql
    return queries


QUERIES: dict[str, str] = load_queries(Path(__file__).parent / "sql")
