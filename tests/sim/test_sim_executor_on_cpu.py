"""The simulated executor: durations from the profile and cluster, jitter, faults; cluster specs; the cost of
checkpoint barriers."""

from __future__ import annotations

import dataclasses

import pytest

from digenrl_verl.schedule.config import ScheduleConfig, TagConfig, TcssConfig
from digenrl_verl.schedule.driver import Driver
from digenrl_verl.schedule.invariants import check_run
from digenrl_verl.schedule.types import Task, TaskKind
from digenrl_verl.sim.cluster import ClusterSpec
from digenrl_verl.sim.executor import Fault, SimExecutor
from digenrl_verl.sim.profiles import (CHECKPOINT_BYTES_PER_PARAM, CHECKPOINT_WRITE_GB_S, PROFILES, CostProfile,
                                       checkpoint_seconds, from_step_times, get_profile)

CLUSTER = ClusterSpec.parse("gen=2xA@0.5,trn=2xB")
PROFILE = CostProfile("t", gen=2.0, score=0.5, update_loop=3.0, update_tsp=1.0, tag_overhead=1.5, opt_step=0.25,
                      sync=1.0)


def _task(tid, kind, workers, samples=((0,), (1,)), step=0, mb=0, flags=()):
    return Task(tid, kind, step, mb, tuple(workers), 0, tuple(zip(workers, samples)), frozenset(flags))


def test_durations_follow_profile_work_and_speed():
    ex = SimExecutor(CLUSTER, PROFILE)
    assert ex.duration(_task(1, TaskKind.GEN, ["gen:0", "gen:1"], ((0, 1), (2,)))) == pytest.approx(2.0 * 2 / 0.5)
    assert ex.duration(_task(2, TaskKind.TAG_GEN, ["trn:0", "trn:1"])) == pytest.approx(3.0)
    assert ex.duration(_task(3, TaskKind.UPDATE, ["trn:0", "trn:1"], flags=("tsp",))) == pytest.approx(1.0)
    assert ex.duration(_task(4, TaskKind.UPDATE, ["trn:0", "trn:1"])) == pytest.approx(3.0)
    sync = Task(5, TaskKind.SYNC, 0, None, ("trn:0", "gen:0"), 1, (("trn:0", ()), ("gen:0", ())))
    assert ex.duration(sync) == pytest.approx(1.0 / 0.5)  # the slowest side sets the pace


def test_wait_any_returns_completions_in_time_order_and_respects_timeouts():
    ex = SimExecutor(CLUSTER, PROFILE)
    ex.submit(_task(1, TaskKind.GEN, ["gen:0"], ((0,),)))
    ex.submit(_task(2, TaskKind.UPDATE, ["trn:0"], ((0,),), flags=("tsp",)))
    assert ex.wait_any(timeout=0.5) == [] and ex.now() == pytest.approx(0.5)
    (first,) = ex.wait_any(None)
    assert first.task.task_id == 2 and first.end == pytest.approx(1.0) and ex.now() == pytest.approx(1.0)
    (second,) = ex.wait_any(None)
    assert second.task.task_id == 1 and second.end == pytest.approx(4.0)
    with pytest.raises(RuntimeError):
        ex.wait_any(None)


def test_jitter_is_seeded_per_task_identity():
    a, b = SimExecutor(CLUSTER, PROFILE, jitter=0.3, seed=5), SimExecutor(CLUSTER, PROFILE, jitter=0.3, seed=5)
    t1, t2 = _task(1, TaskKind.GEN, ["gen:0"], ((0,),)), _task(99, TaskKind.GEN, ["gen:0"], ((0,),))
    assert a.duration(t1) == b.duration(t2)  # same task identity, different id: same duration
    assert a.duration(t1) != SimExecutor(CLUSTER, PROFILE, jitter=0.3, seed=6).duration(t1)
    assert a.duration(t1) != SimExecutor(CLUSTER, PROFILE).duration(t1)


def test_faults_fail_lose_kill_hang():
    faults = (Fault("fail", TaskKind.SCORE), Fault("lose", TaskKind.SCORE, occurrence=2),
              Fault("kill", worker="gen:1", at=1.0), Fault("hang", TaskKind.OPT_STEP))
    ex = SimExecutor(CLUSTER, PROFILE, faults=faults)
    ex.submit(_task(1, TaskKind.SCORE, ["gen:0"], ((0, 2),)))  # 2 x 0.5 s at speed 0.5: ends at 2
    ex.submit(_task(2, TaskKind.GEN, ["gen:1"], ((1,),)))
    (killed,) = ex.wait_any(None)
    assert killed.task.task_id == 2 and not killed.ok and killed.end == pytest.approx(1.0)
    assert killed.dead_workers == ("gen:1",)
    (failed,) = ex.wait_any(None)
    assert not failed.ok and "data_lost" not in failed.info and failed.end == pytest.approx(2.0)
    ex.submit(_task(3, TaskKind.SCORE, ["gen:0"], ((0,),)))
    (lost,) = ex.wait_any(None)
    assert not lost.ok and lost.info["data_lost"]
    ex.submit(_task(4, TaskKind.GEN, ["gen:1"], ((1,),)))
    (dead,) = ex.wait_any(None)
    assert not dead.ok and dead.start == dead.end and dead.dead_workers == ("gen:1",)
    ex.submit(Task(5, TaskKind.OPT_STEP, 0, None, ("trn:0",), 1, (("trn:0", ()),)))
    assert ex.wait_any(timeout=5.0) == []
    with pytest.raises(ValueError, match="Fault.action"):
        Fault("explode")


def test_cluster_spec_parsing():
    c = ClusterSpec.parse("gen=8xA800@0.6,trn=8xH800")
    assert c.pools["gen"].size == 8 and c.speed("A800") == 0.6 and c.speed("H800") == 1.0
    assert c.mode == "disaggregated" and c.total_ranks == 16
    col = c.colocated()
    assert col.mode == "colocated" and col.pools["col"].size == 16 and col.speed(col.pools["col"].worker_class) == 0.6
    for bad in ("gen=8", "gen=8xA,gen=2xA", "gen=1xA@1,trn=1xA@2", "gen=2xA@0"):
        with pytest.raises(ValueError):
            ClusterSpec.parse(bad)


def test_profiles_from_step_times():
    p = from_step_times("x", fwd=1.0, fwdbwd=3.0, steps=20, timestep_fraction=0.6, decode=2.0, reward=0.5,
                        opt_step=1.0, sync=2.0, loop_overhead=0.1, tsp_factor=0.4, tag_overhead=1.2)
    assert p.gen == 22.0 and p.source["trained_timesteps"] == 12
    assert p.update_loop == pytest.approx(12 * 3.0 * 1.1) and p.update_tsp == pytest.approx(12 * 3.0 * 0.4)
    assert p.unit(TaskKind.TAG_GEN) == pytest.approx(26.4)
    assert p.unit(TaskKind.UPDATE, tsp=True) < p.unit(TaskKind.UPDATE)
    for steps in (20, 30, 40):
        for frac in (0.4, 0.6):
            assert f"hunyuanvideo-{steps}-{frac}" in PROFILES
    assert {"wan2.1", "flux.1", "qwen-image"} <= set(PROFILES)
    with pytest.raises(ValueError, match="valid names"):
        get_profile("sd9")


def test_checkpoint_costs_the_profile_s_disk_time_whatever_the_speed():
    assert checkpoint_seconds(12.0) == pytest.approx(12e9 * CHECKPOINT_BYTES_PER_PARAM / (CHECKPOINT_WRITE_GB_S * 1e9))
    assert get_profile("flux.1").checkpoint == pytest.approx(checkpoint_seconds(12.0))
    profile = CostProfile("c", gen=1.0, score=0.1, update_loop=1.0, update_tsp=0.5, tag_overhead=1.0, opt_step=0.1,
                          sync=0.1, checkpoint=7.0)
    ckpt = Task(1, TaskKind.CHECKPOINT, 0, None, ("gen:0", "trn:0"), 1, (("gen:0", ()), ("trn:0", ())))
    assert SimExecutor(CLUSTER, profile).duration(ckpt) == pytest.approx(7.0)  # gen:0 runs at 0.5: not slower
    assert profile.scaled(2.0).checkpoint == pytest.approx(14.0)


def _makespan(cfg: ScheduleConfig, cluster: ClusterSpec, profile: CostProfile) -> tuple[float, int]:
    driver = Driver(cfg, SimExecutor(cluster, profile))
    driver.run()
    assert check_run(cfg, driver.trace.completions) == []
    return driver.trace.metrics().makespan, sum(c.task.kind == TaskKind.CHECKPOINT for c in driver.trace.completions)


def test_checkpoint_barriers_cost_the_modelled_drain():
    cluster = ClusterSpec.parse("gen=2xG,trn=2xT")
    # generation-light steps with a long update tail: TCSS (W=1) runs the next step's generation ahead
    profile = CostProfile("tail", gen=1.0, score=0.1, update_loop=8.0, update_tsp=4.0, tag_overhead=1.0,
                          opt_step=0.5, sync=0.5, checkpoint=5.0)
    base = dict(mode="disaggregated", pools=cluster.pools, prompts_per_step=6, n=2, num_steps=4,
                tag=TagConfig(policy="off"))
    # W = 0 drains at every step anyway: the barrier costs exactly the checkpoints' time
    sync = ScheduleConfig(**base)
    plain, _ = _makespan(sync, cluster, profile)
    barred, ckpts = _makespan(dataclasses.replace(sync, checkpoint_every=2), cluster, profile)
    assert ckpts == 2 and barred - plain == pytest.approx(ckpts * profile.checkpoint)
    # W = 1: the checkpoints' time plus the overlap TCSS loses at each barrier (no generation runs ahead of it)
    tcss = ScheduleConfig(**base, tcss=TcssConfig(staleness=1, max_stale_fraction=0.34, guard=False))
    plain1, _ = _makespan(tcss, cluster, profile)
    barred1, ckpts1 = _makespan(dataclasses.replace(tcss, checkpoint_every=2), cluster, profile)
    lost = barred1 - plain1 - ckpts1 * profile.checkpoint
    assert ckpts1 == 2 and plain1 < plain and 0.0 < lost <= plain - plain1, (plain, plain1, barred1)


def test_cluster_memory_per_class():
    c = ClusterSpec.parse("gen=8xL40S@0.4/48,trn=8xH800")
    assert c.memory_gb("L40S") == 48.0 and c.memory_gb("H800") == 80.0 and c.pool_memory_gb("trn") == 80.0
    assert c.colocated().pool_memory_gb("col") == 48.0  # the smallest memory caps colocated ranks
    assert ClusterSpec.parse("gen=1xZ9").memory_gb("Z9") == 80.0
    for bad in ("gen=1xA/0", "gen=1xA/40,trn=1xA/80"):
        with pytest.raises(ValueError):
            ClusterSpec.parse(bad)


def test_colocation_cost_terms():
    from digenrl_verl.sim.profiles import (IDEAL, ColocationCosts, colocated_row, disaggregated_row, get_footprint,
                                           recompute_unit, rows_that_fit, switch_bytes_gb, train_state_gb, tsp_unit)
    p, fp = get_profile("flux.1"), get_footprint("flux.1")
    # TSP chunk: K rows or more cost update_tsp, one row costs the loop, in between a + b / c per row
    k = p.source["trained_timesteps"]
    assert tsp_unit(p, k) == pytest.approx(p.update_tsp) and tsp_unit(p, 10 * k) == pytest.approx(p.update_tsp)
    assert tsp_unit(p, 1) == pytest.approx(p.update_loop)
    assert p.update_tsp < tsp_unit(p, k // 2) < p.update_loop
    assert recompute_unit(p) == pytest.approx(p.update_loop / 3)
    assert train_state_gb(12.0, 16) == pytest.approx(12.0)
    assert rows_that_fit(80.0, 12.0, fp) == int((72.0 - 12.0) // fp.act_gb_per_row)
    assert switch_bytes_gb("resident", 12.0, 16, fp) == pytest.approx(24.0)  # bf16 weights into the engine
    assert switch_bytes_gb("offload", 12.0, 16, fp) == pytest.approx(2 * 9.0 + 3 * 24.0 + 2 * 2.0)
    cal = ColocationCosts("calibrated", 2.0)
    best = colocated_row(p, fp, cal, ranks=16, memory_gb=80.0, tsp=True, recompute=False, mode="offload")
    assert best.profile.opt_step == pytest.approx(p.opt_step + switch_bytes_gb("offload", 12.0, 16, fp) / 2.0)
    vo = colocated_row(p, fp, IDEAL, ranks=16, memory_gb=80.0, tsp=False, recompute=True, mode="offload")
    assert vo.profile.update_loop == pytest.approx(p.update_loop * (1 + 1 / 3)) and vo.profile.opt_step == p.opt_step
    ideal = disaggregated_row(p, fp, IDEAL, trainer_ranks=8, trainer_memory_gb=80.0, generator_memory_gb=80.0)
    assert ideal.profile.tag_overhead == 1.0 and ideal.profile.update_tsp == p.update_tsp
    small = disaggregated_row(p, fp, cal, trainer_ranks=8, trainer_memory_gb=40.0, generator_memory_gb=80.0)
    assert small.info["rows_per_pass"] == int((36.0 - 24.0) // fp.act_gb_per_row) < k
    assert small.profile.update_tsp > p.update_tsp and small.profile.tag_overhead == p.tag_overhead
    with pytest.raises(ValueError):
        ColocationCosts("calibrated")
