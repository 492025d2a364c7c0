"""Pure helpers of the benchmark harness: statistics, targets, tables, result files, profiles.

Nothing here imports a benchmark-only package (matplotlib, peers): the
smoke test (``tests/unit/test_bench_smoke.py``) runs these helpers under ``make test``.
"""

from __future__ import annotations

import json
import math
import os
import platform
import re
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import attrs

# Where ``make bench`` and ``python -m bench`` write JSON results and PNG plots (gitignored).
RESULTS_DIR = Path(__file__).resolve().parent / "results"


# -- statistics -----------------------------------------------------------------------


def percentile(sorted_values: Sequence[float], q: float) -> float:
    """Nearest-rank percentile (``q`` in 0..100) of an already sorted sequence; NaN when empty."""
    if not sorted_values:
        return math.nan
    if not 0 <= q <= 100:
        raise ValueError(f"percentile must be within 0..100, got {q}")
    rank = max(1, math.ceil(q / 100 * len(sorted_values)))
    return float(sorted_values[rank - 1])


def summarize(values: Iterable[float]) -> dict[str, float]:
    """count, mean, p50, p90, p99, max of ``values`` (exact, nearest rank)."""
    data = sorted(values)
    if not data:
        return {"count": 0, "mean": math.nan, "p50": math.nan, "p90": math.nan, "p99": math.nan, "max": math.nan}
    return {
        "count": len(data),
        "mean": sum(data) / len(data),
        "p50": percentile(data, 50),
        "p90": percentile(data, 90),
        "p99": percentile(data, 99),
        "max": float(data[-1]),
    }


def jain_index(values: Iterable[float]) -> float:
    """Jain's fairness index (sum x)^2 / (n * sum x^2): 1 = equal shares, 1/n = one takes all."""
    xs = [float(v) for v in values]
    if not xs:
        return math.nan
    square_sum = sum(x * x for x in xs)
    if square_sum == 0:
        return 1.0
    return sum(xs) ** 2 / (len(xs) * square_sum)


def shares(counts: Mapping[str, float]) -> dict[str, float]:
    """Each key's fraction of the total (0 for every key when the total is 0)."""
    total = sum(counts.values())
    return {k: (v / total if total else 0.0) for k, v in counts.items()}


def fairness(counts: Mapping[str, float]) -> dict[str, Any]:
    """Jain's index, shares, and the min/max share ratio of per-application counts."""
    share = shares(counts)
    low, high = (min(share.values()), max(share.values())) if share else (math.nan, math.nan)
    return {
        "counts": dict(counts),
        "shares": share,
        "jain": jain_index(counts.values()),
        "min_share": low,
        "max_share": high,
        "min_over_max": (low / high) if high else math.nan,
    }


def ratio(numerator: float, denominator: float) -> float:
    """numerator / denominator, NaN when the denominator is 0 or missing."""
    if not denominator or denominator != denominator or numerator is None:
        return math.nan
    return numerator / denominator


def rate_series(times: Sequence[float], start: float, step_s: float) -> list[tuple[float, int]]:
    """Events per ``step_s`` bucket, from ``start``: [(bucket start offset, count)]."""
    if not times:
        return []
    buckets = Counter(int((t - start) // step_s) for t in times if t >= start)
    last = max(buckets, default=-1)
    return [(i * step_s, buckets.get(i, 0)) for i in range(last + 1)]


def max_priority_advantage(rows: Sequence[tuple[int, float]], high: int = 9, low: int = 0) -> float:
    """Largest observed ordering advantage of level ``high`` over level ``low``, in seconds.

    ``rows`` are (priority, available_at as epoch seconds) in dispatch order. The
    advantage of a ``high`` task A over a ``low`` task B dispatched after it is
    available_at(A) - available_at(B): how much newer A was and still went first. The
    P3 rule bounds it by 9 x 30 s = 270 s. Returns 0 when no ``high`` task overtook an
    older ``low`` one.
    """
    best = 0.0
    oldest_low_after = math.inf
    for priority, available in reversed(rows):
        if priority == low:
            oldest_low_after = min(oldest_low_after, available)
        elif priority == high and oldest_low_after != math.inf:
            best = max(best, available - oldest_low_after)
    return best


# -- server statement counters ------------------------------------------------------

# MariaDB global status counters read before and after a measured phase.
STATUS_COUNTERS = (
    "Questions",
    "Com_select",
    "Com_insert",
    "Com_insert_select",
    "Com_update",
    "Com_delete",
    "Com_replace",
    "Com_begin",
    "Com_commit",
    "Com_rollback",
    "Com_set_option",
    "Com_admin_commands",
    "Com_show_status",
)


def status_delta(before: Mapping[str, int], after: Mapping[str, int]) -> dict[str, int]:
    """Per counter, ``after - before`` (0 for a counter one side lacks)."""
    return {name: int(after.get(name, 0)) - int(before.get(name, 0)) for name in STATUS_COUNTERS}


def statement_costs(delta: Mapping[str, int], units: float) -> dict[str, float]:
    """Server work per unit (task, claim, submit) from a ``status_delta``.

    ``statements``: client statements (``Questions``) less the ``SHOW GLOBAL STATUS`` reads
    that took the counts; ``round_trips``: those plus ping-like commands
    (``Com_admin_commands``), which ``Questions`` does not count. NaN when ``units`` is 0.
    """
    statements = delta.get("Questions", 0) - delta.get("Com_show_status", 0)
    totals = {
        "statements": statements,
        "round_trips": statements + delta.get("Com_admin_commands", 0),
        "selects": delta.get("Com_select", 0),
        "inserts": delta.get("Com_insert", 0) + delta.get("Com_insert_select", 0) + delta.get("Com_replace", 0),
        "updates": delta.get("Com_update", 0),
        "deletes": delta.get("Com_delete", 0),
        "begins": delta.get("Com_begin", 0),
        "commits": delta.get("Com_commit", 0),
        "rollbacks": delta.get("Com_rollback", 0),
    }
    return {name: (value / units if units else math.nan) for name, value in totals.items()}


STATEMENT_COLUMNS = ("statements", "round_trips", "selects", "inserts", "updates", "deletes", "begins", "commits")


def statements_table(rows: Sequence[tuple[str, str, Mapping[str, float]]]) -> str:
    """One row per (phase, unit, ``statement_costs``): server statements per unit of work."""
    return format_table(
        ["phase", "per", *(c.replace("_", " ") for c in STATEMENT_COLUMNS)],
        [[phase, unit, *(costs.get(c, math.nan) for c in STATEMENT_COLUMNS)] for phase, unit, costs in rows],
        align="ll" + "r" * len(STATEMENT_COLUMNS),
    )


STATEMENTS_NOTE = (
    "statements: MariaDB's server-wide SHOW GLOBAL STATUS counters (Questions, Com_*) read before and after "
    "the phase, on the scenario's own private server (with --durability server, other databases on that "
    "server add to them). commits = COMMIT statements (autocommit statements commit without one)."
)


# -- targets --------------------------------------------------------------------------


@attrs.frozen(kw_only=True)
class Target:
    """A figure beside the issue's target for it; ``met`` is None when it could not be judged."""

    name: str
    target: str
    value: float
    unit: str = ""
    met: bool | None = None
    note: str = ""

    @classmethod
    def at_least(cls, name: str, value: float, bound: float, *, unit: str = "", note: str = "") -> Target:
        met = None if value != value else value >= bound
        return cls(name=name, target=f">= {fmt_number(bound)}{unit}", value=value, unit=unit, met=met, note=note)

    @classmethod
    def at_most(cls, name: str, value: float, bound: float, *, unit: str = "", note: str = "") -> Target:
        met = None if value != value else value <= bound
        return cls(name=name, target=f"<= {fmt_number(bound)}{unit}", value=value, unit=unit, met=met, note=note)

    @property
    def verdict(self) -> str:
        return {True: "met", False: "MISSED", None: "n/a"}[self.met]

    def to_json(self) -> dict[str, Any]:
        return {**attrs.asdict(self), "verdict": self.verdict}


def targets_table(targets: Sequence[Target]) -> str:
    rows = [[t.name, f"{fmt_number(t.value)}{t.unit}", t.target, t.verdict, t.note] for t in targets]
    return format_table(["target", "measured", "issue's target", "verdict", "note"], rows, align="lrrll")


# -- text -----------------------------------------------------------------------------


def fmt_number(value: Any) -> str:
    """Numbers for tables: thousands separators, 3 significant decimals for small values."""
    if value is None:
        return "-"
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, int):
        return f"{value:,}"
    if isinstance(value, float):
        if value != value:
            return "n/a"
        if math.isinf(value):
            return "inf"
        magnitude = abs(value)
        if magnitude >= 100:
            return f"{value:,.0f}"
        if magnitude >= 10:
            return f"{value:.1f}"
        if magnitude >= 1:
            return f"{value:.2f}"
        return f"{value:.3f}"
    return str(value)


def format_table(headers: Sequence[str], rows: Sequence[Sequence[Any]], *, align: str | None = None) -> str:
    """A plain-text table; ``align`` has one 'l' or 'r' per column (numbers right by default)."""
    cells = [[h for h in headers]] + [[c if isinstance(c, str) else fmt_number(c) for c in row] for row in rows]
    widths = [max(len(row[i]) for row in cells) for i in range(len(headers))]
    if align is None:
        align = "l" + "r" * (len(headers) - 1)
    lines = []
    for index, row in enumerate(cells):
        parts = [cell.ljust(w) if a == "l" else cell.rjust(w) for cell, w, a in zip(row, widths, align, strict=False)]
        lines.append("  ".join(parts).rstrip())
        if index == 0:
            lines.append("  ".join("-" * w for w in widths))
    return "\n".join(lines)


def ms(seconds: float) -> float:
    return seconds * 1000.0


# -- result files ---------------------------------------------------------------------


def machine_info() -> dict[str, Any]:
    """What the figures were measured on."""
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    memory = None
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                memory = f"{int(line.split()[1]) // (1024 * 1024)} GiB"
                break
    except OSError:
        pass
    return {
        "host": platform.node(),
        "cpus": os.cpu_count(),
        "cpu": cpu,
        "memory": memory,
        "python": platform.python_version(),
        "system": f"{platform.system()} {platform.release()}",
    }


def _jsonable(value: Any) -> Any:
    if isinstance(value, float) and (value != value or math.isinf(value)):
        return None
    if isinstance(value, Mapping):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    if isinstance(value, Target):
        return _jsonable(value.to_json())
    if isinstance(value, datetime):
        return value.isoformat()
    if isinstance(value, Path):
        return str(value)
    return value


def write_result(report: Mapping[str, Any], directory: Path, scenario: str, *, stamp: str | None = None) -> Path:
    """Write ``<scenario>.json`` (the latest) and ``<scenario>-<stamp>.json``; returns the latest's path.

    NaN and infinities become null, so the file is strict JSON.
    """
    directory.mkdir(parents=True, exist_ok=True)
    stamp = stamp or datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
    text = json.dumps(_jsonable(dict(report)), indent=2, sort_keys=False) + "\n"
    latest = directory / f"{scenario}.json"
    latest.write_text(text)
    (directory / f"{scenario}-{stamp}.json").write_text(text)
    return latest


# -- profiles (py-spy --format raw: collapsed stacks) ----------------------------------

_FRAME = re.compile(r"^(?P<func>.*?) \((?P<file>[^()]*?)(?::\d+)?\)$")


def _short_frame(frame: str) -> str:
    """``func (path/to/pkg/mod.py)`` -> ``func (pkg/mod.py)``."""
    match = _FRAME.match(frame.strip())
    if not match:
        return frame.strip()
    path = match.group("file").replace("\\", "/")
    for marker in ("/site-packages/", "/lib/python3"):
        if marker in path:
            path = path.split(marker, 1)[1]
            break
    else:
        path = "/".join(path.split("/")[-2:])
    return f"{match.group('func')} ({path})"


def parse_collapsed(text: str) -> tuple[Counter, Counter, int]:
    """Self and inclusive sample counts per frame from collapsed stacks (``a;b;c 12`` lines)."""
    own: Counter = Counter()
    inclusive: Counter = Counter()
    total = 0
    for line in text.splitlines():
        stack, _, count_text = line.rpartition(" ")
        if not stack or not count_text.isdigit():
            continue
        count = int(count_text)
        frames = [_short_frame(f) for f in stack.split(";") if f.strip()]
        if not frames:
            continue
        total += count
        own[frames[-1]] += count
        for frame in set(frames):
            inclusive[frame] += count
    return own, inclusive, total


# Frames every sample of a node passes through: they explain nothing.
_ENTRY_FRAMES = (
    "<module> ",
    "_run_module_as_main ",
    "_run_code ",
    "main (bench/",
    "run (_core/_run.py)",
    "unrolled_run (_core/_run.py)",
    "serve (bench/",
    "run (orbit_node/node.py)",
)
# Self-time frames grouped by where the code lives (first path component that names a package).
_COMPONENTS = (
    ("trio_mysql", "MySQL driver (trio_mysql)"),
    ("_socket.py", "socket syscalls (trio)"),
    ("_highlevel_socket.py", "socket syscalls (trio)"),
    ("_io_epoll.py", "trio event loop"),
    ("_core/", "trio event loop"),
    ("trio/", "trio (other)"),
    ("hypercorn", "HTTP/WebSocket server (hypercorn, wsproto, h11)"),
    ("wsproto", "HTTP/WebSocket server (hypercorn, wsproto, h11)"),
    ("h11", "HTTP/WebSocket server (hypercorn, wsproto, h11)"),
    ("quart", "web framework (quart, werkzeug)"),
    ("werkzeug", "web framework (quart, werkzeug)"),
    ("json", "json"),
    ("store/", "orbit_node repositories (SQL building, rows)"),
    ("db/", "orbit_node database layer"),
    ("workers/", "orbit_node Worker connections"),
    ("dispatch/", "orbit_node claim scheduler"),
    ("api/", "orbit_node HTTP API"),
)


def component(frame: str) -> str:
    """The part of the stack a self-time frame belongs to (see ``_COMPONENTS``)."""
    where = frame[frame.rfind("(") + 1 :] if "(" in frame else frame
    for needle, name in _COMPONENTS:
        if needle in where:
            return name
    return "other"


def profile_summary(text: str, *, top: int = 12) -> dict[str, Any]:
    """The frames with the most on-CPU samples: by self time, inclusive time and component (in %)."""
    own, inclusive, total = parse_collapsed(text)

    def rows(counter: Counter) -> list[dict[str, Any]]:
        return (
            [{"frame": f, "percent": round(100 * n / total, 1)} for f, n in counter.most_common(top)] if total else []
        )

    useful = Counter({f: n for f, n in inclusive.items() if not f.startswith(_ENTRY_FRAMES) and n < 0.95 * total})
    by_component: Counter = Counter()
    for frame, n in own.items():
        by_component[component(frame)] += n
    return {"samples": total, "self": rows(own), "inclusive": rows(useful), "components": rows(by_component)}


def format_profile(summary: Mapping[str, Any], *, title: str, top: int = 10) -> str:
    if not summary or not summary.get("samples"):
        return f"{title}: no samples"
    lines = [f"{title}: {summary['samples']} on-CPU samples (py-spy)"]
    lines.append("  self time by component:")
    lines += [f"    {r['percent']:5.1f}%  {r['frame']}" for r in summary.get("components", [])[:top]]
    lines.append("  self time:")
    lines += [f"    {r['percent']:5.1f}%  {r['frame']}" for r in summary["self"][:top]]
    lines.append("  inclusive (below the entry points):")
    lines += [f"    {r['percent']:5.1f}%  {r['frame']}" for r in summary["inclusive"][:top]]
    return "\n".join(lines)
