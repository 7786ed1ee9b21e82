"""Check a finished run's completions against the scheduling invariants.

Works on any trace (simulated or Ray), so a real run can be audited the same way as the property tests
audit the simulator. Returns human-readable violations; an empty list means the run is consistent.

Checked:

1. no worker runs two tasks at once;
2. per step, successful generation (GEN or TAG_GEN) covers every sample exactly once (a generation
   whose data a failed SCORE reported lost, ``info["data_lost"]``, does not count), and so do
   successful UPDATEs; a micro-batch is updated only after it was generated and scored;
3. every generation task carries the version its workers held when it started (generators: the last
   SYNC they received; trainers, and colocated ranks: the last OPT_STEP), with ``v <= step`` and
   ``step - v <= W``; a trajectory therefore has one version (weights change only through SYNC or
   OPT_STEP, and (1) forbids those while a generation task runs on the same workers);
4. generation of step s starts after the OPT_STEP of step ``s - 1 - W``;
5. per step, stale samples (version < step) are at most ``floor(max_stale_fraction * samples)``;
6. at most ``max_gen_futures`` generation tasks run at once;
7. UPDATEs of step s start after OPT_STEP(s-1); OPT_STEP(s) starts after every UPDATE of s; SYNC(s)
   after OPT_STEP(s) (a ``join`` SYNC, weights to a generator that joined the pool, is not a step's SYNC:
   it only counts as a version change for (3)). With ``mini_batches_per_step = k``: a step has exactly k
   successful OPT_STEPs, the first k-1 flagged ``minibatch`` at version s, the last at version s+1; the UPDATEs of
   mini-batch j (`ScheduleConfig.minibatch_of`; an UPDATE holds one mini-batch) start after the step's
   OPT_STEP j-1 ended and end before its OPT_STEP j started; OPT_STEP(s) above means its last one; no generation
   on the trainer (TAG) and no SYNC on the trainer runs between a step's first and last OPT_STEP;
8. with W = 0 (disaggregated), no task of step s starts before SYNC(s-1) ends;
9. checkpoint barriers (``checkpoint_every = k``): every step s with (s + 1) % k == 0 has exactly one
   successful CHECKPOINT (version s + 1, on the trainer pool) and no other step has one; it starts after
   every task of steps <= s ended (drained), and nothing of step s + 1 starts before it ends.
"""

from __future__ import annotations

import math
from collections import defaultdict
from typing import Iterable

from digenrl_verl.schedule.config import ScheduleConfig
from digenrl_verl.schedule.types import Completion, TaskKind, worker_pool

GEN_KINDS = (TaskKind.GEN, TaskKind.TAG_GEN)
EPS = 1e-9


def _overlaps(completions: list[Completion]) -> list[str]:
    per_worker: dict[str, list[Completion]] = defaultdict(list)
    for c in completions:
        for w in c.task.workers:
            per_worker[w].append(c)
    out = []
    for w, cs in per_worker.items():
        cs.sort(key=lambda c: (c.start, c.end))
        for a, b in zip(cs, cs[1:]):
            if b.start < a.end - EPS:
                out.append(f"{w} runs {a.task.label} and {b.task.label} at once")
    return out


def _live_generations(all_: list[Completion]) -> list[Completion]:
    """Successful generations, minus those whose data a later failed SCORE reported lost."""
    live: dict[tuple[int, int | None], list[Completion]] = defaultdict(list)
    for c in sorted(all_, key=lambda c: (c.end, c.task.task_id)):
        key = (c.task.step, c.task.microbatch)
        if c.ok and c.task.kind in GEN_KINDS:
            live[key].append(c)
        elif not c.ok and c.task.kind == TaskKind.SCORE and c.info.get("data_lost") and live[key]:
            live[key].pop()
    return [c for cs in live.values() for c in cs]


def _coverage(cfg: ScheduleConfig, ok: list[Completion], all_: list[Completion]) -> list[str]:
    out = []
    everything = list(range(cfg.samples_per_step))
    counted = _live_generations(all_) + [c for c in ok if c.task.kind == TaskKind.UPDATE]
    for step in range(cfg.start_step, cfg.end_step):
        for kinds, what in ((GEN_KINDS, "generated"), ((TaskKind.UPDATE,), "updated")):
            got = sorted(i for c in counted if c.task.step == step and c.task.kind in kinds for i in c.task.samples)
            if got != everything:
                dup = len(got) - len(set(got))
                out.append(f"step {step}: samples {what} {len(got)} times ({dup} duplicates), want each once")
    done: dict[tuple[int, int | None, TaskKind], float] = {}
    for c in ok:
        if c.task.kind in GEN_KINDS + (TaskKind.SCORE,):
            kind = TaskKind.SCORE if c.task.kind == TaskKind.SCORE else TaskKind.GEN
            done[(c.task.step, c.task.microbatch, kind)] = c.end
    for c in ok:
        if c.task.kind == TaskKind.UPDATE:
            for kind in (TaskKind.GEN, TaskKind.SCORE):
                end = done.get((c.task.step, c.task.microbatch, kind))
                if end is None or end > c.start + EPS:
                    out.append(f"{c.task.label} starts before its {kind.value} ended")
    return out


def _versions(cfg: ScheduleConfig, ok: list[Completion]) -> list[str]:
    out = []
    changes: dict[str, list[tuple[float, int]]] = defaultdict(list)
    for c in ok:
        if c.task.kind in (TaskKind.SYNC, TaskKind.OPT_STEP):
            for w in c.task.workers:
                if c.task.kind == TaskKind.SYNC or cfg.mode == "colocated" or worker_pool(w) != "gen":
                    changes[w].append((c.end, c.task.version))

    def held(worker: str, at: float) -> int:
        version = cfg.start_step
        for end, v in sorted(changes[worker]):
            if end <= at + EPS:
                version = v
        return version

    for c in ok:
        t = c.task
        if t.kind not in GEN_KINDS:
            continue
        for w in t.workers:
            if held(w, c.start) != t.version:
                out.append(f"{t.label} says version {t.version} but {w} held {held(w, c.start)}")
        if t.version > t.step or t.step - t.version > cfg.tcss.staleness:
            out.append(f"{t.label} uses version {t.version}: outside [step - W, step] with W={cfg.tcss.staleness}")
    return out


def _by_step(completions: list[Completion], kind: TaskKind) -> dict[int, list[Completion]]:
    """The completions of tasks of `kind`, by global step."""
    out: dict[int, list[Completion]] = defaultdict(list)
    for c in completions:
        if c.task.kind == kind:
            out[c.task.step].append(c)
    return out


def _minibatches(cfg: ScheduleConfig, ok: list[Completion], all_: list[Completion]) -> list[str]:
    out = []
    k = cfg.mini_batches_per_step
    opts = _by_step(ok, TaskKind.OPT_STEP)
    for step in range(cfg.start_step, cfg.end_step):
        got = sorted(opts[step], key=lambda c: c.start)
        if len(got) != k:
            out.append(f"step {step}: {len(got)} successful OPT_STEPs, want mini_batches_per_step={k}")
            continue
        for j, c in enumerate(got):
            last = j == k - 1
            if c.task.version != step + int(last) or ("minibatch" in c.task.flags) == last:
                out.append(f"OPT_STEP {j} of step {step}: version {c.task.version}, flags {sorted(c.task.flags)}; "
                           f"want v{step + int(last)}{'' if last else ' flagged minibatch'}")
        for c in all_:
            t = c.task
            if t.step == step and t.kind == TaskKind.UPDATE and c.ok:
                js = {cfg.minibatch_of(i) for i in t.samples}
                if len(js) != 1:
                    out.append(f"{t.label} mixes mini-batches {sorted(js)}")
                    continue
                j = js.pop()
                if j > 0 and c.start < got[j - 1].end - EPS:
                    out.append(f"{t.label} (mini-batch {j}) starts before OPT_STEP {j - 1} of its step ended")
                if c.end > got[j].start + EPS:
                    out.append(f"{t.label} (mini-batch {j}) ends after OPT_STEP {j} of its step started")
        trainers = set(cfg.workers(cfg.trainer_pool))
        for c in all_:
            t = c.task
            if (k > 1 and (t.kind == TaskKind.TAG_GEN or t.kind == TaskKind.SYNC and trainers & set(t.workers))
                    and c.end > got[0].end + EPS and c.start < got[-1].end - EPS):
                out.append(f"{t.label} runs on the trainer between the first and last OPT_STEP of step {step}")
    return out


def _ordering(cfg: ScheduleConfig, ok: list[Completion], all_: list[Completion]) -> list[str]:
    out = []
    end_of: dict[tuple[TaskKind, int], float] = {}
    for c in ok:  # a step's OPT_STEP: its last one (mini-batches: see `_minibatches`)
        if c.task.kind in (TaskKind.OPT_STEP, TaskKind.SYNC) and "join" not in c.task.flags:
            key = (c.task.kind, c.task.step)
            end_of[key] = max(end_of.get(key, -math.inf), c.end)
    start_of_opt: dict[int, float] = {}
    for c in ok:
        if c.task.kind == TaskKind.OPT_STEP:
            start_of_opt[c.task.step] = max(start_of_opt.get(c.task.step, -math.inf), c.start)
    for c in all_:
        t = c.task
        if t.kind in GEN_KINDS:
            gate = t.step - 1 - cfg.tcss.staleness
            if gate >= cfg.start_step and c.start < end_of.get((TaskKind.OPT_STEP, gate), math.inf) - EPS:
                out.append(f"{t.label} starts before OPT_STEP of step {gate} ended (W={cfg.tcss.staleness})")
        if t.kind == TaskKind.UPDATE and t.step > cfg.start_step:
            if c.start < end_of.get((TaskKind.OPT_STEP, t.step - 1), math.inf) - EPS:
                out.append(f"{t.label} starts before OPT_STEP of step {t.step - 1} ended")
        if t.kind == TaskKind.UPDATE and c.end > start_of_opt.get(t.step, math.inf) + EPS:
            out.append(f"{t.label} ends after OPT_STEP of its step started")
        if (t.kind == TaskKind.SYNC and "join" not in t.flags
                and c.start < end_of.get((TaskKind.OPT_STEP, t.step), math.inf) - EPS):
            out.append(f"SYNC of step {t.step} starts before its OPT_STEP ended")
        if (cfg.tcss.staleness == 0 and cfg.mode == "disaggregated" and t.step > cfg.start_step
                and t.kind != TaskKind.SYNC
                and c.start < end_of.get((TaskKind.SYNC, t.step - 1), math.inf) - EPS):
            out.append(f"{t.label} starts before SYNC of step {t.step - 1} ended (W=0)")
    return out


def _limits(cfg: ScheduleConfig, ok: list[Completion], all_: list[Completion]) -> list[str]:
    out = []
    cap = 0 if cfg.tcss.staleness == 0 else math.floor(cfg.tcss.max_stale_fraction * cfg.samples_per_step + 1e-9)
    stale: dict[int, int] = defaultdict(int)
    for c in ok:
        if c.task.kind in GEN_KINDS and c.task.version < c.task.step:
            stale[c.task.step] += len(c.task.samples)
    out += [f"step {s}: {n} stale samples > cap {cap}" for s, n in stale.items() if n > cap]
    if cfg.tcss.max_gen_futures is not None:
        edges = sorted([(c.start, 1) for c in all_ if c.task.kind in GEN_KINDS]
                       + [(c.end, -1) for c in all_ if c.task.kind in GEN_KINDS])
        running = peak = 0
        for _, delta in edges:
            running += delta
            peak = max(peak, running)
        if peak > cfg.tcss.max_gen_futures:
            out.append(f"{peak} generation tasks ran at once > max_gen_futures={cfg.tcss.max_gen_futures}")
    return out


def _barriers(cfg: ScheduleConfig, ok: list[Completion], all_: list[Completion]) -> list[str]:
    out = []
    every = cfg.checkpoint_every
    ckpts = _by_step(ok, TaskKind.CHECKPOINT)
    barriers = [s for s in range(cfg.start_step, cfg.end_step) if cfg.is_checkpoint_step(s)]
    out += [f"step {s}: CHECKPOINT without a checkpoint barrier (checkpoint_every={every})"
            for s in sorted(set(ckpts) - set(barriers))]
    trainers = set(cfg.workers(cfg.trainer_pool))
    for s in barriers:
        if len(ckpts[s]) != 1:
            out.append(f"step {s}: {len(ckpts[s])} successful CHECKPOINTs at its barrier, want 1")
            continue
        ck = ckpts[s][0]
        if ck.task.version != s + 1 or set(ck.task.workers) != trainers:
            out.append(f"{ck.task.label} saves v{ck.task.version} on {','.join(ck.task.workers)}: want v{s + 1} "
                       "on the trainer pool")
        for c in all_:
            t = c.task
            if t.kind == TaskKind.CHECKPOINT:
                continue
            if t.step <= s and c.end > ck.start + EPS:
                out.append(f"{t.label} ends after the CHECKPOINT of step {s} started (not drained)")
            if t.step > s and c.start < ck.end - EPS:
                out.append(f"{t.label} starts before the CHECKPOINT of step {s} ended")
    return out


def check_run(cfg: ScheduleConfig, completions: Iterable[Completion]) -> list[str]:
    """All violations of the invariants in the module docstring (empty: consistent)."""
    all_ = list(completions)
    ok = [c for c in all_ if c.ok]
    return (_overlaps(all_) + _coverage(cfg, ok, all_) + _versions(cfg, ok) + _ordering(cfg, ok, all_)
            + _minibatches(cfg, ok, all_) + _limits(cfg, ok, all_) + _barriers(cfg, ok, all_))
