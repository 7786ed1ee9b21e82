"""Integrations with neighbouring projects, each imported only when used (this package imports nothing).

- `verl_omni`: DigenRL as verl-omni's v1 trainer mode `digenrl` (config translation, launcher); needs
  verl-omni only for `register()` / `main()`.
- `verl_omni_recipes`: verl-omni's example override lists as data (compatibility tests, docs).
- `vllm_omni`: the vLLM-Omni generator backend (`actor_rollout_ref.rollout.name=vllm_omni`); importing it is
  safe on CPU, vLLM itself is only imported on CUDA machines.
- `hetero_sim`: the 8 + 8 two-kind cluster in the simulator (`python -m digenrl_verl.integrations.hetero_sim`).

See docs/verl_omni.md for what has run where.
"""
