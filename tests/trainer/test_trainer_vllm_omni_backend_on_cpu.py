"""The vLLM-Omni generator backend's glue, run on CPU with its in-process client.

The generator worker holds the engine `actor_rollout_ref.rollout.name` names; `vllm_omni` is `VllmOmniEngine`, which
drives a client through `AsyncOmni`'s interface: one request per prompt, the rl record in the output envelope's
metadata, `collective_rpc` answers shaped like vLLM-Omni's. The generator actor joins the weight-sync group itself
(gloo here) and hands every version to the engine's worker by RPC (`digenrl_stage_weights`). Here the client is
`InProcessOmniEngine`, which runs the pipeline's and the worker extension's methods in the actor (its stand-ins are
checked against the real vLLM-Omni classes in tests/contract); vLLM itself (scheduling, worker processes) does not
run on CPU. The reference is the same run on the diffusers backend: the trainer must not be able to tell them apart.
"""

from __future__ import annotations

import dataclasses
import math

import pytest
import ray

from digenrl_verl.metric_names import METRICS as M
from digenrl_verl.trainer.runner import DigenRLTrainer
from digenrl_verl.workers.specs import RolloutEngineSpec

pytestmark = pytest.mark.slow  # trains on Ray workers

RUN = ["data.train_batch_size=2", "actor_rollout_ref.rollout.n=4", "trainer.digenrl.mode=disaggregated",
       "trainer.digenrl.tag.policy=off", "trainer.digenrl.pools.generator.workers_per_node=2",
       "trainer.total_training_steps=2", "actor_rollout_ref.actor.optim.lr=1e-3"]


class SyncCheckingTrainer(DigenRLTrainer):
    def step_log(self, result):
        out = super().step_log(result)
        self.seen = getattr(self, "seen", []) + [self.worker_stats()]
        return out


class InProcessOmniTrainer(SyncCheckingTrainer):
    """Generators hold the vllm_omni engine on its in-process client (the config cannot select it: vllm_omni
    validates only where vLLM-Omni can run)."""

    def worker_args(self, role):
        args = super().worker_args(role)
        if role == "generator":
            engine = RolloutEngineSpec(name="vllm_omni", client="inprocess")
            args["policy"] = dataclasses.replace(args["policy"], engine=engine)
        return args


def test_omni_generator_backend_trains_exactly_like_the_diffusers_backend(train_run):
    reference = train_run(*RUN, trainer_cls=SyncCheckingTrainer, name="diffusers")
    omni = train_run(*RUN, trainer_cls=InProcessOmniTrainer, name="omni")
    engines = ray.get([a.__ray_call__.remote(lambda w: (type(w.engine).__name__, type(w.engine.client).__name__))
                       for k, a in omni.workers.items() if k.startswith("gen:")])
    assert engines == [("VllmOmniEngine", "InProcessOmniEngine")] * 2
    diffusers = ray.get([a.__ray_call__.remote(lambda w: type(w.engine).__name__)
                         for k, a in reference.workers.items() if k.startswith("gen:")])
    assert diffusers == ["DiffusersEngine"] * 2
    # same SDE code, same per-sample seeds, same device: same rewards, same weights
    rewards = [[h[M["reward_mean"]] for h in t.reporter.history] for t in (omni, reference)]
    assert rewards[0] == rewards[1]
    a, b = reference.trainable_state("trn:0"), omni.trainable_state("trn:0")
    assert max(float((a[k] - b[k]).abs().max()) for k in a) == 0.0
    # the weights reached the engines (actor -> RPC -> worker extension): engine checksum == trainer's per step
    for snapshot in omni.seen:
        assert len({s["checksum"] for s in snapshot.values()}) == 1, snapshot
    assert omni.seen[-1]["gen:0"]["version"] == 2
    assert omni.seen[0]["gen:0"]["checksum"] != omni.seen[-1]["gen:0"]["checksum"]


RUN_TAG = ["data.train_batch_size=2", "actor_rollout_ref.rollout.n=2", "trainer.digenrl.mode=disaggregated",
           "trainer.digenrl.tag.policy=static", "trainer.digenrl.tag.static_k=1", "trainer.total_training_steps=2",
           "actor_rollout_ref.rollout.recompute_old_log_probs=true"]  # as the config resolves it for vllm_omni


def test_tag_runs_on_the_trainers_own_engine_next_to_vllm_omni_generators(train_run):
    """TAG next to vLLM-Omni generators: `rollout.name=vllm_omni` keeps the flag's default TAG policy (issue 11.3a),
    because trainer ranks generate their TAG micro-batches with their own diffusers engine over the weights they train
    (forced here: static TAG of one micro-batch); the config-level decision is tested in
    test_trainer_verl_omni_defaults_on_cpu."""
    trainer = train_run(*RUN_TAG, trainer_cls=InProcessOmniTrainer, name="omni_tag")
    engines = {k: ray.get(a.__ray_call__.remote(lambda w: type(w.engine).__name__)) for k, a in trainer.workers.items()}
    assert engines == {"gen:0": "VllmOmniEngine", "trn:0": "DiffusersEngine"}
    history = trainer.reporter.history
    assert sum(h[M["tag_microbatches"]] for h in history) >= 1, history
    assert all(math.isfinite(h[M["reward_mean"]]) for h in history)
    stats = trainer.worker_stats()
    assert stats["gen:0"]["version"] == stats["trn:0"]["version"] == 2
    assert stats["gen:0"]["checksum"] == stats["trn:0"]["checksum"]  # the SYNC reached the vLLM-Omni engine
