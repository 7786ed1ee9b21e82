"""Step metric names against the installed verl-omni a1139baf: for each quantity both compute, verl-omni's own code
computes it from the same inputs, and its name and value must be ours (`digenrl_verl.metric_names.VERL_OMNI`).

Data metrics: verl-omni's Flow-GRPO advantage estimator and `compute_data_metrics_diffusion` on a DataProto of the
rewards our `data_metrics` sees; timing / throughput: its `compute_timing_metrics_diffusion` /
`compute_throughput_metrics_diffusion`; the actor: its Flow-GRPO, Flow-DPPO and KL losses on the rows our
`policy_loss` sees; the engine worker's `loss` / `grad_norm` / `lr` and the loss's `kl_coef`, renamed with verl's
`rename_dict(..., "actor/")` as verl-omni's trainer does. The CPU twin (verl-omni's metric utilities loaded from
its source archive): tests/trainer/test_trainer_metric_names_on_cpu.py.
"""

from __future__ import annotations

import inspect
from types import SimpleNamespace

import numpy as np
import pytest
import torch

try:
    import verl_omni  # noqa: F401  (imports vLLM-Omni eagerly)
except ImportError as e:
    pytest.skip(f"verl_omni is not importable here ({e}); run bash scripts/test_verl_omni.sh", allow_module_level=True)

from verl import DataProto  # noqa: E402
from verl.utils.py_functional import rename_dict  # noqa: E402
from verl_omni.trainer.diffusion import diffusion_metric_utils as vo_metrics  # noqa: E402
from verl_omni.trainer.diffusion import ray_diffusion_trainer  # noqa: E402
from verl_omni.trainer.diffusion.diffusion_algos import FlowDPPOLoss, FlowGRPOLoss, KLLoss  # noqa: E402
from verl_omni.workers import engine_workers  # noqa: E402
from verl_omni.workers.utils import losses as vo_losses  # noqa: E402

from digenrl_verl.diffusion.advantages import AdvantageConfig  # noqa: E402
from digenrl_verl.diffusion.loss import LossConfig, policy_loss  # noqa: E402
from digenrl_verl.metric_names import METRICS as M  # noqa: E402
from digenrl_verl.metric_names import VERL_OMNI  # noqa: E402
from digenrl_verl.trainer.reporting import data_metrics, perf_metrics  # noqa: E402

REWARDS = [0.2, 0.6, 0.5, 0.5, 0.1, 0.9, 0.7]  # groups a, b (equal rewards), c, and d of one sample
UIDS = ["a", "a", "b", "b", "c", "c", "d"]


def _same(ours: dict, theirs: dict, rel: float = 1e-6) -> list[str]:
    """The shared quantities verl-omni computed here: our name beside verl-omni's, values equal; their names."""
    shared = [name for name in VERL_OMNI.values() if name in theirs]
    for q, name in VERL_OMNI.items():
        if name in theirs:
            print(f"{q:24s} ours {name:48s} verl-omni {name}: {ours.get(name)} / {theirs[name]}")
            assert name in ours, (q, name)
            assert ours[name] == pytest.approx(theirs[name], rel=rel, abs=1e-7), (name, ours[name], theirs[name])
    return shared


@pytest.mark.parametrize("global_std", [True, False])
def test_data_metrics_are_verl_omnis(global_std):
    # one trained step per sample: verl-omni's global std is then over the samples, as ours
    r = torch.tensor(REWARDS, dtype=torch.float32)[:, None]
    batch = DataProto.from_dict({"sample_level_rewards": r}, non_tensors={"uid": np.array(UIDS, dtype=object)})
    batch = ray_diffusion_trainer.compute_advantage(batch, "flow_grpo", norm_adv_by_std_in_grpo=True,
                                                    global_std=global_std)
    theirs = vo_metrics.compute_data_metrics_diffusion(batch)
    ours = data_metrics(dict(enumerate(REWARDS)), UIDS, AdvantageConfig(global_std=global_std, adv_clip_max=0.5))
    shared = _same(ours, theirs)
    assert set(shared) == set(theirs) == {n for n in ours if not n.startswith("digenrl/")}


def test_timing_and_throughput_are_verl_omnis():
    batch = DataProto.from_dict({"sample_level_rewards": torch.ones(6, 2)})
    timing = {"step": 1.5}
    theirs = {**vo_metrics.compute_timing_metrics_diffusion(timing, num_images=6),
              **vo_metrics.compute_throughput_metrics_diffusion(batch, timing, n_gpus=4)}
    ours = perf_metrics(step=0, samples=6, step_s=1.5, devices=4)
    assert set(_same(ours, theirs)) == set(ours) - {M["global_step"]}
    assert '"training/global_step": self.global_steps' in inspect.getsource(ray_diffusion_trainer)


def _rows():
    g = torch.Generator().manual_seed(0)
    old = torch.randn(8, generator=g) * 0.1
    logp = old + torch.randn(8, generator=g) * 0.02
    adv = torch.randn(8, generator=g).clamp(-0.9, 0.9)  # inside verl-omni's adv_clip_max: no clamp either side
    mean, ref = torch.randn(8, 4, 3, generator=g), torch.randn(8, 4, 3, generator=g)
    return old, logp, adv, mean, ref, torch.rand(8, generator=g) + 0.5


def test_actor_metrics_are_verl_omnis():
    old, logp, adv, mean, ref, sigma = _rows()
    cfg = SimpleNamespace(diffusion_loss=SimpleNamespace(clip_ratio=0.01, adv_clip_max=1.0, kl_mask_threshold=1e9,
                                                         add_kl_coefficient=True))
    pg, grpo = FlowGRPOLoss.compute_loss(old_log_prob=old, log_prob=logp, advantages=adv, config=cfg)
    kl, kl_metrics = KLLoss.compute_loss(prev_sample_mean=mean, ref_prev_sample_mean=ref,
                                         std_dev_t=sigma[:, None, None])
    _, dppo = FlowDPPOLoss.compute_loss(old_log_prob=old, log_prob=logp, advantages=adv, config=cfg,
                                        old_prev_sample_mean=mean, prev_sample_mean=mean,
                                        std_dev_t=sigma[:, None, None], sqrt_dt=torch.ones(8))
    _, stats = policy_loss(logp, old, adv, LossConfig(clip_ratio=0.01, kl_coef=0.1, kl_type="sigma_t"), 8.0,
                           mean=mean, ref_mean=ref, std_dev_t=sigma)
    ours = stats.metrics()
    theirs = {**grpo, **kl_metrics, **dppo, M["pg_loss"]: pg.item()}  # verl's pg_loss: the policy term's mean
    shared = _same(ours, theirs, rel=1e-5)
    compared = ("pg_loss", "pg_clipfrac", "ratio_mean", "ratio_min", "ratio_max", "approx_kl", "kl_loss")
    assert {M[q] for q in compared} <= set(shared)
    assert 0 < ours[M["pg_clipfrac"]] < 1 and kl.item() > 0  # the rows exercise the clip and the KL


def test_engine_and_loss_metric_keys_get_verl_omnis_actor_prefix():
    """`loss`, `grad_norm`, `lr` (the engine worker's metrics) and `kl_coef` (the diffusion loss's) become
    `actor/<key>` through the trainer's `rename_dict(actor_output, "actor/")`."""
    engine, loss_src = inspect.getsource(engine_workers), inspect.getsource(vo_losses.diffusion_loss)
    keys = {"loss": engine, "grad_norm": engine, "lr": engine, "kl_coef": loss_src}
    for key, src in keys.items():
        assert f'metrics["{key}"] =' in src, key
    assert 'rename_dict(actor_output, "actor/")' in inspect.getsource(ray_diffusion_trainer)
    renamed = rename_dict(dict.fromkeys(keys, 0.0), "actor/")
    assert set(renamed) == {M[q] for q in ("loss", "grad_norm", "lr", "kl_coef")}
