"""Rollout engines: what samples trajectories for a generator rank (below the workers, above the models).

- `base`: the `RolloutEngine` Protocol, `RolloutRows` / `Rollout`, and `ENGINES` (engine names with what they
  need, checked without importing a backend; classes bound by the backend modules);
- `spec`: `PolicySpec` and `RolloutEngineSpec` (`actor_rollout_ref.rollout.name` validated here);
- `diffusers`: the policy in this process (generators, and trainers for TAG);
- verl-omni's rollout (`rollout.name=vllm_omni`) is bound from `integrations` on first use (`ENGINES` entries
  `verl_omni_replica`, `verl_omni`: a backend above this layer).

This package's `__init__` imports nothing, so `engines.base` and `engines.spec` never pull in a backend.
"""
