"""PNG plots (matplotlib, Agg backend). Only the harness driver imports this module."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

# Figure size in inches and resolution: readable in a README at 100 dpi.
SIZE = (8, 4.5)
DPI = 100


def _save(fig, path: Path) -> Path:
    fig.tight_layout()
    fig.savefig(path, dpi=DPI)
    plt.close(fig)
    return path


def bar(
    path: Path, labels: Sequence[str], values: Sequence[float], *, title: str, ylabel: str, log: bool = False
) -> Path:
    fig, ax = plt.subplots(figsize=SIZE)
    bars = ax.bar(labels, values, color="#4477aa")
    for b, v in zip(bars, values, strict=False):
        ax.annotate(
            f"{v:,.0f}" if v >= 10 else f"{v:.2f}",
            (b.get_x() + b.get_width() / 2, b.get_height()),
            ha="center",
            va="bottom",
            fontsize=8,
        )
    ax.set_title(title)
    ax.set_ylabel(ylabel)
    if log:
        ax.set_yscale("log")
    ax.tick_params(axis="x", labelrotation=15)
    return _save(fig, path)


def lines(
    path: Path,
    series: Mapping[str, Sequence[tuple[float, float]]],
    *,
    title: str,
    xlabel: str,
    ylabel: str,
    log_y: bool = False,
    vlines: Mapping[str, float] | None = None,
) -> Path:
    fig, ax = plt.subplots(figsize=SIZE)
    for name, points in series.items():
        if points:
            xs, ys = zip(*points, strict=False)
            ax.plot(xs, ys, label=name, linewidth=1.3)
    for name, x in (vlines or {}).items():
        ax.axvline(x, color="grey", linestyle=":", linewidth=1)
        ax.annotate(name, (x, ax.get_ylim()[1]), fontsize=8, rotation=90, va="top", ha="right")
    ax.set_title(title)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    if log_y:
        ax.set_yscale("log")
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    return _save(fig, path)


def cdf(path: Path, samples: Mapping[str, Sequence[float]], *, title: str, xlabel: str, log_x: bool = True) -> Path:
    fig, ax = plt.subplots(figsize=SIZE)
    for name, values in samples.items():
        data = sorted(v for v in values if v is not None)
        if not data:
            continue
        n = len(data)
        ax.plot(data, [(i + 1) / n for i in range(n)], label=f"{name} (n={n:,})", linewidth=1.3)
    ax.set_title(title)
    ax.set_xlabel(xlabel)
    ax.set_ylabel("fraction of tasks")
    if log_x:
        ax.set_xscale("log")
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3, which="both")
    return _save(fig, path)


def boxes(
    path: Path,
    groups: Mapping[str, Sequence[float]],
    *,
    title: str,
    xlabel: str,
    ylabel: str,
    hline: float | None = None,
) -> Path:
    fig, ax = plt.subplots(figsize=SIZE)
    names = list(groups)
    ax.boxplot([list(groups[n]) or [0.0] for n in names], tick_labels=names, showfliers=False, whis=(1, 99))
    if hline is not None:
        ax.axhline(hline, color="grey", linestyle=":", linewidth=1)
    ax.set_title(title)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.grid(alpha=0.3, axis="y")
    return _save(fig, path)
