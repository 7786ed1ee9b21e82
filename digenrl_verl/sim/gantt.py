"""PNG Gantt chart of a trace, like the paper's Fig. 1 (one row per worker, one colour per task kind).

matplotlib is imported inside ``save_gantt`` (Agg backend), so importing this module costs nothing.
"""

from __future__ import annotations

from digenrl_verl.schedule.trace import Trace
from digenrl_verl.schedule.types import TaskKind, worker_pool

COLOURS = {
    TaskKind.GEN: "#4c72b0", TaskKind.TAG_GEN: "#8172b3", TaskKind.SCORE: "#dd8452",
    TaskKind.UPDATE: "#55a868", TaskKind.OPT_STEP: "#c44e52", TaskKind.SYNC: "#937860",
}


def _worker_key(worker: str) -> tuple[int, str, int]:
    pool, _, index = worker.partition(":")
    order = {"gen": 0, "col": 0, "trn": 1}.get(pool, 2)
    return (order, pool, int(index) if index.isdigit() else 0)


def save_gantt(trace: Trace, path: str, *, title: str = "", max_workers: int = 64, dpi: int = 110) -> None:
    """Write ``trace`` as a PNG Gantt chart to ``path``.

    With more than ``max_workers`` workers only the first ranks of each pool are drawn (the rest run the
    same tasks in lock-step within their lane or group).
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch

    events = trace.events
    workers = sorted({e.worker for e in events}, key=_worker_key)
    if len(workers) > max_workers:
        per_pool: dict[str, list[str]] = {}
        for w in workers:
            per_pool.setdefault(worker_pool(w), []).append(w)
        keep = max(1, max_workers // len(per_pool))
        workers = [w for ws in per_pool.values() for w in ws[:keep]]
    row = {w: i for i, w in enumerate(workers)}
    fig, ax = plt.subplots(figsize=(12, 1.2 + 0.28 * len(workers)))
    for e in events:
        if e.worker not in row:
            continue
        ax.barh(row[e.worker], e.end - e.start, left=e.start, height=0.8, color=COLOURS[e.kind],
                edgecolor="black" if not e.ok else "none", hatch="//" if not e.ok else None, linewidth=0.3)
    ax.set_yticks(range(len(workers)))
    ax.set_yticklabels(workers, fontsize=7)
    ax.invert_yaxis()
    ax.set_xlabel("time (s)")
    if title:
        ax.set_title(title)
    ax.legend(handles=[Patch(color=c, label=k.value) for k, c in COLOURS.items()], loc="upper center",
              bbox_to_anchor=(0.5, -0.12 if len(workers) > 8 else -0.25), ncol=len(COLOURS), fontsize=7,
              frameon=False)
    fig.tight_layout()
    fig.savefig(path, dpi=dpi)
    plt.close(fig)
