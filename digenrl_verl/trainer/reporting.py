"""What a run leaves behind and shows: tqdm progress, metrics.jsonl, verl Tracking, a summary table.

Every run writes into its output directory:
- `metrics.jsonl`: one JSON object per global step (the same dict Tracking receives) plus a final
  `{"summary": ...}` line;
- `trace.json`: the Chrome/Perfetto trace of every task each worker ran (`schedule.trace`);
- `timeline.png`: the Gantt chart of that trace, with each worker's bubble time (`viz.gantt`);
- `tensorboard/` when `trainer.logger` includes tensorboard.
"""

from __future__ import annotations

import io
import json
import math
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping, Sequence


def _jsonable(v: Any) -> Any:
    if isinstance(v, float) and not math.isfinite(v):
        return str(v)
    if hasattr(v, "item") and getattr(v, "ndim", 1) == 0:
        return _jsonable(v.item())
    return v


@dataclass
class RunReporter:
    """Progress, per-step metrics and the closing summary of one run."""

    output_dir: Path
    project_name: str
    experiment_name: str
    loggers: Sequence[str] = ("console",)
    total_steps: int = 1
    config: Mapping[str, Any] | None = None
    history: list[dict[str, Any]] = field(default_factory=list)
    _metrics: Any = field(init=False, repr=False)  # metrics.jsonl, line-buffered
    _tracking: Any = field(init=False, repr=False)  # verl Tracking, when a logger other than console is set
    _bar: Any = field(init=False, repr=False)  # the tqdm progress bar

    def __post_init__(self) -> None:
        from tqdm.auto import tqdm

        self.output_dir = Path(self.output_dir)
        self.output_dir.mkdir(parents=True, exist_ok=True)
        self._metrics = open(self.output_dir / "metrics.jsonl", "a", buffering=1)
        self._tracking = None
        backends = [b for b in self.loggers if b != "console"]  # console output is the tqdm bar + table
        if backends:
            os.environ.setdefault("TENSORBOARD_DIR", str(self.output_dir / "tensorboard"))
            from verl.utils.tracking import Tracking

            self._tracking = Tracking(self.project_name, self.experiment_name, backends, config=self.config)
        self._bar = tqdm(total=self.total_steps, desc=self.experiment_name, unit="step", dynamic_ncols=True)

    def log_step(self, step: int, metrics: Mapping[str, Any]) -> None:
        row = {"step": step, **{k: _jsonable(v) for k, v in metrics.items()}}
        self.history.append(row)
        self._metrics.write(json.dumps(row) + "\n")
        if self._tracking is not None:
            self._tracking.log({k: v for k, v in metrics.items() if isinstance(v, (int, float))}, step=step)
        shown = {k: metrics[k] for k in ("reward/mean", "throughput/samples_per_s") if k in metrics}
        self._bar.set_postfix({k.split("/")[-1]: f"{v:.3g}" for k, v in shown.items()})
        self._bar.update(1)

    def log_metrics(self, step: int, metrics: Mapping[str, Any]) -> None:
        """Metrics that are not a training step's (validation runs): a metrics.jsonl row and the trackers at `step`;
        not in `history`, the progress bar does not move."""
        self._metrics.write(json.dumps({"step": step, **{k: _jsonable(v) for k, v in metrics.items()}}) + "\n")
        if self._tracking is not None:
            self._tracking.log({k: v for k, v in metrics.items() if isinstance(v, (int, float))}, step=step)

    def close(self, summary: Mapping[str, Any], workers: Sequence[Mapping[str, Any]] = ()) -> str:
        """Write the summary line, print the summary table, and return the table as text."""
        self._bar.close()
        self._metrics.write(json.dumps({"summary": {k: _jsonable(v) for k, v in summary.items()},
                                        "workers": list(workers)}) + "\n")
        self._metrics.close()
        if self._tracking is not None:
            self._tracking.finish()
        text = summary_table(summary, workers)
        print(text)
        return text


def summary_table(summary: Mapping[str, Any], workers: Sequence[Mapping[str, Any]]) -> str:
    """The closing table (rich, rendered to text so it also lands in logs)."""
    from rich.console import Console
    from rich.table import Table

    console = Console(record=True, width=110, force_terminal=False, file=io.StringIO())
    run = Table(title="run summary", show_header=False)
    for k, v in summary.items():
        run.add_row(k, f"{v:.4g}" if isinstance(v, float) else str(v))
    console.print(run)
    if workers:
        cols = list(workers[0].keys())
        wt = Table(title="workers")
        for c in cols:
            wt.add_column(c)
        for w in workers:
            wt.add_row(*[f"{w[c]:.3g}" if isinstance(w[c], float) else str(w[c]) for c in cols])
        console.print(wt)
    return console.export_text()
