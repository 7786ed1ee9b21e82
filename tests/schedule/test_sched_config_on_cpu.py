import dataclasses

import pytest

from digenrl_verl.errors import ConfigError
from digenrl_verl.schedule.config import (PoolSpec, ScheduleConfig, ScheduleSettings, TagConfig, TcssConfig,
                                          TspConfig)

DIS = {"mode": "disaggregated"}


@pytest.mark.parametrize("build, path", [
    (lambda: ScheduleConfig(mode="split"), "mode"),
    (lambda: TagConfig(policy="always"), "tag.policy"),
    (lambda: TcssConfig(staleness=2), "tcss.staleness"),
    (lambda: TcssConfig(staleness=1, max_stale_fraction=1.5), "tcss.max_stale_fraction"),
    (lambda: TcssConfig(max_gen_futures=0), "tcss.max_gen_futures"),
    (lambda: TspConfig(chunk_size=-1), "tsp.chunk_size"),
    (lambda: TcssConfig(guard_slack=1.5), "tcss.guard_slack"),
    (lambda: ScheduleConfig(n=0, **DIS), "n"),
    (lambda: ScheduleConfig(num_steps=0, **DIS), "num_steps"),
    (lambda: ScheduleConfig(checkpoint_every=-1, **DIS), "checkpoint_every"),
    (lambda: TagConfig(policy="static"), "tag.static_k"),
    (lambda: ScheduleSettings(gap="yes"), "gap"),
    (lambda: ScheduleSettings(task_timeout_s=-1), "task_timeout_s"),
    (lambda: ScheduleSettings(tag="bts"), "tag"),  # a section, not a flat value
    (lambda: ScheduleConfig(pools={"gen": PoolSpec(2)}, **DIS), "pools"),
    (lambda: ScheduleConfig(pools={"gen": {"size": 0}, "trn": {"size": 1}}, **DIS), "pools.gen.size"),
    (lambda: ScheduleConfig(pools={"gen": {"size": 2, "gpus": 1}, "trn": {"size": 1}}, **DIS), "pools.gen"),
])
def test_bad_values_name_the_field_path_and_the_fix(build, path):
    with pytest.raises(ConfigError) as err:
        build()
    assert err.value.path == path
    message = str(err.value)
    assert message.startswith(path + "="), message
    assert "use" in message or "needs" in message or "valid" in message
    assert str(err.value.under("trainer.digenrl")).startswith(f"trainer.digenrl.{path}=")


def test_pools_from_plain_dicts_and_worker_ids():
    cfg = ScheduleConfig(pools={"gen": {"size": 2, "worker_class": "A800"}, "trn": {"size": 3}}, **DIS)
    assert cfg.workers("gen") == ("gen:0", "gen:1")
    assert cfg.worker_class("gen:1") == "A800" and cfg.worker_class("trn:2") == "trn"
    assert cfg.samples_per_step == cfg.prompts_per_step * cfg.n


def test_one_definition_of_every_default():
    """The driver's config and the user's settings share their fields and defaults (one dataclass)."""
    settings = {f.name: f for f in dataclasses.fields(ScheduleSettings)}
    config = {f.name: f for f in dataclasses.fields(ScheduleConfig)}
    assert set(settings) <= set(config)
    cfg = ScheduleConfig.of(ScheduleSettings(mode="disaggregated"))
    assert cfg.tag == TagConfig() and cfg.tsp == TspConfig(enabled=True)
    assert cfg.tcss == TcssConfig(max_stale_fraction=0.0)


def test_colocated_resolves_tag_and_tcss_off_and_names_what_had_no_effect():
    settings = ScheduleSettings(tag=TagConfig(policy="static", static_k=2), tcss=TcssConfig(staleness=1))
    assert settings.inert_in_colocated == ["tag.policy", "tag.static_k", "tcss.staleness"]
    assert ScheduleConfig(mode="disaggregated").tcss.max_stale_fraction == 0.0  # no window: nothing stale
    cfg = ScheduleConfig.of(settings)
    assert cfg.tag.policy == "off" and cfg.tcss == TcssConfig(max_stale_fraction=0.0) and cfg.tsp.enabled is False
    assert ScheduleSettings(mode="disaggregated", tcss=TcssConfig(staleness=1)).inert_in_colocated == []
    assert ScheduleConfig(mode="colocated", tsp=TspConfig(enabled=True)).tsp.enabled  # TSP is honoured there
