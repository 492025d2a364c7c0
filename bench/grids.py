"""Tables with one column per durability setting, and one report from a scenario run at several.

A scenario that runs at each durability (``--durability both``) returns, per run, its
tables as *grids*: key columns (what a row is) and value columns (what was measured),
with the rows under the run's durability. ``combine_reports`` puts the runs' grids side
by side, so every value has a column per durability (``tasks/s [prod]``, ``tasks/s
[dev]``; a wide grid a row per durability instead), and prefixes each run's targets with
its durability. Pure: no I/O.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import attrs

from .report import Target, format_table

# Most value columns a grid of several durabilities shows side by side (a column per
# durability); a wider one puts the durabilities in rows, so a line stays readable.
SIDE_BY_SIDE = 10


def grid(
    keys: Sequence[str], values: Sequence[str], rows: Sequence[Sequence[Any]], durability: str, *, title: str = ""
) -> dict[str, Any]:
    """A table of one run: each row is its key cells, then its value cells."""
    width = len(keys) + len(values)
    for row in rows:
        if len(row) != width:
            raise ValueError(f"a row of {title or 'a grid'} has {len(row)} cells, not {width}: {row!r}")
    return {"title": title, "keys": list(keys), "values": list(values), "rows": {durability: [list(r) for r in rows]}}


def grid_table(g: Mapping[str, Any]) -> str:
    """The grid as text. With one durability, plain columns. With several, rows are matched
    by their keys (in the order they first appear; a row one run lacks shows ``-``) and
    each value gets a column per durability (``name [prod]``, ``name [dev]``) while that
    keeps the table within SIDE_BY_SIDE value columns; a wider grid gets a ``durability``
    column instead, each row once per durability, one under the other."""
    keys, values, runs = g["keys"], g["values"], g["rows"]
    width = len(keys)
    if len(runs) == 1:
        (rows,) = runs.values()
        table = format_table([*keys, *values], rows, align="l" * width + "r" * len(values))
        return f"{g['title']}\n{table}" if g.get("title") else table
    order: list[tuple[Any, ...]] = []
    found: dict[str, dict[tuple[Any, ...], Sequence[Any]]] = {}
    for name, rows in runs.items():
        found[name] = {}
        for row in rows:
            key = tuple(row[:width])
            if key not in order:
                order.append(key)
            found[name][key] = row[width:]
    missing = [None] * len(values)
    if len(values) * len(runs) <= SIDE_BY_SIDE:
        headers = [*keys, *(f"{value} [{name}]" for value in values for name in runs)]
        cells = [
            [*key, *(found[name].get(key, missing)[i] for i in range(len(values)) for name in runs)] for key in order
        ]
        align = "l" * width + "r" * (len(headers) - width)
    else:
        headers = [*keys, "durability", *values]
        cells = [[*key, name, *found[name].get(key, missing)] for key in order for name in runs]
        align = "l" * (width + 1) + "r" * len(values)
    table = format_table(headers, cells, align=align)
    return f"{g['title']}\n{table}" if g.get("title") else table


def combine_reports(reports: Mapping[str, Mapping[str, Any]]) -> dict[str, Any]:
    """One report from a scenario's runs at several durabilities (keyed by durability, in
    the order they ran; the first one's figures stay ``figures``, for its plots).

    Grids are merged position by position; plain tables, profiles and notes that differ
    between runs are kept per run, marked with the durability; targets are named with
    their run's durability."""
    names = list(reports)
    if not names:
        raise ValueError("no report to combine")
    first = reports[names[0]]
    combined = dict(first)
    combined["figures_by_durability"] = {name: reports[name].get("figures") for name in names}
    combined["durability"] = [reports[name].get("durability") for name in names]
    if len(names) == 1:
        return combined
    counts = {len(reports[name].get("grids", [])) for name in names}
    if len(counts) != 1:
        raise ValueError(f"the runs have different numbers of grids: {sorted(counts)}")
    combined["grids"] = [
        {**g, "rows": {name: reports[name]["grids"][index]["rows"][name] for name in names}}
        for index, g in enumerate(first.get("grids", []))
    ]
    combined["tables"] = [f"[{name}]\n{table}" for name in names for table in reports[name].get("tables", [])]
    combined["targets"] = [
        attrs.evolve(t, name=f"[{name}] {t.name}") if isinstance(t, Target) else t
        for name in names
        for t in reports[name].get("targets", [])
    ]
    notes: list[str] = []
    for name in names:
        for note in reports[name].get("notes", []):
            shared = all(note in reports[other].get("notes", []) for other in names)
            text = note if shared else f"[{name}] {note}"
            if text not in notes:
                notes.append(text)
    combined["notes"] = notes
    combined["profiles"] = {
        f"{title} [{name}]": summary for name in names for title, summary in reports[name].get("profiles", {}).items()
    }
    return combined


def figures_at(report: Mapping[str, Any], durability: str) -> Mapping[str, Any] | None:
    """A report's figures measured at ``durability`` (None: it did not run there)."""
    return (report.get("figures_by_durability") or {}).get(durability)
