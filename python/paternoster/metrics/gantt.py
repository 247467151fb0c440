"""Gantt chart of a request timeline: which request ran when.

One row per request (snapshot order, first at the top); a bar wherever a step
computed some of its tokens, orange for prefill (or recompute) and blue for
decode; a grey line while it waited (after arrival and after each preemption;
time axis only) and a red cross where it was preempted. The engine's
timelines and the simulator (``paternoster simulate``) share this chart.
"""

from __future__ import annotations

from pathlib import Path

from paternoster.metrics.timeline import queue_intervals, timeline_origin

COLORS = {"prefill": "tab:orange", "decode": "tab:blue"}
#: Rows up to which the y axis shows request ids instead of row numbers.
MAX_LABELLED_ROWS = 40


def plot_timeline_gantt(
    snapshot: dict,
    path: str | Path,
    x: str = "time",
    title: str | None = None,
    xlabel: str | None = None,
    ylabel: str = "request (arrival order)",
) -> None:
    """Write the Gantt chart of a timeline snapshot as a PNG (matplotlib, Agg).

    Args:
        snapshot: ``TimelineRecorder.snapshot()`` or the simulator's ``to_timeline``.
        path: output file (``.png``).
        x: ``"time"`` (seconds since the snapshot's origin) or ``"step"`` (step index).
        title: chart title (default: counts of requests and steps).
        xlabel: x-axis label (default: from ``x``).
        ylabel: y-axis label.
    Raises:
        ValueError: ``x`` is neither ``"time"`` nor ``"step"``.
        ImportError: matplotlib is not installed.
    """
    if x not in ("time", "step"):
        raise ValueError(f"x must be 'time' or 'step', got {x!r}")
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    origin = timeline_origin(snapshot)
    requests = snapshot["requests"]
    n = len(requests)
    bars: dict[str, list[tuple[int, float, float]]] = {kind: [] for kind in COLORS}
    queue: list[tuple[int, float, float]] = []
    cross_x: list[float] = []
    cross_y: list[int] = []
    for row, req in enumerate(requests):
        for e in req["events"]:
            if e["kind"] == "preempt":
                cross_x.append(e["time"] - origin if x == "time" else e["step"])
                cross_y.append(row)
            elif x == "time":
                bars[e["kind"]].append((row, e["start"] - origin, e["end"] - e["start"]))
            else:
                bars[e["kind"]].append((row, e["first_step"], e["last_step"] - e["first_step"] + 1))
        if x == "time":
            for start, end in queue_intervals(req, snapshot["now"]):
                if end > start:
                    queue.append((row, start - origin, end - origin))

    height = min(max(3.0, 0.12 * n + 1.5), 40.0)
    fig, ax = plt.subplots(figsize=(12, height))
    try:
        for kind, segs in bars.items():
            if segs:
                rows, lefts, widths = zip(*segs)
                ax.barh(rows, widths, left=lefts, height=0.8, color=COLORS[kind], linewidth=0)
        if queue:
            rows, lo, hi = zip(*queue)
            ax.hlines(rows, lo, hi, colors="0.75", lw=1)
        if cross_x:
            ax.scatter(cross_x, cross_y, marker="x", color="tab:red", s=18, zorder=3)
        ax.set_ylim(max(n, 1) - 0.5, -0.5)
        if 0 < n <= MAX_LABELLED_ROWS:
            ax.set_yticks(range(n), [str(r["request_id"])[:24] for r in requests], fontsize=7)
        ax.set_ylabel(ylabel)
        if xlabel is None:
            xlabel = "time since the first event (s)" if x == "time" else "engine step"
        ax.set_xlabel(xlabel)
        handles = [plt.Rectangle((0, 0), 1, 1, color=c) for c in COLORS.values()]
        labels = list(COLORS)
        if cross_x:
            handles.append(plt.Line2D([], [], marker="x", color="tab:red", lw=0))
            labels.append("preempted")
        if queue:
            handles.append(plt.Line2D([], [], color="0.75"))
            labels.append("waiting")
        ax.legend(handles, labels, loc="upper right", fontsize=8)
        ax.set_title(title or f"{n} requests, {len(snapshot['steps'])} steps")
        fig.tight_layout()
        fig.savefig(path, dpi=100)
    finally:
        plt.close(fig)
