"""The trainable weights between processes and on disk, below the workers and the rollout engines.

- `sync`: the process groups spanning both pools (gradient all-reduce over the trainer ranks, weight broadcast
  trainer rank 0 → each generator), and the weights checksum.
- `state`: a trainer's weights, optimizer moments and RNG as safetensors files (checkpoints, resume).

Imports nothing of the project (torch and safetensors only), so workers, engines and the trainer may use it.
"""
