"""The verl-omni bridge, each module imported only when used (this package imports nothing).

- `verl_omni`: DigenRL inside verl-omni: the external trainer `digenrl` of its entry points (with the upstream
  series in patches/verl-omni-a1139baf/: `trainer.trainer_class=digenrl`, entry-point group `verl_omni.trainers`)
  and the v1 trainer mode `digenrl` of an unpatched verl-omni (config translation, launcher); needs verl-omni
  only for `register()` / `main()`.
- `verl_omni_recipes`: verl-omni's example override lists as data (compatibility tests, docs).

- `verl_omni_replica` / `verl_omni_rollout`: the generators on verl-omni's rollout (`rollout.name=vllm_omni`): its
  standalone replicas, or its registered pipeline in the generator's process (CPU); bound in `engines.base.ENGINES`
  and imported on first use.

The 8 + 8 heterogeneous-cluster report with the simulator (`digenrl_verl.sim.hetero`). Only entry points import this
package. See docs/verl_omni.md for what has run where.
"""
