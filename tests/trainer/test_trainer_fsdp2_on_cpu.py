"""FSDP2 trainer pool (`actor_rollout_ref.actor.strategy=fsdp2`) on CPU: fully_shard over gloo, two trainer ranks.

The same run with `strategy=ddp` (whole model per rank, one flat all-reduce) is the reference: the gradients are
the same sums, so the weights must agree up to fp32 summation order; TAG (lock-step sampling on the sharded
trainers), uneven TSP chunk counts (padded passes), the weight sync to the generator, checksums and a checkpoint
resume all run through the sharded path.
"""

from __future__ import annotations

import pytest
import ray
import torch

from digenrl_verl.schedule.invariants import check_run
from digenrl_verl.schedule.types import TaskKind
from digenrl_verl.trainer.runner import DigenRLTrainer

pytestmark = pytest.mark.slow  # every test here trains on Ray workers

# 3 samples per prompt over 2 trainer ranks: shares of 2 and 1, so with tsp_chunk_size=3 the ranks hold 2x2=4
# and 1x2=2 rows (2 and 1 chunks): the smaller share pads one pass
RUN = ["data.train_batch_size=2", "actor_rollout_ref.rollout.n=3", "trainer.digenrl.mode=disaggregated",
       "trainer.digenrl.pools.trainer.workers_per_node=2", "trainer.digenrl.tag.policy=static",
       "trainer.digenrl.tag.static_k=1",
       "trainer.digenrl.tsp.chunk_size=3", "trainer.total_training_steps=2", "actor_rollout_ref.actor.optim.lr=1e-3",
       # a larger eps keeps Adam's first step a smooth function of the gradient, so summation-order noise in ~0
       # elements is not amplified to +/-lr (the on-policy equivalence test compares gradients instead)
       "actor_rollout_ref.actor.optim.eps=1e-3",
       # each sample drawn alone: the same trajectory whether a generator or the trainers (TAG, at bubbles whose timing
       # varies run to run) draw it; batched, a uint8 pixel flip changed step 2's gradient by 1% in 5 runs of 10
       # (test_trainer_sample_placement_on_cpu.py)
       "trainer.digenrl.rows_alone=true"]


def _state(trainer, worker):
    return trainer.trainable_state(worker)


def _max_rel_diff(a, b):
    assert a.keys() == b.keys()
    return max(float((a[k] - b[k]).abs().max() / b[k].abs().max().clamp_min(1e-12)) for k in a)


class ShardCheckingTrainer(DigenRLTrainer):
    """Records whether the trainers' parameters are DTensor shards, and every worker's checksum after each step."""

    def make_executor(self):
        self.sharded = ray.get([a.__ray_call__.remote(
            lambda w: sorted({type(p).__name__ for p in w.trainable().values()}))
            for k, a in self.workers.items() if k.startswith("trn:")])
        return super().make_executor()

    def step_log(self, result):
        out = super().step_log(result)
        self.seen = getattr(self, "seen", []) + [self.worker_stats()]
        return out


def test_fsdp2_trainer_gives_the_ddp_weights_and_syncs_whole_weights(train_run):
    # two optimizer steps per global step (ppo_mini_batch_size=1 prompt) with recomputed old log-probs: the sharded
    # ranks keep the step-start weights and swap them in shard by shard for the second mini-batch's recompute passes
    minibatches = ["actor_rollout_ref.actor.ppo_mini_batch_size=1",
                   "actor_rollout_ref.rollout.recompute_old_log_probs=true"]
    ddp = train_run(*RUN, *minibatches, "actor_rollout_ref.actor.strategy=ddp", name="ddp")
    fsdp = train_run(*RUN, *minibatches, "actor_rollout_ref.actor.strategy=fsdp2", trainer_cls=ShardCheckingTrainer,
                     name="fsdp2")
    assert fsdp.run.train.sharding.sharded and not ddp.run.train.sharding.sharded
    assert fsdp.run.schedule.mini_batches_per_step == 2
    assert fsdp.sharded == [["DTensor"], ["DTensor"]]  # both trainer ranks hold shards
    for t in (ddp, fsdp):
        assert check_run(t.run.schedule, t.driver.trace.completions) == []
    kinds = [c.task.kind for c in fsdp.driver.trace.sorted_completions()]
    assert TaskKind.TAG_GEN in kinds  # the sharded trainers sampled in lock-step
    # the sharded gradients are the same sums (not averages over the 2 ranks): same global norm at every step
    norms = [[h["actor/grad_norm"] for h in t.reporter.history] for t in (ddp, fsdp)]
    assert norms[0][0] > 0 and all(abs(x - y) <= 1e-5 * x for x, y in zip(*norms)), norms
    a, b = _state(ddp, "trn:0"), _state(fsdp, "trn:0")
    print(f"FSDP2 vs DDP weights after 2 global steps of 2 optimizer steps: {_max_rel_diff(b, a):.3g}")
    assert _max_rel_diff(b, a) <= 1e-5, _max_rel_diff(b, a)
    assert _max_rel_diff(_state(fsdp, "trn:1"), b) == 0.0
    assert _max_rel_diff(_state(fsdp, "gen:0"), b) == 0.0
    # the generator received the whole weights: same checksum as both trainer ranks at every step
    for snapshot in fsdp.seen:
        assert len({s["checksum"] for s in snapshot.values()}) == 1, snapshot
        assert len({s["version"] for s in snapshot.values()}) == 1
    # and the run learned something (not a no-op that trivially agrees)
    start = fsdp.seen[0]["gen:0"]["checksum"]
    assert fsdp.seen[-1]["gen:0"]["checksum"] != start


def test_fsdp2_checkpoint_resume_reaches_the_uninterrupted_weights(train_run, tiny_flux_dir, tmp_path):
    from digenrl_verl.main import TINY_CPU, compose
    from digenrl_verl.trainer.checkpoint import checkpoint_dir, read_meta
    from digenrl_verl.trainer.config import build_run

    fsdp = [*RUN, "actor_rollout_ref.actor.strategy=fsdp2", "trainer.digenrl.tag.policy=off",
            "reward.reward_functions={brightness: 1.0}"]  # a score in [0, 1], checked below
    ckpt_root = tmp_path / "ckpt"
    straight = train_run(*fsdp, "trainer.save_freq=1", f"trainer.default_local_dir={ckpt_root}", name="straight")
    want = _state(straight, "trn:1")
    ckpt = checkpoint_dir(ckpt_root, 1)
    assert read_meta(ckpt)["global_step"] == 1
    # the files hold whole tensors (the strategy does not leak into the format)
    from safetensors.torch import load_file

    saved, live = load_file(str(ckpt / "model.safetensors")), _state(straight, "trn:0")
    assert {k: v.shape for k, v in saved.items()} == {k: v.shape for k, v in live.items()}
    straight.shutdown()

    # one evaluation prompt for two sharded ranks: rank 1's empty share still takes part in the forwards
    overrides = [TINY_CPU, f"actor_rollout_ref.model.path={tiny_flux_dir}",
                 f"trainer.digenrl.output_dir={tmp_path / 'resumed'}",
                 "trainer.logger=[console]", "trainer.digenrl.final_eval_prompts=1", *fsdp]
    resumed = DigenRLTrainer(build_run(compose(overrides), start_step=1))
    try:
        summary = resumed.fit(resume_from=ckpt)
        got = _state(resumed, "trn:1")
        assert [r.step for r in resumed.results] == [1]
        assert 0.0 <= summary["eval/reward_ode"] <= 1.0
    finally:
        resumed.shutdown()
    assert _max_rel_diff(got, want) <= 1e-5


def test_fsdp2_with_lora_bf16_and_the_kl_term(train_run):
    # LoRA's reference policy is the adapter disabled: under FSDP2 that is one more sharded (collective) forward
    # per pass, on every rank; bf16 parameters are sharded and gathered in bf16
    lora = [*RUN, "trainer.total_training_steps=1", "actor_rollout_ref.model.lora_rank=4",
            "actor_rollout_ref.actor.use_kl_loss=true", "actor_rollout_ref.actor.kl_loss_coef=0.1",
            "actor_rollout_ref.actor.fsdp_config.model_dtype=bf16"]
    ddp = train_run(*lora, "actor_rollout_ref.actor.strategy=ddp", name="lora_ddp")
    fsdp = train_run(*lora, "actor_rollout_ref.actor.strategy=fsdp2", trainer_cls=ShardCheckingTrainer,
                     name="lora_fsdp2")
    assert fsdp.sharded == [["DTensor"], ["DTensor"]]
    state = fsdp.trainable_state("trn:0")
    # peft keeps the adapter weights in fp32 over the bf16 base (a mixed-precision LoRA)
    assert state and all("lora_" in k for k in state) and {v.dtype for v in state.values()} == {torch.float32}
    frozen = ray.get(fsdp.workers["trn:1"].__ray_call__.remote(
        lambda w: sorted({str(p.dtype) for p in w.adapter.transformer.parameters() if not p.requires_grad})))
    assert frozen == ["torch.bfloat16"]
    snapshot = fsdp.seen[-1]
    assert len({s["checksum"] for s in snapshot.values()}) == 1 and {s["version"] for s in snapshot.values()} == {1}
    (n_ddp,), (n_fsdp,) = ([h["actor/grad_norm"] for h in t.reporter.history] for t in (ddp, fsdp))
    assert n_ddp > 0 and abs(n_fsdp - n_ddp) <= 1e-2 * n_ddp, (n_ddp, n_fsdp)  # bf16 forwards: looser than fp32
