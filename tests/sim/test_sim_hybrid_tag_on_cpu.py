"""TAG on verl-omni's hybrid engine (issue 23): a TAG micro-batch on a trainer rank wakes its rollout replica, syncs the
actor's weights into it, generates and puts it back to sleep (`sim.profiles.HybridEngine`), and BTS decides each bubble
with that switch in g'.

(a) with a small switch BTS inserts TAG micro-batches on the hybrid engine and the trace shows each with its switch;
(b) with a switch the bubbles cannot repay BTS skips every bubble and the makespan equals tag off;
(c) mutation guard: BTS without the switch in g' (an executor that runs the switch outside the measured task) decides
    (b) differently, and the run is slower than tag off.
"""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from digenrl_verl.schedule.cost import CostProfiler
from digenrl_verl.schedule.trace import PHASES
from digenrl_verl.schedule.types import Completion, TaskKind
from digenrl_verl.sim import cli
from digenrl_verl.sim.cluster import ClusterSpec
from digenrl_verl.sim.executor import SimExecutor
from digenrl_verl.sim.profiles import (HybridEngine, TagSwitch, get_footprint, get_profile, hybrid_row,
                                       hybrid_switch)
from digenrl_verl.sim.scenarios import (HYBRID_BASES, PAPER_SUITE, get_scenario, ladder_configs, run_config,
                                        scenario_profile)
from digenrl_verl.viz.gantt import save_gantt

SMALL, LARGE = "flux.1-hybrid", "flux.1-hybrid-slow"
FLUX_GEN = 8.3  # s per sample (profile flux.1); 8 samples of a group over 8 trainer ranks: one sample per rank


def _run(name: str, row: str = "+TAG BTS", *, steps: int = 2, **kw):
    s = replace(get_scenario(name), num_steps=steps)
    cluster = ClusterSpec.parse(s.cluster)
    profile = scenario_profile(s, cluster).profile
    cfg, _ = ladder_configs(s, cluster, profile)[row]
    return run_config(cfg, cluster, profile, **kw)


def _tags(o) -> list[Completion]:
    return [c for c in o.driver.trace.completions if c.task.kind == TaskKind.TAG_GEN]


def _bubbles(o) -> list:
    return [d for d in o.driver.trace.decisions if d.action in ("tag", "skip")]


def test_switch_terms_follow_their_formulas_and_the_default_tag_is_untouched():
    fp = get_footprint("flux.1")
    switch = hybrid_switch(12.0, fp, HybridEngine(10.0))
    # wake and sleep: (12B transformer + 5B frozen) x 2 B / 10 GB/s; sync: the 12B trainable weights x 2 B / 10 GB/s
    assert (switch.wake_s, switch.sync_s, switch.sleep_s) == pytest.approx((3.4, 2.4, 3.4))
    row = hybrid_row(get_profile("flux.1"), fp, HybridEngine(10.0, gen_factor=1.2), trainer_ranks=8,
                     trainer_memory_gb=80.0)
    assert row.profile.unit(TaskKind.TAG_GEN) == pytest.approx(1.2 * FLUX_GEN)  # replica rate, no tag_overhead
    assert row.profile.tag_switch_s == pytest.approx(9.2)
    assert row.info["awake_gb"] == pytest.approx(34.0 + 12.0 * 16 / 8) and row.info["feasible"]
    qwen = hybrid_row(get_profile("qwen-image"), get_footprint("qwen-image"), HybridEngine(10.0), trainer_ranks=8,
                      trainer_memory_gb=80.0)
    assert qwen.info["awake_gb"] == pytest.approx(56.8 + 40.0) and not qwen.info["feasible"]

    cluster = ClusterSpec.parse("gen=8xH800,trn=8xB200@2")  # a trainer twice as fast: generation halves, not the switch
    s = get_scenario("flux.1")
    cfg, _ = ladder_configs(s, cluster, get_profile("flux.1"))["+TAG BTS"]
    ex = SimExecutor(cluster, row.profile)
    trace = run_config(cfg, cluster, row.profile).driver.trace
    tag = next(c for c in trace.completions if c.task.kind == TaskKind.TAG_GEN)
    assert ex.duration(tag.task) == pytest.approx(9.2 + 1.2 * FLUX_GEN / 2)
    default = SimExecutor(cluster, get_profile("flux.1"))
    assert default.duration(tag.task) == pytest.approx(FLUX_GEN * 1.15 / 2) and default._switch_info(tag.task) == {}
    assert get_profile("flux.1").tag_switch is None and get_profile("flux.1").tag_switch_s == 0.0


def test_bad_hybrid_settings_are_refused_by_name():
    with pytest.raises(ValueError, match=r"HybridEngine.switch_gb_s=0 .*--hybrid-switch-gb-s"):
        HybridEngine(0)
    with pytest.raises(ValueError, match=r"HybridEngine.gen_factor=-1.0 .*--hybrid-gen-factor"):
        HybridEngine(1.0, gen_factor=-1.0)
    with pytest.raises(ValueError, match="TagSwitch.sync_s"):
        TagSwitch(1.0, -0.5, 1.0)
    with pytest.raises(ValueError, match="params_billion"):
        hybrid_row(get_profile("synthetic-scale"), get_footprint("synthetic-scale"), HybridEngine(10.0),
                   trainer_ranks=8, trainer_memory_gb=80.0)
    with pytest.raises(ValueError, match="awake hybrid replica .* 96.8 GB"):
        scenario_profile(replace(get_scenario("qwen-image"), hybrid=HybridEngine(10.0)),
                         ClusterSpec.parse("gen=8xH800,trn=8xH800"))


def test_a_small_switch_bts_tags_on_the_hybrid_engine_and_the_trace_shows_each_switch(tmp_path):
    """(a)"""
    o, off = _run(SMALL), _run(SMALL, "+TSP")
    tags = _tags(o)
    assert len(tags) >= 4 and o.makespan < off.makespan
    decided = [d for d in _bubbles(o) if d.action == "tag"]
    assert len(decided) == len(tags) and all("bts tag=" in d.detail for d in decided)  # BTS decided every TAG
    for c in tags:  # every TAG pays a whole switch of its own (no sharing between consecutive TAGs)
        assert c.info["engine"] == "hybrid" and c.info["switch_s"] == pytest.approx(9.2)
        assert [name for name, _ in c.info[PHASES]] == ["wake", "sync", "generate", "sleep"]
        assert c.end - c.start == pytest.approx(9.2 + FLUX_GEN)
        assert sum(s for _, s in c.info[PHASES]) == pytest.approx(c.end - c.start)
    # what BTS's g' is: the profiler measured the switch with the generation
    assert o.driver.profiler.unit_cost(TaskKind.TAG_GEN, "H800") == pytest.approx(9.2 + FLUX_GEN)
    assert not o.driver.profiler.is_floor(TaskKind.TAG_GEN, "H800")
    # the trace: TAG spans with their switch as sub-spans and args, the BTS decisions as instants
    path = tmp_path / "trace.json"
    o.driver.trace.write_chrome(str(path))
    events = json.loads(path.read_text())["traceEvents"]
    spans = [e for e in events if e.get("cat") == "TAG"]
    assert len(spans) == 8 * len(tags) and all(e["args"]["switch_s"] == pytest.approx(9.2) for e in spans)
    assert sum(e.get("cat") in ("TAG.wake", "TAG.sync", "TAG.sleep") for e in events) == 3 * len(spans)
    assert {e["name"] for e in events if e.get("ph") == "i"} >= {"tag", "skip"}
    drawn = save_gantt(o.driver.trace, str(tmp_path / "t.png"))
    assert drawn.switch_spans == 3 * 8 * len(tags) and (tmp_path / "t.png").stat().st_size > 0
    assert save_gantt(off.driver.trace, str(tmp_path / "off.png")).switch_spans == 0


@pytest.mark.parametrize("jitter,seed", [(0.0, 0), (0.1, 1), (0.1, 2)])
def test_a_large_switch_bts_skips_every_bubble_and_is_no_slower_than_tag_off(jitter, seed):
    """(b): the switch (184 s per TAG task, 22 x one sample's generation) cannot be repaid by the bubbles."""
    o, off = _run(LARGE, jitter=jitter, seed=seed), _run(LARGE, "+TSP", jitter=jitter, seed=seed)
    bubbles = _bubbles(o)
    assert _tags(o) == [] and len(bubbles) >= 10 and all(d.action == "skip" for d in bubbles)
    assert any("g'>=184" in d.detail for d in bubbles)  # decided with the switch in g' from the first bubbles on
    assert o.makespan <= off.makespan * (1 + 1e-12)
    # without the switch floor BTS probes g' with one TAG, which the run cannot repay: then it skips
    probe = _run(LARGE, switch_prior=False, jitter=jitter, seed=seed)
    assert len(_tags(probe)) == 1 and "probe" in _tags(probe)[0].task.flags
    assert probe.makespan > off.makespan


class _SwitchOutsideTheTask(CostProfiler):
    """The mutation: g' measured without the switch, as if the executor ran wake/sync/sleep outside the TAG task."""

    def observe(self, completion: Completion, worker_class: str) -> None:
        switch = completion.info.get("switch_s", 0.0)
        if switch:
            completion = replace(completion, end=completion.end - switch)
        super().observe(completion, worker_class)


def test_mutation_dropping_the_switch_from_bts_g_prime_changes_decision_b():
    """(c): the same large-switch run with the switch left out of g' TAGs at its bubbles and loses to tag off."""
    off = _run(LARGE, "+TSP")
    mutated = _run(LARGE, profiler=_SwitchOutsideTheTask())
    assert len(_tags(mutated)) > 1 and any(d.action == "tag" and "bts tag=" in d.detail for d in _bubbles(mutated))
    assert mutated.driver.profiler.unit_cost(TaskKind.TAG_GEN, "H800") == pytest.approx(FLUX_GEN)
    assert mutated.makespan > off.makespan * 1.05
    # control: the same profiler path with the switch kept (a plain profiler, no floor) takes only the probe
    kept = _run(LARGE, profiler=CostProfiler())
    assert len(_tags(kept)) == 1


def test_cli_runs_the_hybrid_scenario_and_suite(tmp_path, capsys):
    assert not set(PAPER_SUITE) & {f"{b}-{x}" for b in HYBRID_BASES for x in ("hybrid", "hybrid-slow")}
    png, trace = tmp_path / "h.png", tmp_path / "h.json"
    assert cli.main(["--scenario", SMALL, "--steps", "2", "--json", "--png", str(png), "--trace", str(trace)]) == 0
    out = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert out["tag_engine"]["switch_s"] == pytest.approx(9.2) and out["tag_microbatches"] > 0
    assert png.stat().st_size > 0 and any(e.get("cat") == "TAG.sync" for e in json.loads(trace.read_text())
                                          ["traceEvents"])
    assert cli.main(["--scenario", "flux.1", "--steps", "2", "--hybrid-switch-gb-s", "0.5", "--tag-policy", "bts",
                     "--json"]) == 0
    out = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert out["tag_engine"]["switch_s"] == pytest.approx(184.0)
    assert cli.main(["--scenario", "flux.1", "--hybrid-switch-gb-s", "-1"]) == 2
    assert "--hybrid-switch-gb-s" in capsys.readouterr().err
    assert cli.main(["--suite", "paper", "--hybrid-switch-gb-s", "3"]) == 2  # a suite of many scenarios: refused
    assert "not to --suite paper" in capsys.readouterr().err
    assert cli.main(["--suite", "hybrid", "--json"]) == 0
    suite = json.loads(capsys.readouterr().out.strip().splitlines()[-1])["bases"]["flux.1"]
    assert suite["BTS hybrid fast"]["speedup_vs_tag_off"] > 1.0 and suite["BTS hybrid fast"]["median_tag_microbatches"]
    assert suite["BTS hybrid slow"]["speedup_vs_tag_off"] == 1.0
    assert suite["BTS hybrid slow"]["median_tag_microbatches"] == 0
    assert suite["BTS hybrid slow, probe"]["speedup_vs_tag_off"] < 1.0
