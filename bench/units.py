"""R and H: the units every report states its CPU costs in, measured in the same run.

Machines differ (``/healthz`` costs three times as much CPU on one as on another), so
the issue's targets are ratios to costs measured beside the figures, never absolute
times from another machine (issue 27):

* **R**: process CPU of one trio_mysql ``SELECT 1`` round trip (a helper process,
  ``python -m bench.calibrate``, runs rounds of round trips on one connection; R is the
  median of the rounds' CPU per trip);
* **H**: node process CPU per ``GET /healthz`` with 16 keep-alive clients (closed loop).

Pure: no I/O here (``bench/calibrate.py`` measures).
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping, Sequence
from typing import Any

import attrs

from .report import fmt_number, ratio

# Keep-alive clients of the H measurement (the issue's: 16).
H_CLIENTS = 16
# R measured again after the scenario differing from R by more than this: the report warns
# that the machine's speed changed under the scenario (its ratios to R move with it).
R_DRIFT_WARNING = 0.2


@attrs.frozen(kw_only=True)
class Units:
    """R and H of one run, in microseconds of CPU (NaN: not measured)."""

    r_us: float
    h_us: float = math.nan
    healthz_per_s: float = math.nan
    r_trips: int = 0
    h_requests: int = 0
    h_clients: int = H_CLIENTS
    # R measured again once the scenario has run (NaN: not measured).
    r_after_us: float = math.nan

    def r(self, us: float) -> float:
        """``us`` of CPU in R."""
        return ratio(us, self.r_us)

    def h(self, us: float) -> float:
        """``us`` of CPU in H."""
        return ratio(us, self.h_us)

    def r_drift(self) -> float:
        """How much R moved while the scenario ran: (R after - R) / R (NaN: not measured)."""
        return ratio(self.r_after_us - self.r_us, self.r_us)

    def describe(self) -> str:
        """The one-line statement of the units a report prints."""
        after = ""
        if self.r_after_us == self.r_after_us:
            after = f"; {fmt_number(self.r_after_us)} us after the scenario, {self.r_drift():+.0%}"
        r = f"R = {fmt_number(self.r_us)} us (CPU of one trio_mysql SELECT 1 round trip, {self.r_trips:,} trips{after})"
        if self.h_us == self.h_us:
            r += (
                f"; H = {cost(self.h_us, self)} (node CPU per GET /healthz, {self.h_clients} keep-alive clients, "
                f"{fmt_number(self.healthz_per_s)}/s, {self.h_requests:,} requests)"
            )
        else:
            r += "; H not measured"
        if abs(self.r_drift()) > R_DRIFT_WARNING:
            r += (
                f"  -- WARNING: R moved {self.r_drift():+.0%} while the scenario ran: the machine's speed changed, "
                "and every figure in R and H moves with it"
            )
        return r

    def to_json(self) -> dict[str, Any]:
        return attrs.asdict(self)

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Units:
        fields = {f.name for f in attrs.fields(cls)}
        values: dict[str, Any] = {k: (math.nan if v is None else v) for k, v in data.items() if k in fields}
        return cls(**values)


def cost(us: float, units: Units, *, in_h: bool = False) -> str:
    """A CPU cost as ``"488 us = 2.7 R"`` (``in_h``: ``"... = 2.3 H"`` as well)."""
    text = f"{fmt_number(us)} us = {fmt_number(units.r(us))} R"
    if in_h:
        text += f" = {fmt_number(units.h(us))} H"
    return text


def per_trip_us(rounds: Sequence[Sequence[float]]) -> float:
    """R from ``(cpu_seconds, trips)`` rounds: the median of the rounds' CPU per trip, in us.

    The median rather than the mean: a round the machine's other work slowed (cache,
    frequency) does not move it."""
    values = [cpu * 1e6 / trips for cpu, trips in rounds if trips > 0]
    return statistics.median(values) if values else math.nan
