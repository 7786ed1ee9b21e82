"""The colocation cost terms added for the paper's heterogeneous pair and the slower colocated generator: each moves
the simulated result in the expected direction, ideal costs stay free of them, and the calibration fits either
unknown on one figure."""

from __future__ import annotations

from dataclasses import replace

import pytest

from digenrl_verl.sim.cluster import ClusterSpec
from digenrl_verl.sim.profiles import (IDEAL, ColocationCosts, colocated_row, disaggregated_row, get_footprint,
                                       get_profile)
from digenrl_verl.sim.scenarios import (ALTERNATIVE_CALIBRATION, ASSUMED_SWITCH_GB_S, HETERO_PAPER_CLUSTER,
                                        HETERO_PAPER_SPEED, PAPER_FIGURES, PRIMARY_CALIBRATION, Unknown, calibrate,
                                        get_scenario, run_ladder)

HEADLINE = ("colocated-best", "digenrl")
PAPER = "hetero-paper-a+c"
EQUAL_MEMORY = f"gen=8xTestbedA@{HETERO_PAPER_SPEED:.3f}/80,trn=8xTestbedC/80"  # the same speeds, 80 GB each


def _makespans(cluster: str, costs: ColocationCosts) -> dict[str, float]:
    s = replace(get_scenario(PAPER), cluster=cluster, num_steps=2)
    return {o.label: o.makespan for o in run_ladder(s, costs=costs, labels=HEADLINE)}


def test_the_paper_pair_caps_colocated_memory_at_the_smaller_gpu():
    c = ClusterSpec.parse(HETERO_PAPER_CLUSTER)
    assert c.pool_memory_gb("gen") == 48.0 and c.pool_memory_gb("trn") == 96.0
    assert c.speed("TestbedA") == pytest.approx(38.7 / 126.0, abs=1e-3) and c.speed("TestbedC") == 1.0
    col = c.colocated()
    assert col.pool_memory_gb("col") == 48.0 and col.speed(col.pools["col"].worker_class) == c.speed("TestbedA")
    assert PAPER_FIGURES[PAPER]["vs_colocated"] == [1.46, 1.85]


def test_smaller_memory_slows_colocated_training_only_under_calibrated_costs():
    """The memory half of heterogeneity: on 48 GB a colocated rank holds fewer trained rows per TSP pass (and no
    resident rollout engine) than on 80 GB; the disaggregated trainer on 96 GB holds more than on 80 GB. Ideal costs
    have no memory model, so memory changes nothing there."""
    profile, fp = get_profile("hunyuanvideo-20-0.6"), get_footprint("hunyuanvideo-20-0.6")
    cal = ColocationCosts("calibrated", 1.0)
    small = colocated_row(profile, fp, cal, ranks=16, memory_gb=48.0, tsp=True, recompute=False, mode="offload")
    large = colocated_row(profile, fp, cal, ranks=16, memory_gb=80.0, tsp=True, recompute=False, mode="offload")
    assert small.info["tsp_chunk_rows"] < large.info["tsp_chunk_rows"]
    assert small.profile.update_tsp > large.profile.update_tsp
    assert not colocated_row(profile, fp, cal, ranks=16, memory_gb=48.0, tsp=True, recompute=False,
                             mode="resident").info["feasible"]
    trn96 = disaggregated_row(profile, fp, cal, trainer_ranks=8, trainer_memory_gb=96.0, generator_memory_gb=48.0)
    trn80 = disaggregated_row(profile, fp, cal, trainer_ranks=8, trainer_memory_gb=80.0, generator_memory_gb=80.0)
    assert trn96.info["feasible"] and trn96.info["tsp_chunk_rows"] >= trn80.info["tsp_chunk_rows"]

    paper, equal = _makespans(HETERO_PAPER_CLUSTER, cal), _makespans(EQUAL_MEMORY, cal)
    assert paper["colocated-best"] > equal["colocated-best"] * 1.01  # 48 GB caps the colocated TSP chunk
    assert paper["digenrl"] <= equal["digenrl"] * (1 + 1e-9)  # 96 GB trainer: no worse than 80 GB
    assert paper["colocated-best"] / paper["digenrl"] > equal["colocated-best"] / equal["digenrl"]
    assert _makespans(HETERO_PAPER_CLUSTER, IDEAL) == pytest.approx(_makespans(EQUAL_MEMORY, IDEAL))


def test_slower_colocated_generator_slows_colocated_rows_only():
    profile, fp = get_profile("flux.1"), get_footprint("flux.1")
    base, slow = ColocationCosts("calibrated", 2.0), ColocationCosts("calibrated", 2.0, colocated_gen_factor=1.5)
    for tsp, recompute in ((True, False), (False, True)):
        kw = dict(ranks=16, memory_gb=80.0, tsp=tsp, recompute=recompute, mode="offload")
        b, s = colocated_row(profile, fp, base, **kw), colocated_row(profile, fp, slow, **kw)
        assert s.profile.gen == pytest.approx(1.5 * b.profile.gen) and b.profile.gen == profile.gen
        assert (s.profile.update_tsp, s.profile.opt_step) == (b.profile.update_tsp, b.profile.opt_step)
    kw = dict(trainer_ranks=8, trainer_memory_gb=80.0, generator_memory_gb=80.0)
    assert disaggregated_row(profile, fp, slow, **kw).profile == disaggregated_row(profile, fp, base, **kw).profile
    s = replace(get_scenario("flux.1"), num_steps=2)
    runs = {f: {o.label: o.makespan for o in run_ladder(s, costs=c, labels=HEADLINE)} for f, c in
            ((1.0, base), (1.5, slow))}
    assert runs[1.5]["colocated-best"] > runs[1.0]["colocated-best"]
    assert runs[1.5]["digenrl"] == pytest.approx(runs[1.0]["digenrl"])


def test_ideal_takes_no_colocation_terms_and_bad_terms_are_named():
    assert IDEAL.switch_gb_s is None and IDEAL.colocated_gen_factor == 1.0 and not IDEAL.on
    with pytest.raises(ValueError, match="ideal"):
        ColocationCosts("ideal", colocated_gen_factor=1.2)
    with pytest.raises(ValueError, match="colocated_gen_factor"):
        ColocationCosts("calibrated", 1.0, colocated_gen_factor=0.9)
    with pytest.raises(ValueError, match="not a ColocationCosts term"):
        Unknown("switch_bandwidth", 0.1, 1.0)
    with pytest.raises(ValueError, match="lo < hi"):
        Unknown("switch_gb_s", 1.0, 0.5)


def test_both_calibrations_fit_the_same_figure_with_one_unknown_each():
    primary, p_report = calibrate()
    alt, a_report = calibrate(unknown=ALTERNATIVE_CALIBRATION)
    assert p_report["parameter"] == PRIMARY_CALIBRATION.parameter == "switch_gb_s"
    assert primary.colocated_gen_factor == 1.0 and p_report["fixed"] == {}
    assert a_report["parameter"] == "colocated_gen_factor" and alt.switch_gb_s == ASSUMED_SWITCH_GB_S
    for report in (p_report, a_report):
        assert report["figure"] == "flux.1" and not report["at_bound"]
        assert report["reached"] == pytest.approx(report["target"], rel=1e-3)
    assert 1.0 < alt.colocated_gen_factor < ALTERNATIVE_CALIBRATION.hi



def test_engine_switch_costs_the_same_seconds_on_a_slower_class():
    """The switch moves bytes (bandwidth-bound): the executor divides OPT_STEP by the ranks' speed, so the row
    pre-multiplies the switch's seconds by it; the optimizer step itself stays compute-bound."""
    profile, fp = get_profile("hunyuanvideo-20-0.6"), get_footprint("hunyuanvideo-20-0.6")
    cal = ColocationCosts("calibrated", 0.5)
    kw = dict(ranks=16, memory_gb=48.0, tsp=True, recompute=False, mode="offload")
    fast, slow = colocated_row(profile, fp, cal, **kw), colocated_row(profile, fp, cal, speed=0.25, **kw)
    switch_s = fast.info["switch_s"]
    assert switch_s > 0 and slow.info["switch_s"] == switch_s
    assert fast.profile.opt_step == pytest.approx(profile.opt_step + switch_s)
    assert slow.profile.opt_step / 0.25 == pytest.approx(profile.opt_step / 0.25 + switch_s)
