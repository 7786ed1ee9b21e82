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
import sys
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Mapping, Sequence

import numpy as np

from digenrl_verl.metric_names import METRICS as M


def _jsonable(v: Any) -> Any:
    if isinstance(v, float) and not math.isfinite(v):
        return str(v)
    if hasattr(v, "item") and getattr(v, "ndim", 1) == 0:
        return _jsonable(v.item())
    return v


CONSOLE = {"reward": "reward_mean", "img/s/dev": "throughput"}
"""What the progress bar shows: label -> quantity (`metric_names.METRICS`)."""


def _mean_max_min(values: np.ndarray, quantity: str) -> dict[str, float]:
    """`<quantity>_mean|max|min` of `values` under their logged names (NaN when there is none)."""
    fns = {"mean": np.mean, "max": np.max, "min": np.min}
    return {M[f"{quantity}_{k}"]: float(f(values)) if values.size else float("nan") for k, f in fns.items()}


def data_metrics(rewards: Mapping[int, float], uids: Sequence[Any], advantage) -> dict[str, float]:
    """verl-omni's `compute_data_metrics_diffusion` of a step batch, from its rewards (sample id -> reward; `uids[i]`
    is sample i's prompt group) and its advantage config (`AdvantageConfig`): reward mean / max / min over the
    samples, the prompt groups' zero-std ratio, mean (population) std and size, the advantages before the loss's
    clamp (verl-omni clamps in the loss) and the returns (= the advantages, as verl-omni's GRPO); plus our std and
    non-finite count. Samples with a NaN/inf reward are left out (they add no gradient: advantage 0); verl-omni has
    no such rule (its statistics would be NaN)."""
    from digenrl_verl.diffusion.advantages import normalize_rewards

    ids = sorted(rewards)
    r_all = np.array([rewards[i] for i in ids], dtype=np.float64)
    keep = np.isfinite(r_all)
    r, group = r_all[keep], np.array([str(uids[i]) for i in ids], dtype=object)[keep]
    out = {M["reward_std"]: float(r.std()) if r.size else float("nan"),
           M["reward_nonfinite"]: int(r_all.size - r.size), **_mean_max_min(r, "reward")}
    adv = np.zeros(0)
    stds = np.array([r[group == g].std() for g in dict.fromkeys(group)])
    out.update({M["reward_zero_std_ratio"]: float(np.mean(stds == 0)) if stds.size else float("nan"),
                M["reward_std_mean"]: float(stds.mean()) if stds.size else float("nan"),
                M["reward_group_size"]: r.size / stds.size if stds.size else float("nan")})
    if r.size:
        unclamped = replace(advantage, adv_clip_max=None)
        adv = normalize_rewards(r, list(group), unclamped).advantages.double().numpy()
    return {**out, **_mean_max_min(adv, "advantage"), **_mean_max_min(adv, "return")}


def perf_metrics(step: int, samples: int, step_s: float, devices: int) -> dict[str, float]:
    """verl-omni's timing and throughput metrics of a step (0-based `step`; verl counts from 1): its wall time
    (first task start to the end of its SYNC), images, and images per second per device."""
    per_device = samples / (step_s * devices) if step_s > 0 and devices > 0 else float("nan")
    return {M["global_step"]: step + 1, M["step_s"]: step_s, M["time_per_step"]: step_s, M["num_images"]: samples,
            M["throughput"]: per_device}


def staleness_metrics(gen_versions: Mapping[int, int], version: int) -> dict[str, float]:
    """verl-omni's (v1) trajectory staleness, in policy versions: the version the step trained minus the one each
    sample was generated with (`gen_versions`: version -> samples; a trajectory has one version here, so verl-omni's
    span is 1 and its worst staleness is this one)."""
    lag = np.repeat([version - v for v in gen_versions], [int(c) for c in gen_versions.values()])
    return _mean_max_min(lag.astype(np.float64), "staleness") if lag.size else {}


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
        shown = {label: metrics[M[q]] for label, q in CONSOLE.items() if M[q] in metrics}
        self._bar.set_postfix({label: f"{v:.3g}" for label, v in shown.items()})
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
        sys.stderr.flush()  # the bar's last frame (stderr) before the table (stdout) on a shared console
        print(text, flush=True)
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
