import pytest

from digenrl_verl.schedule.config import PoolSpec, ScheduleConfig


@pytest.mark.parametrize("kwargs, key", [
    ({"mode": "split"}, "trainer.digenrl.mode"),
    ({"tag": "always"}, "trainer.digenrl.tag"),
    ({"staleness": 2}, "trainer.digenrl.staleness"),
    ({"max_stale_fraction": 1.5, "staleness": 1}, "trainer.digenrl.max_stale_fraction"),
    ({"max_stale_fraction": 0.5}, "trainer.digenrl.max_stale_fraction"),  # stale fraction needs staleness=1
    ({"max_gen_futures": 0}, "trainer.digenrl.max_gen_futures"),
    ({"n": 0}, "trainer.digenrl.n"),
    ({"num_steps": 0}, "trainer.digenrl.num_steps"),
    ({"tag": "static"}, "trainer.digenrl.static_k"),
    ({"gap": "yes"}, "trainer.digenrl.gap"),
    ({"task_timeout_s": -1}, "trainer.digenrl.task_timeout_s"),
    ({"pools": {"gen": PoolSpec(2)}}, "trainer.digenrl.pools"),
    ({"pools": {"gen": {"size": 0}, "trn": {"size": 1}}}, "trainer.digenrl.pools.gen.size"),
    ({"pools": {"gen": {"size": 2, "gpus": 1}, "trn": {"size": 1}}}, "trainer.digenrl.pools.gen"),
    ({"mode": "colocated", "pools": {"col": PoolSpec(4)}}, "trainer.digenrl.tag"),  # default tag=bts
    ({"mode": "colocated", "tag": "off", "staleness": 1, "pools": {"col": PoolSpec(4)}},
     "trainer.digenrl.staleness"),
])
def test_bad_values_name_the_key_and_the_fix(kwargs, key):
    with pytest.raises(ValueError) as err:
        ScheduleConfig(**kwargs)
    message = str(err.value)
    assert message.startswith(key + "="), message
    assert "use" in message or "needs" in message or "valid" in message


def test_pools_from_plain_dicts_and_worker_ids():
    cfg = ScheduleConfig(pools={"gen": {"size": 2, "worker_class": "A800"}, "trn": {"size": 3}})
    assert cfg.workers("gen") == ("gen:0", "gen:1")
    assert cfg.worker_class("gen:1") == "A800" and cfg.worker_class("trn:2") == "trn"
    assert cfg.samples_per_step == cfg.prompts_per_step * cfg.n


def test_from_dict_rejects_unknown_keys():
    with pytest.raises(ValueError, match="trainer.digenrl.bogus"):
        ScheduleConfig.from_dict({"bogus": 1})
    assert ScheduleConfig.from_dict({"tag": "off"}).tag == "off"
