"""Cost profiles: per-sample task durations on a reference accelerator (speed factor 1.0).

Each profile is derived from per-step times, the way the paper reasons about costs:

* generation of one sample = ``steps * fwd + decode`` (``fwd`` is one denoising step of the transformer,
  with two forwards folded in for models that use CFG at sampling time);
* one update of one sample with the per-timestep loop = ``K * fwdbwd * (1 + loop_overhead)``, where
  ``K = round(timestep_fraction * steps)`` trained timesteps each run a separate forward+backward
  (the verl-omni inner loop; ``loop_overhead`` is its per-timestep launch/collective overhead);
* TSP (time-step parallelism) batches the K timesteps of a micro-batch into one pass:
  ``K * fwdbwd * tsp_factor``;
* TAG generation on a trainer rank = generation x ``tag_overhead`` (sharded weights are gathered per
  forward, and the actor/rollout switch is paid per TAG micro-batch);
* a checkpoint (the CHECKPOINT task at a ``checkpoint_every`` barrier) = the time to write the trainer state
  of a full fine-tune, ``params x CHECKPOINT_BYTES_PER_PARAM`` bytes, at ``CHECKPOINT_WRITE_GB_S``
  (`checkpoint_seconds`); it is disk-bound, so the simulator does not scale it by accelerator speed.

**These numbers are assumptions, not measurements.** They are round figures of the right order for the
named models on an H800-class GPU (bf16, one sample, the resolutions the DanceGRPO / Flow-GRPO recipes
use); ``tsp_factor``, ``loop_overhead``, ``tag_overhead`` and the checkpoint's bytes per parameter and write
bandwidth in particular are modelling choices. The
simulator's speedups follow from them, so they show what the schedule does for costs of this shape,
not what a real cluster measures.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from digenrl_verl.schedule.types import TaskKind
from digenrl_verl.sim.registry import NamedRegistry

CHECKPOINT_BYTES_PER_PARAM = 12.0
"""Assumption: what `trainer/checkpoint.py` writes per trainable parameter of a full fine-tune whose trainable
(master) weights are fp32: the weight and AdamW's two moments (same dtype as the weight), 3 x 4 bytes; the
RNG state and the JSON files are negligible. A bf16 trainer writes half; a LoRA run a tiny fraction."""

CHECKPOINT_WRITE_GB_S = 2.0
"""Assumption (not measured): sustained write bandwidth of trainer rank 0, which writes the whole tensors, to
the checkpoint directory (one local NVMe drive, or one client of a parallel file system), in GB/s."""


def checkpoint_seconds(params_billion: float, *, bytes_per_param: float = CHECKPOINT_BYTES_PER_PARAM,
                       write_gb_s: float = CHECKPOINT_WRITE_GB_S) -> float:
    """Seconds to write the trainer state of a ``params_billion`` x 1e9 parameter model: bytes / bandwidth."""
    return params_billion * bytes_per_param / write_gb_s


@dataclass(frozen=True)
class CostProfile:
    """Per-sample (per-task for OPT/SYNC/CHECKPOINT) seconds on a speed-1.0 accelerator (checkpoint: any speed)."""

    name: str
    gen: float
    score: float
    update_loop: float
    update_tsp: float
    tag_overhead: float
    opt_step: float
    sync: float
    checkpoint: float = 0.0
    source: dict[str, float] = field(default_factory=dict)

    def unit(self, kind: TaskKind, tsp: bool = False) -> float:
        """Seconds per work unit (one sample per rank) for a task kind."""
        if kind == TaskKind.GEN:
            return self.gen
        if kind == TaskKind.TAG_GEN:
            return self.gen * self.tag_overhead
        if kind == TaskKind.SCORE:
            return self.score
        if kind == TaskKind.UPDATE:
            return self.update_tsp if tsp else self.update_loop
        if kind == TaskKind.OPT_STEP:
            return self.opt_step
        if kind == TaskKind.SYNC:
            return self.sync
        if kind == TaskKind.CHECKPOINT:
            return self.checkpoint
        raise ValueError(f"unknown task kind {kind!r}")

    def scaled(self, factor: float) -> "CostProfile":
        """Every duration x ``factor`` (e.g. to compare at another overall speed)."""
        return replace(self, gen=self.gen * factor, score=self.score * factor, update_loop=self.update_loop * factor,
                       update_tsp=self.update_tsp * factor, opt_step=self.opt_step * factor, sync=self.sync * factor,
                       checkpoint=self.checkpoint * factor)


def from_step_times(name: str, *, fwd: float, fwdbwd: float, steps: int, timestep_fraction: float, decode: float,
                    reward: float, opt_step: float, sync: float, loop_overhead: float = 0.1,
                    tsp_factor: float = 0.4, tag_overhead: float = 1.15, params_billion: float = 0.0) -> CostProfile:
    """Build a profile from per-step forward and forward+backward times (see the module docstring);
    ``params_billion`` sizes the checkpoint (`checkpoint_seconds`; 0: checkpoints cost nothing)."""
    k = max(1, round(timestep_fraction * steps))
    return CostProfile(
        name=name,
        gen=steps * fwd + decode,
        score=reward,
        update_loop=k * fwdbwd * (1.0 + loop_overhead),
        update_tsp=k * fwdbwd * tsp_factor,
        tag_overhead=tag_overhead,
        opt_step=opt_step,
        sync=sync,
        checkpoint=checkpoint_seconds(params_billion),
        source={"fwd": fwd, "fwdbwd": fwdbwd, "steps": steps, "timestep_fraction": timestep_fraction,
                "trained_timesteps": k, "decode": decode, "reward": reward, "loop_overhead": loop_overhead,
                "tsp_factor": tsp_factor, "params_billion": params_billion,
                "checkpoint_bytes_per_param": CHECKPOINT_BYTES_PER_PARAM, "checkpoint_write_gb_s": CHECKPOINT_WRITE_GB_S},
    )


def _hunyuan(steps: int, frac: float) -> CostProfile:
    # HunyuanVideo 13B, ~480p x 53 frames, embedded guidance (one forward per step), VideoAlign reward.
    return from_step_times(f"hunyuanvideo-{steps}-{frac}", fwd=2.0, fwdbwd=6.0, steps=steps, timestep_fraction=frac,
                           decode=10.0, reward=3.0, opt_step=4.0, sync=8.0, tsp_factor=0.35, params_billion=13.0)


PROFILES: NamedRegistry[CostProfile] = NamedRegistry("cost profile")


def register_profile(profile: CostProfile) -> CostProfile:
    """Add a profile; names are unique."""
    return PROFILES.register(profile.name, profile)


for _steps in (20, 30, 40):
    for _frac in (0.4, 0.6):
        register_profile(_hunyuan(_steps, _frac))
# Wan2.1 14B T2V, 480p, CFG at sampling and training (two forwards folded into fwd / fwdbwd).
register_profile(from_step_times("wan2.1", fwd=3.0, fwdbwd=9.0, steps=20, timestep_fraction=0.4, decode=8.0,
                                 reward=2.0, opt_step=4.0, sync=8.0, tsp_factor=0.35, params_billion=14.0))
# FLUX.1-dev 12B, 1024x1024, embedded guidance, PickScore reward.
register_profile(from_step_times("flux.1", fwd=0.5, fwdbwd=1.5, steps=16, timestep_fraction=0.6, decode=0.3,
                                 reward=0.2, opt_step=2.0, sync=4.0, tsp_factor=0.4, params_billion=12.0))
# Qwen-Image 20B, 1024x1024, true CFG (two forwards), OCR/PickScore reward.
register_profile(from_step_times("qwen-image", fwd=1.4, fwdbwd=4.2, steps=20, timestep_fraction=0.4, decode=0.4,
                                 reward=0.3, opt_step=3.0, sync=6.0, tsp_factor=0.4, params_billion=20.0))


# Not a paper workload: generation-heavy costs (update = 2% of generation per sample) so that a 1024-GPU
# run with 32 generator lanes is balanced enough for BTS to be consulted at most bubbles (scale check); the
# checkpoint is sized like a 12B model's (`checkpoint_seconds(12)`).
register_profile(CostProfile("synthetic-scale", gen=10.0, score=0.1, update_loop=0.4, update_tsp=0.2,
                             tag_overhead=1.15, opt_step=1.0, sync=2.0, checkpoint=checkpoint_seconds(12.0)))


def get_profile(name: str) -> CostProfile:
    return PROFILES.lookup(name)
