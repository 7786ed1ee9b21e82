"""Traces: every task as events per worker, every decision, exports and metrics.

* ``Trace.to_chrome()`` -> Chrome trace JSON (open in https://ui.perfetto.dev or chrome://tracing).
* ``Trace.to_text()`` -> the schedule as readable text, one action per line, parsed back by
  ``parse_text`` (golden files use it). A line is::

      <start> <end> <KIND> s<step> m<microbatch|-> v<version> <workers> <ok|FAIL> [flags]

  where ``<workers>`` is ``gen:0=0-3,gen:1=4-7`` (sample ranges, ``|`` between non-contiguous runs)
  for tasks with samples and ``trn:0,trn:1`` otherwise, and ``flags`` is ``+tsp+stale`` or absent.
* ``Trace.metrics()`` -> per-worker busy/idle, utilisation, bubble fraction, makespan and, given a lower
  bound, efficiency = lower bound / makespan.

A completion whose ``info`` has ``phases`` (`PHASES`: a TAG on verl-omni's hybrid engine reports wake, sync,
generate, sleep) is drawn in the Chrome trace as its task's span with one sub-span per phase on each of its workers
(Perfetto nests them), and the span's args carry ``engine`` and ``switch_s`` (`SPAN_INFO_KEYS`). Completions
without phases export exactly as before. The text form never shows phases (golden files stay as they are).

The PNG Gantt chart lives in ``digenrl_verl.viz.gantt`` (matplotlib stays out of this package).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, Iterable, Sequence

from digenrl_verl.schedule.types import SAMPLE_KINDS, Completion, Task, TaskKind, worker_pool


PHASES = "phases"
"""`Completion.info` key: ``((name, seconds), ...)``, the task's phases in order; they sum to its duration."""
SPAN_INFO_KEYS = ("engine", "switch_s")
"""`Completion.info` keys copied into the args of a task's Chrome span when the completion reports phases."""
SWITCH_PHASES = frozenset({"wake", "sync", "sleep"})
"""Phase names that switch an engine (not the task's own work); the PNG draws them hatched."""


def phase_spans(c: Completion) -> list[tuple[str, float, float]]:
    """``(name, start, end)`` of each phase ``c.info`` reports (empty when none), laid end to end from ``c.start``;
    the last one ends at ``c.end`` (no rounding gap or overhang)."""
    phases = c.info.get(PHASES) or ()
    out, t = [], c.start
    for i, (name, seconds) in enumerate(phases):
        end = c.end if i == len(phases) - 1 else min(c.end, t + float(seconds))
        out.append((str(name), t, end))
        t = end
    return out


@dataclass(frozen=True)
class TraceEvent:
    """One task on one worker."""

    task_id: int
    worker: str
    kind: TaskKind
    step: int
    microbatch: int | None
    version: int
    start: float
    end: float
    ok: bool


@dataclass(frozen=True)
class Decision:
    """A scheduling decision: ``action`` is ``issue``, ``tag``, ``skip``, ``retry``, ``dead`` ..."""

    time: float
    action: str
    step: int | None = None
    microbatch: int | None = None
    task_id: int | None = None
    detail: str = ""


@dataclass
class WorkerStats:
    busy: float
    idle: float


@dataclass
class TraceMetrics:
    """Metrics of a trace over ``[start, end]``."""

    start: float
    end: float
    makespan: float
    utilisation: float
    bubble_fraction: float
    per_worker: dict[str, WorkerStats]
    lower_bound: float | None = None
    efficiency: float | None = None

    def as_dict(self) -> dict[str, Any]:
        return {
            "makespan": self.makespan, "utilisation": self.utilisation,
            "bubble_fraction": self.bubble_fraction, "lower_bound": self.lower_bound,
            "efficiency": self.efficiency,
            "per_worker": {w: {"busy": s.busy, "idle": s.idle} for w, s in self.per_worker.items()},
        }


def _ranges(samples: Sequence[int]) -> str:
    if not samples:
        return ""
    runs, first, prev = [], samples[0], samples[0]
    for s in samples[1:]:
        if s != prev + 1:
            runs.append((first, prev))
            first = s
        prev = s
    runs.append((first, prev))
    return "|".join(str(a) if a == b else f"{a}-{b}" for a, b in runs)


def _parse_ranges(text: str) -> tuple[int, ...]:
    out: list[int] = []
    for run in filter(None, text.split("|")):
        a, _, b = run.partition("-")
        out.extend(range(int(a), int(b or a) + 1))
    return tuple(out)


def format_action(c: Completion) -> str:
    """One line of the text form for a completed task."""
    t = c.task
    if t.kind in SAMPLE_KINDS:
        who = ",".join(f"{w}={_ranges(idx)}" for w, idx in t.assignment)
    else:
        who = ",".join(t.workers)
    mb = "-" if t.microbatch is None else str(t.microbatch)
    flags = "".join(f"+{f}" for f in sorted(t.flags))
    line = f"{c.start:.3f} {c.end:.3f} {t.kind.value} s{t.step} m{mb} v{t.version} {who} {'ok' if c.ok else 'FAIL'}"
    return f"{line} {flags}" if flags else line


@dataclass(frozen=True)
class ScheduleLine:
    """A parsed line of the text form."""

    start: float
    end: float
    kind: TaskKind
    step: int
    microbatch: int | None
    version: int
    workers: tuple[str, ...]
    assignment: tuple[tuple[str, tuple[int, ...]], ...]
    ok: bool
    flags: frozenset[str]

    def format(self) -> str:
        task = Task(0, self.kind, self.step, self.microbatch, self.workers, self.version,
                    self.assignment, self.flags)
        return format_action(Completion(task, self.start, self.end, self.ok))


def parse_line(line: str) -> ScheduleLine:
    parts = line.split()
    if len(parts) not in (8, 9):
        raise ValueError(f"not a schedule line (want 8 or 9 fields): {line!r}")
    start, end, kind, step, mb, version, who, ok = parts[:8]
    flags = frozenset(f for f in parts[8].split("+") if f) if len(parts) == 9 else frozenset()
    kind_ = TaskKind(kind)
    if kind_ in SAMPLE_KINDS:
        assignment = tuple((w, _parse_ranges(r)) for w, _, r in (x.partition("=") for x in who.split(",")))
        workers = tuple(w for w, _ in assignment)
    else:
        workers, assignment = tuple(who.split(",")), tuple((w, ()) for w in who.split(","))
    return ScheduleLine(float(start), float(end), kind_, int(step[1:]),
                        None if mb == "m-" else int(mb[1:]), int(version[1:]), workers, assignment,
                        ok == "ok", flags)


def parse_text(text: str) -> list[ScheduleLine]:
    """Parse the text form (blank lines and ``#`` comments are skipped)."""
    return [parse_line(ln) for ln in text.splitlines() if ln.strip() and not ln.lstrip().startswith("#")]


@dataclass
class Trace:
    """Everything the driver did: completions (one per task), per-worker events and decisions."""

    completions: list[Completion] = field(default_factory=list)
    decisions: list[Decision] = field(default_factory=list)
    record_decisions: bool = True

    def record(self, completion: Completion) -> None:
        self.completions.append(completion)

    def decide(self, decision: Decision) -> None:
        if self.record_decisions:
            self.decisions.append(decision)

    @property
    def events(self) -> list[TraceEvent]:
        out = []
        for c in self.completions:
            t = c.task
            out.extend(TraceEvent(t.task_id, w, t.kind, t.step, t.microbatch, t.version, c.start, c.end, c.ok)
                       for w in t.workers)
        return out

    # -- text form --------------------------------------------------------------------------------
    def sorted_completions(self) -> list[Completion]:
        return sorted(self.completions, key=lambda c: (c.start, c.task.task_id))

    def to_text(self) -> str:
        return "\n".join(format_action(c) for c in self.sorted_completions()) + "\n"

    # -- Chrome / Perfetto ------------------------------------------------------------------------
    def to_chrome(self) -> dict[str, Any]:
        """Chrome trace JSON: one process per pool, one thread per worker, microseconds."""
        events: list[dict[str, Any]] = []
        pools: dict[str, int] = {}
        workers: dict[str, int] = {}
        phased = {c.task.task_id: c for c in self.completions if c.info.get(PHASES)}
        for e in sorted(self.events, key=lambda e: (e.start, e.worker)):
            pool = worker_pool(e.worker)
            pid = pools.setdefault(pool, len(pools) + 1)
            tid = workers.setdefault(e.worker, len(workers) + 1)
            mb = "-" if e.microbatch is None else e.microbatch
            args: dict[str, Any] = {"task_id": e.task_id, "step": e.step, "microbatch": e.microbatch,
                                    "version": e.version, "ok": e.ok}
            c = phased.get(e.task_id)
            if c is not None:
                args.update({k: c.info[k] for k in SPAN_INFO_KEYS if k in c.info})
            events.append({"name": f"{e.kind.value} s{e.step} m{mb}", "cat": e.kind.value, "ph": "X",
                           "ts": e.start * 1e6, "dur": (e.end - e.start) * 1e6, "pid": pid, "tid": tid,
                           "args": args})
            if c is not None:
                events.extend({"name": name, "cat": f"{e.kind.value}.{name}", "ph": "X", "ts": a * 1e6,
                               "dur": (b - a) * 1e6, "pid": pid, "tid": tid,
                               "args": {"task_id": e.task_id, "phase": name, "seconds": float(seconds)}}
                              for (name, a, b), (_, seconds) in zip(phase_spans(c), c.info[PHASES]))
        driver_pid = len(pools) + 1
        for d in self.decisions:
            events.append({"name": d.action, "ph": "i", "s": "p", "ts": d.time * 1e6, "pid": driver_pid,
                           "tid": 0, "args": {"step": d.step, "microbatch": d.microbatch,
                                              "task_id": d.task_id, "detail": d.detail}})
        meta = [{"name": "process_name", "ph": "M", "pid": pid, "args": {"name": pool}}
                for pool, pid in pools.items()]
        meta += [{"name": "thread_name", "ph": "M", "pid": pools[worker_pool(w)], "tid": tid,
                  "args": {"name": w}} for w, tid in workers.items()]
        meta.append({"name": "process_name", "ph": "M", "pid": driver_pid, "args": {"name": "driver"}})
        return {"traceEvents": meta + events, "displayTimeUnit": "ms"}

    def write_chrome(self, path: str) -> None:
        with open(path, "w") as fh:
            json.dump(self.to_chrome(), fh)

    # -- metrics ----------------------------------------------------------------------------------
    def metrics(self, workers: Iterable[str] | None = None, lower_bound: float | None = None) -> TraceMetrics:
        """Busy/idle per worker over the trace's span; workers without events count as all idle."""
        events = self.events
        if not events:
            return TraceMetrics(0.0, 0.0, 0.0, 0.0, 0.0, {}, lower_bound, None)
        start = min(e.start for e in events)
        end = max(e.end for e in events)
        span = end - start
        busy: dict[str, float] = {w: 0.0 for w in (workers or ())}
        for e in events:
            busy[e.worker] = busy.get(e.worker, 0.0) + (e.end - e.start)
        per_worker = {w: WorkerStats(b, span - b) for w, b in sorted(busy.items())}
        total = span * len(per_worker)
        util = sum(busy.values()) / total if total > 0 else 0.0
        eff = (lower_bound / span) if (lower_bound is not None and span > 0) else None
        return TraceMetrics(start, end, span, util, 1.0 - util, per_worker, lower_bound, eff)
