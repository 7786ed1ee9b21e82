"""A sample is the same whoever draws it: a generator, or trainer ranks under TAG (`trainer.digenrl.rows_alone`).

Batched forwards round a row differently next to other rows (a TAG micro-batch is split 2 + 1 over two trainer ranks,
a generator draws the 3 rows together): fp32 rounding, ~1e-7. The decoded sample is quantised to uint8 before
the reward, so such an ulp can flip a pixel, and a group-normalised advantage over rewards ~1e-4 apart turns that
flip into a percent of the gradient: on-policy equivalence would depend on BTS's timing-driven placement (issue 33:
step 2's grad norm 0.039582 with group 1 drawn by TAG, 0.039893 with it drawn by the generator). With
`rows_alone` the diffusers engines draw each sample in a batch of its own (sharded trainer ranks pad to the largest
share, so their collective forwards stay in lock-step), and the placement no longer matters, bit for bit.
"""

from __future__ import annotations

import pytest
import ray
import torch

from digenrl_verl.diffusion.rollout import RolloutConfig
from digenrl_verl.engines.base import RolloutRows
from digenrl_verl.engines.diffusers import DiffusersEngine
from digenrl_verl.models.config import LoraConfig, PipelineConfig
from digenrl_verl.models.registry import load_adapter
from digenrl_verl.trainer.runner import DigenRLTrainer

FIELDS = ("latents", "next_latents", "rollout_log_probs")


def _engine(model_dir, rows_alone: bool) -> DiffusersEngine:
    adapter = load_adapter(str(model_dir), lora=LoraConfig(rank=0), device=torch.device("cpu"), dtype=torch.float32,
                           pipeline=PipelineConfig(height=32, width=32, max_sequence_length=32))
    cfg = RolloutConfig(num_inference_steps=4, noise_level=0.7, timestep_fraction=0.99, seed=3, rows_alone=rows_alone)
    return DiffusersEngine(adapter, cfg)


def _rows(indices) -> RolloutRows:
    return RolloutRows(["a red cube"] * len(indices), ["u0"] * len(indices), list(indices), list(indices), step=0)


def _split_differences(engine: DiffusersEngine) -> list[float]:
    """Rows 0..2 drawn together against the same rows drawn as a TAG split would (rows 0-1, then row 2 alone)."""
    whole = engine.generate(_rows([0, 1, 2]))
    parts = [engine.generate(_rows([0, 1])), engine.generate(_rows([2]))]
    out = []
    for key in FIELDS:
        split = torch.cat([p.tensors[key] for p in parts])
        out.append(float((whole.tensors[key] - split).abs().max()))
    out.append(float((whole.images.int() - torch.cat([p.images for p in parts]).int()).abs().max()))
    return out


def test_rows_alone_makes_a_row_independent_of_its_neighbours(tiny_flux_dir):
    assert _split_differences(_engine(tiny_flux_dir, rows_alone=True)) == [0.0] * (len(FIELDS) + 1)


def test_batched_rows_differ_by_rounding_at_most(tiny_flux_dir):
    """Without it (verl-omni's batched rollout): the same trajectory up to fp32 rounding, not bit for bit in general."""
    diffs = _split_differences(_engine(tiny_flux_dir, rows_alone=False))
    assert max(diffs[:-1]) <= 1e-5, diffs


class RecordingTrainer(DigenRLTrainer):
    """Keeps every generated sample's trajectory (and which task kind and worker drew it) and reward."""

    def make_executor(self):
        executor = super().make_executor()
        self.drawn, self.rewards = {}, {}
        generate, absorb = executor._generate, executor._absorb

        def record_generate(task):
            flight = generate(task)
            for worker, samples in task.assignment:
                for j, s in enumerate(samples):
                    self.drawn[(task.step, s)] = (task.kind.name, worker, executor._trajectories[(task.step, s)], j)
            return flight

        def record_absorb(task, values):
            if task.kind.name == "SCORE":
                for v in values:
                    self.rewards.update({(task.step, int(i)): float(r) for i, r in zip(v["sample_ids"], v["scores"])})
            return absorb(task, values)

        executor._generate, executor._absorb = record_generate, record_absorb
        return executor

    def samples(self) -> dict:
        return {key: (kind, worker, {k: ray.get(ref).batch[k][j] for k in FIELDS})
                for key, (kind, worker, ref, j) in self.drawn.items()}


RUN = ["data.train_batch_size=2", "actor_rollout_ref.rollout.n=3", "trainer.digenrl.mode=disaggregated",
       "trainer.digenrl.pools.trainer.workers_per_node=2", "trainer.digenrl.tsp.chunk_size=3",
       "trainer.total_training_steps=2", "actor_rollout_ref.actor.optim.lr=1e-3",
       "actor_rollout_ref.actor.optim.eps=1e-3",
       "actor_rollout_ref.actor.strategy=fsdp2", "trainer.digenrl.rows_alone=true"]


@pytest.mark.slow
def test_a_sample_drawn_by_tag_equals_the_same_sample_drawn_by_a_generator(train_run):
    # TAG at the first bubble of each step (the trainers idle at a step's start): group 1 drawn by the two sharded
    # trainer ranks (2 + 1 rows, the smaller share padded); without TAG the generator draws it (3 rows)
    tag = train_run(*RUN, "trainer.digenrl.tag.policy=static", "trainer.digenrl.tag.static_k=1",
                    trainer_cls=RecordingTrainer, name="tag")
    gen = train_run(*RUN, "trainer.digenrl.tag.policy=off", trainer_cls=RecordingTrainer, name="gen")
    by_tag, by_gen = tag.samples(), gen.samples()
    assert by_tag.keys() == by_gen.keys() and len(by_tag) == 12
    moved = sorted(k for k in by_tag if by_tag[k][0] == "TAG_GEN")
    assert moved and all(by_gen[k][0] == "GEN" for k in by_gen), (moved, by_gen)  # both placements of those samples
    assert {by_tag[k][1] for k in moved} == {"trn:0", "trn:1"}  # split over the ranks: uneven shares, padded
    for key in sorted(by_tag):  # every trained step of every sample, both steps: bit for bit
        for name in FIELDS:
            assert torch.equal(by_tag[key][2][name], by_gen[key][2][name]), (key, by_tag[key][:2], name)
    assert tag.rewards == gen.rewards and len(tag.rewards) == 12
    norms = [[h["actor/grad_norm"] for h in t.reporter.history] for t in (tag, gen)]
    assert norms[0] == norms[1] and len(norms[0]) == 2, norms
    a, b = tag.trainable_state("trn:0"), gen.trainable_state("trn:0")
    assert all(torch.equal(a[k], b[k]) for k in a)
