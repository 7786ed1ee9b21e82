"""What a rollout engine is built from: the policy and the engine settings (small, picklable, validated)."""

from __future__ import annotations

from dataclasses import dataclass, field

from digenrl_verl.diffusion.rollout import RolloutConfig
from digenrl_verl.engines.base import ENGINES
from digenrl_verl.models.config import LoraConfig, PipelineConfig
from digenrl_verl.models.registry import read_model_index

#: the package's SDE kinds -> verl-omni's (algorithm, sde_type): its rollout pipelines are registered by algorithm
VERL_OMNI_SDE_KINDS = {"sde": ("flow_grpo", "sde"), "cps": ("flow_grpo", "cps"), "dance": ("dance_grpo", "dance_sde"),
                       "dance_sde": ("dance_grpo", "dance_sde")}
#: the architectures whose prompts the ``verl_omni`` engine maps to verl-omni's request fields (verl-omni registers
#: rollout pipelines for these with flow_grpo / dance_grpo; `integrations.verl_omni_rollout.PROMPT_FIELDS`)
VERL_OMNI_ARCHITECTURES = ("QwenImagePipeline", "StableDiffusion3Pipeline", "WanPipeline")
#: the architectures whose server requests the ``verl_omni_replica`` engine builds from tokenizers alone, without the
#: pipeline object (`integrations.verl_omni_replica.PROMPT_PIPES`; SD3's as per-encoder ids, as verl-omni's agent loop)
REPLICA_ARCHITECTURES = ("QwenImagePipeline", "StableDiffusion3Pipeline", "WanPipeline")
#: the key that chooses between verl-omni's replicas and its in-process pipeline (`DigenRLConfig.generator_replicas`)
REPLICAS_KEY = "trainer.digenrl.generator_replicas"


@dataclass(frozen=True)
class RolloutEngineSpec:
    """The generators' sampling engine (`actor_rollout_ref.rollout.*`).

    Validation needs no backend module: the name must be declared in `engines.base.ENGINES`, and the engine must
    be able to run here (its packages found), else ValueError naming the key
    and the fix.

    Args:
        name: `diffusers` (the policy in the generator process, CPU or GPU), `verl_omni_replica` (one of verl-omni's
            standalone rollout replicas per generator rank) or `verl_omni` (verl-omni's rollout pipeline in the
            generator's process, CPU): `actor_rollout_ref.rollout.name`, with ``vllm_omni`` resolved by the config
            to one of the last two (`config.verl_omni.generator_engine_name`).
        dtype: the engine's model dtype (`actor_rollout_ref.rollout.dtype`): the generators sample in it; trainers
            (TAG, colocated) sample with the model they train.
        engine_kwargs: `actor_rollout_ref.rollout.engine_kwargs.vllm_omni`: verl-omni's replicas take them in their
            rollout config (its server passes them to `AsyncOmni`; on CPU with ``max_num_seqs=1``).
        runs_here: check that the engine can run in this process (its packages). False only for a
            dry run's plan (`trainer.digenrl.dry_run`), which is made for the cluster, not for this machine; the
            engine still checks when it is built.
        colocated: trainer ranks (TAG micro-batches, the colocated mode) sample with a colocated copy of this engine
            too, their trained weights handed over whenever they sample at a new version (`hand_over`: verl-omni's
            hybrid engine, which wakes its rollout, syncs the actor's weights and generates); False: they sample
            with their own diffusers engine over the model they train. Set by the config (verl_omni only).
    """

    name: str = "diffusers"
    dtype: str = "bfloat16"
    engine_kwargs: dict = field(default_factory=dict)
    runs_here: bool = True
    colocated: bool = False

    def __post_init__(self) -> None:
        entry = ENGINES.entry(self.name)
        if self.runs_here:
            entry.require()
        if self.colocated and self.name != "verl_omni":
            raise ValueError(f"{self.name}: only the verl_omni engine runs colocated on trainer ranks")


@dataclass(frozen=True)
class PolicySpec:
    """The sampling policy every worker holds (generators, trainers for TAG, colocated workers).

    Args:
        model_path: local diffusers model directory (model_index.json).
        lora: LoRA settings, or full fine-tune (rank 0).
        pipeline: image size, guidance, text length.
        rollout: SDE kind, noise level, timestep selection, seeds.
        dtype: model dtype ("float32"; the SDE math is fp32 whatever this is).
        start_version: policy version of the weights at start (the global step resumed from).
        device: "cpu", or "cuda" for workers placed on GPU bundles (each sees its one GPU as cuda:0).
        engine: the generators' sampling engine (trainers always sample TAG micro-batches in-process).
    """

    model_path: str
    lora: LoraConfig
    pipeline: PipelineConfig
    rollout: RolloutConfig
    dtype: str = "float32"
    start_version: int = 0
    device: str = "cpu"
    engine: RolloutEngineSpec = field(default_factory=RolloutEngineSpec)

    def __post_init__(self) -> None:
        if self.engine.name == "verl_omni" and self.engine.runs_here:
            check_verl_omni_policy(self)
        if self.engine.name == "verl_omni_replica":  # refused when the run is planned, before any worker starts
            check_replica_policy(self)


def check_verl_omni_policy(spec: PolicySpec) -> tuple[str, str]:
    """(verl-omni algorithm, its sde_type) of `spec` for the rollout engine ``verl_omni`` (verl-omni's registered
    rollout pipeline in the generator's process); ValueError naming the key of what that engine cannot do."""
    key = "actor_rollout_ref.rollout.name=verl_omni"
    rollout = spec.rollout
    architecture = read_model_index(spec.model_path)["_class_name"]  # ValueError naming model.path if not a model
    if architecture not in VERL_OMNI_ARCHITECTURES:
        raise ValueError(f"actor_rollout_ref.model.architecture={architecture!r} with {key}: this engine maps the "
                         f"prompts of {list(VERL_OMNI_ARCHITECTURES)} to verl-omni's rollout requests; use "
                         "actor_rollout_ref.rollout.name=diffusers")
    if rollout.sde_type not in VERL_OMNI_SDE_KINDS:
        raise ValueError(f"actor_rollout_ref.rollout.algo.sde_type={rollout.sde_type!r} with {key}: verl-omni's "
                         f"rollout samples {sorted(VERL_OMNI_SDE_KINDS)}")
    if rollout.timestep_selection != "window":
        raise ValueError(f"actor_rollout_ref.rollout.algo.timestep_selection={rollout.timestep_selection!r} with {key}:"
                         " verl-omni's rollout samples one SDE window per row; use window (sde_window_size / "
                         "sde_window_range), or actor_rollout_ref.rollout.name=diffusers")
    if spec.device != "cpu":
        raise ValueError(f"{key} runs verl-omni's pipeline in the generator's process, on CPU only; on GPUs "
                         "verl-omni's rollout is its replicas. Fix: actor_rollout_ref.rollout.name=vllm_omni with "
                         f"{REPLICAS_KEY} null or true, or actor_rollout_ref.rollout.name=diffusers")
    return VERL_OMNI_SDE_KINDS[rollout.sde_type]


def check_replica_policy(spec: PolicySpec) -> tuple[str, str]:
    """(architecture, verl-omni algorithm) of `spec` for the rollout engine ``verl_omni_replica`` (verl-omni's
    standalone rollout replicas); ValueError naming the key of what that engine cannot do and the fix (on CPU
    ``generator_replicas=false``, verl-omni's pipeline in the generator's process; on CUDA the diffusers engine)."""
    key = f"actor_rollout_ref.rollout.name=vllm_omni on verl-omni's replicas ({REPLICAS_KEY})"
    fix = (f"set {REPLICAS_KEY}=false (verl-omni's pipeline in the generator's process) or "
           "actor_rollout_ref.rollout.name=diffusers" if spec.device == "cpu" else
           "set actor_rollout_ref.rollout.name=diffusers (on CUDA verl-omni's in-process pipeline is not an option)")
    architecture = read_model_index(spec.model_path)["_class_name"]
    if architecture not in REPLICA_ARCHITECTURES:
        raise ValueError(f"actor_rollout_ref.model.path is a {architecture} with {key}: this engine builds the "
                         f"server requests of {list(REPLICA_ARCHITECTURES)} only (verl-omni's rollout pipelines); "
                         f"{fix}")
    if spec.rollout.sde_type not in VERL_OMNI_SDE_KINDS:
        raise ValueError(f"actor_rollout_ref.rollout.algo.sde_type={spec.rollout.sde_type!r} with {key}: verl-omni's "
                         f"rollout samples {sorted(VERL_OMNI_SDE_KINDS)}; use one of them, or {fix}")
    if spec.rollout.timestep_selection != "window":
        raise ValueError(f"actor_rollout_ref.rollout.algo.timestep_selection={spec.rollout.timestep_selection!r} "
                         f"with {key}: verl-omni's rollout samples one SDE window per row; use window, or {fix}")
    return architecture, VERL_OMNI_SDE_KINDS[spec.rollout.sde_type][0]
