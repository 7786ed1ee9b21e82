"""TAG next to vLLM-Omni generators: `rollout.name=vllm_omni` keeps the flag's default TAG policy (issue 11.3a), because
trainer ranks generate their TAG micro-batches with their own diffusers engine over the weights they train. This run
puts the vLLM-Omni engine class on the generators (its in-process client, as in test_trainer_vllm_omni_backend_on_cpu:
the config validates vllm_omni only where vLLM-Omni can run) and forces TAG micro-batches; the config-level decision
is tested in test_trainer_verl_omni_defaults_on_cpu."""

from __future__ import annotations

import dataclasses
import math

import pytest
import ray

from digenrl_verl.trainer.runner import DigenRLTrainer
from digenrl_verl.workers.specs import RolloutEngineSpec

pytestmark = pytest.mark.slow  # trains on Ray workers

RUN = ["data.train_batch_size=2", "actor_rollout_ref.rollout.n=2", "trainer.digenrl.mode=disaggregated",
       "trainer.digenrl.tag.policy=static", "trainer.digenrl.tag.static_k=1", "trainer.total_training_steps=2",
       "actor_rollout_ref.rollout.recompute_old_log_probs=true"]  # as the config resolves it for vllm_omni


class InProcessOmniTrainer(DigenRLTrainer):
    def worker_args(self, role):
        args = super().worker_args(role)
        if role == "generator":
            engine = RolloutEngineSpec(name="vllm_omni", client="inprocess")
            args["policy"] = dataclasses.replace(args["policy"], engine=engine)
        return args


def test_tag_runs_on_the_trainers_own_engine_next_to_vllm_omni_generators(train_run):
    trainer = train_run(*RUN, trainer_cls=InProcessOmniTrainer, name="omni_tag")
    engines = {k: ray.get(a.__ray_call__.remote(lambda w: type(w.engine).__name__)) for k, a in trainer.workers.items()}
    assert engines == {"gen:0": "VllmOmniEngine", "trn:0": "DiffusersEngine"}
    history = trainer.reporter.history
    assert sum(h["schedule/tag_microbatches"] for h in history) >= 1, history
    assert all(math.isfinite(h["reward/mean"]) for h in history)
    stats = trainer.worker_stats()
    assert stats["gen:0"]["version"] == stats["trn:0"]["version"] == 2
    assert stats["gen:0"]["checksum"] == stats["trn:0"]["checksum"]  # the SYNC reached the vLLM-Omni engine
