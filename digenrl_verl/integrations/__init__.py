"""The verl-omni bridge, each module imported only when used (this package imports nothing).

- `verl_omni`: DigenRL as verl-omni's v1 trainer mode `digenrl` (config translation, launcher); needs
  verl-omni only for `register()` / `main()`.
- `verl_omni_recipes`: verl-omni's example override lists as data (compatibility tests, docs).

The vLLM-Omni rollout engine lives with the other engines (`digenrl_verl.engines.vllm_omni`), the 8 + 8
heterogeneous-cluster report with the simulator (`digenrl_verl.sim.hetero`). Only entry points import this
package. See docs/verl_omni.md for what has run where.
"""
