"""Gantt-style chart of a simulation: which request ran in which step.

One row per request (trace order, first at the top); a bar wherever a step
computed some of its tokens, orange for prefill (or recompute) and blue for
decode; a grey line from arrival to the first scheduled step (queueing) and a
red cross where the request was preempted.
"""

from __future__ import annotations

from pathlib import Path

from paternoster.simulate.results import SimulationResult

_COLORS = {"prefill": "tab:orange", "decode": "tab:blue"}


def _segments(result: SimulationResult, x: str) -> dict[tuple[int, str], list[tuple[float, float]]]:
    """Per (request, kind), merged ``(start, width)`` bars over consecutive steps."""
    bars: dict[tuple[int, str], list[list[float]]] = {}
    for step in result.steps:
        lo, hi = (step.start, step.end) if x == "time" else (step.index - 1, step.index)
        for req, _n, kind in step.rows:
            segs = bars.setdefault((req, kind), [])
            if segs and abs(segs[-1][1] - lo) < 1e-12:
                segs[-1][1] = hi
            else:
                segs.append([lo, hi])
    return {k: [(a, b - a) for a, b in v] for k, v in bars.items()}


def plot_gantt(result: SimulationResult, path: str | Path, x: str = "time") -> None:
    """Write the chart of ``result`` as a PNG.

    Args:
        result: a finished simulation.
        path: output file (``.png``).
        x: ``"time"`` (virtual time on the x axis) or ``"step"`` (step number).
    Raises:
        ValueError: ``x`` is neither ``"time"`` nor ``"step"``.
        ImportError: matplotlib is not installed.
    """
    if x not in ("time", "step"):
        raise ValueError(f"x must be 'time' or 'step', got {x!r}")
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    n = len(result.requests)
    height = min(max(3.0, 0.12 * n + 1.5), 40.0)
    fig, ax = plt.subplots(figsize=(12, height))
    try:
        for (req, kind), segs in sorted(_segments(result, x).items()):
            ax.broken_barh(segs, (req - 0.4, 0.8), facecolors=_COLORS[kind], linewidth=0)
        if x == "time":
            for i, m in enumerate(result.requests):
                if m.first_scheduled_time is not None and m.first_scheduled_time > m.arrival_time:
                    ax.hlines(i, m.arrival_time, m.first_scheduled_time, colors="0.75", lw=1)
        cross_x, cross_y = [], []
        for step in result.steps:
            for req in step.preempted:
                cross_x.append(step.start if x == "time" else step.index - 1)
                cross_y.append(req)
        if cross_x:
            ax.scatter(cross_x, cross_y, marker="x", color="tab:red", s=18, zorder=3)
        ax.set_ylim(n - 0.5, -0.5)
        ax.set_ylabel("request (trace order)")
        per_token = ("a_prefill", "a_decode", "a_kv")
        unit = "s" if any(result.cost_model.get(k, 0) for k in per_token) else "time units"
        ax.set_xlabel(f"virtual time ({unit})" if x == "time" else "step")
        handles = [plt.Rectangle((0, 0), 1, 1, color=c) for c in _COLORS.values()]
        labels = list(_COLORS)
        if cross_x:
            handles.append(plt.Line2D([], [], marker="x", color="tab:red", lw=0))
            labels.append("preempted")
        ax.legend(handles, labels, loc="upper right", fontsize=8)
        ax.set_title(f"{result.scheduler}: {n} requests, {len(result.steps)} steps")
        fig.tight_layout()
        fig.savefig(path, dpi=100)
    finally:
        plt.close(fig)
