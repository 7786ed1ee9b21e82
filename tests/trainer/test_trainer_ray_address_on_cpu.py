"""The entry point joins an existing Ray cluster when RAY_ADDRESS is set, and starts its own otherwise (no Ray is
started here: the connection and the trainer are stand-ins; the real connection to a 3-node cluster runs in
test_trainer_multinode_on_cpu.py)."""

from __future__ import annotations

import pytest

from digenrl_verl import main as entry
from digenrl_verl.main import TINY_CPU, compose


class FakeTrainer:
    def __init__(self, spec) -> None:
        self.spec = spec
        self.last_checkpoint = None
        self.fitted = False

    def fit(self, resume_from=None) -> None:
        self.fitted = True

    def shutdown(self) -> None:
        pass


@pytest.mark.parametrize("address", ["127.0.0.1:6379", None])
def test_ray_address_makes_the_entry_point_join_that_cluster(address, tiny_flux_dir, tmp_path, monkeypatch, capsys):
    joined = []
    monkeypatch.setattr(entry, "connect_ray", lambda a, torch_threads: joined.append((a, torch_threads)))
    monkeypatch.setattr(entry, "DigenRLTrainer", FakeTrainer)
    if address is None:
        monkeypatch.delenv("RAY_ADDRESS", raising=False)
    else:
        monkeypatch.setenv("RAY_ADDRESS", address)
    cfg = compose([TINY_CPU, f"actor_rollout_ref.model.path={tiny_flux_dir}", f"trainer.digenrl.output_dir={tmp_path}",
                   f"trainer.default_local_dir={tmp_path / 'ckpt'}", "trainer.digenrl.torch_threads=2"])
    assert entry.run(cfg) == entry.EXIT_OK
    if address is None:  # the trainer starts its own local instance (runner.start_ray)
        assert joined == []
    else:
        assert joined == [(address, 2)]
        assert f"RAY_ADDRESS={address}" in capsys.readouterr().out
