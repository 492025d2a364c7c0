"""A task's family as the console draws it: its parents above it, its children below,
as a small SVG graph (a few boxes and the lines between them; no script)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import attrs

# Boxes drawn per row at most; the rest are counted in a last box ("+12 more").
ROW_MAX = 8
BOX_W, BOX_H, GAP_X, GAP_Y, MARGIN = 104, 34, 12, 46, 8


@attrs.frozen
class Box:
    x: int
    y: int
    task_id: str | None
    label: str
    state: str | None

    @property
    def center_top(self) -> tuple[int, int]:
        return self.x + BOX_W // 2, self.y

    @property
    def center_bottom(self) -> tuple[int, int]:
        return self.x + BOX_W // 2, self.y + BOX_H


@attrs.frozen
class FamilyGraph:
    width: int
    height: int
    boxes: tuple[Box, ...]
    # Lines as (x1, y1, x2, y2).
    lines: tuple[tuple[int, int, int, int], ...]


def _row(members: Sequence[Mapping[str, Any]], more: int, y: int, width: int) -> list[Box]:
    shown = list(members[:ROW_MAX])
    extra = more + max(0, len(members) - ROW_MAX)
    count = len(shown) + (1 if extra else 0)
    left = (width - (count * BOX_W + (count - 1) * GAP_X)) // 2
    boxes = [
        Box(left + i * (BOX_W + GAP_X), y, m["task_id"], m["task_id"][:8] + "…", m.get("state") or "deleted")
        for i, m in enumerate(shown)
    ]
    if extra:
        boxes.append(Box(left + len(shown) * (BOX_W + GAP_X), y, None, f"+{extra} more", None))
    return boxes


def family_graph(
    task: Mapping[str, Any],
    parents: Sequence[Mapping[str, Any]],
    children: Sequence[Mapping[str, Any]],
    *,
    more: int = 0,
) -> FamilyGraph | None:
    """The graph of a task (``task_id``, ``state``), its parents and children (each
    ``task_id``, ``state``; ``more`` children not listed); None for a task without either."""
    if not parents and not children:
        return None
    widest = max(min(len(parents), ROW_MAX + 1), min(len(children) + (1 if more else 0), ROW_MAX + 1), 1)
    width = 2 * MARGIN + widest * BOX_W + (widest - 1) * GAP_X
    y = MARGIN
    above = _row(parents, 0, y, width) if parents else []
    if above:
        y += BOX_H + GAP_Y
    (me,) = _row([task], 0, y, width)
    y += BOX_H + GAP_Y
    below = _row(children, more, y, width) if children else []
    height = (y + BOX_H if below else me.y + BOX_H) + MARGIN
    lines = [(*p.center_bottom, *me.center_top) for p in above]
    lines += [(*me.center_bottom, *c.center_top) for c in below]
    return FamilyGraph(width, height, (*above, me, *below), tuple(lines))
