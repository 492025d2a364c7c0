"""What an ``orbit-admin`` command is: an operation that returns its data, and a renderer
that shows that data to a person. ``--json`` prints the data itself, so the table and the
JSON can never tell different stories."""

from __future__ import annotations

import argparse
from collections.abc import Awaitable, Callable
from typing import Any

import attrs

from ...db import Database
from ..common import print_json

Run = Callable[[Database, argparse.Namespace], Awaitable[Any]]
Render = Callable[[Any, argparse.Namespace], None]


def _as_is(data: Any) -> Any:
    return data


@attrs.frozen
class Operation:
    """``run`` returns JSON-ready data; ``render`` prints it for people; ``--json`` prints
    ``document(data)`` (the data itself, or the part of it that is the command's document
    when the text view also names where it was found)."""

    run: Run
    render: Render
    document: Callable[[Any], Any] = _as_is

    async def __call__(self, db: Database, args: argparse.Namespace) -> None:
        data = await self.run(db, args)
        if args.json:
            print_json(self.document(data))
        else:
            self.render(data, args)


def command(parser: argparse.ArgumentParser, run: Run, render: Render, document: Callable[[Any], Any] = _as_is) -> None:
    """Make ``parser``'s command the operation ``run`` with its renderer."""
    parser.set_defaults(operation=Operation(run, render, document))


def streaming(parser: argparse.ArgumentParser, run: Callable[[Database, argparse.Namespace], Awaitable[None]]) -> None:
    """A command that prints as it goes (a live view, an action that reports each step)."""
    parser.set_defaults(operation=run)
