"""PNG Gantt chart of a trace, like the paper's Fig. 1 (one row per worker, one colour per task kind).

Bubbles are shown as numbers, not only as white space: each row is labelled with its worker's idle share
(``gen:0 (idle 17%)``) and the title gives the makespan and the overall bubble fraction, all taken from
`Trace.metrics` over the trace's span (first task start to last task end; a task that failed still
occupied its worker, so it counts as busy).

A task whose completion reports phases (`schedule.trace.PHASES`: a TAG on verl-omni's hybrid engine) has its engine
switch (`schedule.trace.SWITCH_PHASES`: wake, sync, sleep) drawn hatched over its bar, and the legend gains
"TAG switch"; a trace without phases draws as before.

matplotlib is imported inside ``save_gantt`` (Agg backend), so importing this module costs nothing.
"""

from __future__ import annotations

from dataclasses import dataclass

from digenrl_verl.schedule.trace import SWITCH_PHASES, Trace, TraceMetrics, phase_spans
from digenrl_verl.schedule.types import TaskKind, parse_worker, worker_pool

COLOURS = {
    TaskKind.GEN: "#4c72b0", TaskKind.TAG_GEN: "#8172b3", TaskKind.SCORE: "#dd8452",
    TaskKind.UPDATE: "#55a868", TaskKind.OPT_STEP: "#c44e52", TaskKind.SYNC: "#937860",
    TaskKind.CHECKPOINT: "#7f7f7f",
}
SWITCH_COLOUR = "#d9d2ec"
"""The engine switch inside a hybrid-engine TAG bar (a light shade of the TAG colour, hatched)."""


@dataclass(frozen=True)
class GanttInfo:
    """What `save_gantt` drew: the row labels (top to bottom) and the title, as they appear in the PNG."""

    labels: tuple[str, ...]
    title: str
    switch_spans: int = 0
    """Engine-switch phases drawn (one per phase per drawn worker; 0 without hybrid-engine TAGs)."""


def _worker_key(worker: str) -> tuple[int, str, int]:
    pool, rank = parse_worker(worker)
    return ({"gen": 0, "col": 0, "trn": 1}.get(pool, 2), pool, rank)


def _percent(fraction: float) -> str:
    """17% / 2.9% / 0.0%: one decimal below 10% so that small bubbles stay visible."""
    pct = 100.0 * fraction
    return f"{pct:.0f}%" if pct >= 9.95 else f"{pct:.1f}%"


def idle_share(metrics: TraceMetrics, worker: str) -> float:
    """Fraction of the trace's span ``worker`` was idle (0 for an empty trace)."""
    stats = metrics.per_worker.get(worker)
    if stats is None or metrics.makespan <= 0:
        return 0.0
    return stats.idle / metrics.makespan


def worker_label(metrics: TraceMetrics, worker: str) -> str:
    """Row label, e.g. ``gen:0 (idle 17%)``."""
    return f"{worker} (idle {_percent(idle_share(metrics, worker))})"


def chart_title(metrics: TraceMetrics, title: str = "") -> str:
    """``<title>`` and, on the next line, the makespan and the bubble fraction over every worker."""
    summary = (f"makespan {metrics.makespan:.1f} s, bubble fraction {_percent(metrics.bubble_fraction)} "
               f"(idle share of {len(metrics.per_worker)} workers)")
    return f"{title}\n{summary}" if title else summary


def save_gantt(trace: Trace, path: str, *, title: str = "", max_workers: int = 64, dpi: int = 110) -> GanttInfo:
    """Write ``trace`` as a PNG Gantt chart to ``path``; returns the labels and title it drew.

    With more than ``max_workers`` workers only the first ranks of each pool are drawn (the rest run the
    same tasks in lock-step within their lane or group); the title's bubble fraction still covers all.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch

    events = trace.events
    metrics = trace.metrics()
    workers = sorted({e.worker for e in events}, key=_worker_key)
    if len(workers) > max_workers:
        per_pool: dict[str, list[str]] = {}
        for w in workers:
            per_pool.setdefault(worker_pool(w), []).append(w)
        keep = max(1, max_workers // len(per_pool))
        workers = [w for ws in per_pool.values() for w in ws[:keep]]
    row = {w: i for i, w in enumerate(workers)}
    fig, ax = plt.subplots(figsize=(12, 1.6 + 0.28 * len(workers)))
    try:
        for e in events:
            if e.worker not in row:
                continue
            ax.barh(row[e.worker], e.end - e.start, left=e.start, height=0.8, color=COLOURS[e.kind],
                    edgecolor="black" if not e.ok else "none", hatch="//" if not e.ok else None, linewidth=0.3)
        switch_spans = _draw_switches(ax, trace, row)
        ax.set_yticks(range(len(workers)))
        ax.set_yticklabels([worker_label(metrics, w) for w in workers], fontsize=7)
        ax.invert_yaxis()
        ax.set_xlabel("time (s)")
        ax.set_title(chart_title(metrics, title), fontsize=9, pad=16)
        # the legend sits between the title and the chart, so it never covers the x-axis label
        handles = [Patch(color=c, label=k.value) for k, c in COLOURS.items()]
        if switch_spans:
            handles.append(Patch(facecolor=SWITCH_COLOUR, hatch="xx", edgecolor=COLOURS[TaskKind.TAG_GEN],
                                 label="TAG switch"))
        ax.legend(handles=handles, loc="lower center", bbox_to_anchor=(0.5, 1.0), ncol=len(handles), fontsize=7,
                  frameon=False)
        fig.tight_layout()
        fig.savefig(path, dpi=dpi)
        return GanttInfo(tuple(t.get_text() for t in ax.get_yticklabels()), ax.get_title(), switch_spans)
    finally:
        plt.close(fig)


def _draw_switches(ax, trace: Trace, row: dict[str, int]) -> int:
    """Overlay the engine-switch phases of every completion that reports phases; returns how many were drawn."""
    drawn = 0
    for c in trace.completions:
        for name, start, end in phase_spans(c):
            if name not in SWITCH_PHASES:
                continue
            for w in c.task.workers:
                if w in row:
                    ax.barh(row[w], end - start, left=start, height=0.8, color=SWITCH_COLOUR, hatch="xx",
                            edgecolor=COLOURS[TaskKind.TAG_GEN], linewidth=0.0)
                    drawn += 1
    return drawn
