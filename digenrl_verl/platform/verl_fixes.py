"""The two places verl 8a69493 takes no hook on a CPU host, patched where verl's CPU platform is loaded.

`verl.utils.distributed.initialize_global_process_group_ray` builds its default backend as
``f"cpu:gloo,{get_device_name()}:{get_nccl_backend()}"``: with verl's platform on the host CPU that is
``cpu:gloo,cpu:gloo``, which torch refuses (``Duplicate device type cpu``), so verl's and verl-omni's stock
``TrainingWorker`` cannot start on CPU (our own trainer ranks build their process group first and never reach it).
The upstream fix (patches/README.md, "verl 8a69493"): one ``cpu:gloo`` when the device is the CPU. Until it
lands, `fix_cpu_process_group_backend` wraps the function in `verl.utils.distributed` as that module is first
imported (`platform.after_import`: right after its code runs, before any worker module imports the name); the wrapper
changes nothing unless the backend is left to verl and the device is the CPU (a CUDA host keeps
``cpu:gloo,cuda:nccl``).

`verl.workers.rollout.vllm_rollout.bucketed_weight_transfer.BucketedWeightReceiver` hands each bucket's tensors to its
callback as views of the transfer buffer, moved with ``tensor.to(device)`` when the buffer is shared memory (no CUDA
IPC): a copy on an accelerator, the same view on the CPU. verl-omni's LoRA receive keeps every bucket's tensors until
``add_lora``, so on the CPU they still point into the shared memory when the receiver closes it (``BufferError: cannot
close exported pointers exist``) and the replica's first LoRA sync fails. `fix_cpu_shm_receive` hands the callback
copies in that one case (CPU device, shared memory), as the accelerator's ``.to`` does; upstream fix in
patches/README.md. It is applied when the module is first imported (`platform.after_import`), so processes that never
receive weights never import verl's rollout package (and vLLM with it)."""

from __future__ import annotations

import functools

PATCHED = "_digenrl_cpu_fix"  # marks a function these fixes wrapped (each is wrapped once per process)
RECEIVER_MODULE = "verl.workers.rollout.vllm_rollout.bucketed_weight_transfer"
PROCESS_GROUP_MODULE = "verl.utils.distributed"


def cpu_backend(backend: str | None, device_name: str) -> str | None:
    """The backend to hand verl's function: ``cpu:gloo`` where verl would build a duplicate for the CPU device."""
    return "cpu:gloo" if backend is None and device_name == "cpu" else backend


def fix_cpu_process_group_backend(distributed) -> None:
    """Wrap `initialize_global_process_group_ray` in ``distributed`` (`verl.utils.distributed`, once per process)."""
    original = distributed.initialize_global_process_group_ray
    if getattr(original, PATCHED, False):
        return

    @functools.wraps(original)
    def initialize_global_process_group_ray(timeout_second=None, backend=None):
        from verl.utils.device import get_device_name

        return original(timeout_second=timeout_second, backend=cpu_backend(backend, get_device_name()))

    setattr(initialize_global_process_group_ray, PATCHED, True)
    distributed.initialize_global_process_group_ray = initialize_global_process_group_ray


def fix_cpu_shm_receive(module) -> None:
    """Wrap `BucketedWeightReceiver.receive_weights` in ``module`` (verl's, once per process): on the CPU with shared
    memory, the callback gets each bucket's tensors as copies."""
    receiver = module.BucketedWeightReceiver
    original = receiver.receive_weights
    if getattr(original, PATCHED, False):
        return

    @functools.wraps(original)
    def receive_weights(self, on_bucket_received):
        if not (self.use_shm and getattr(self.device, "type", str(self.device)) == "cpu"):
            return original(self, on_bucket_received)
        return original(self, lambda weights: on_bucket_received([(name, t.clone()) for name, t in weights]))

    setattr(receive_weights, PATCHED, True)
    receiver.receive_weights = receive_weights
