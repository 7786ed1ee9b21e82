"""What our processes load into verl, and the environment that makes them load it.

- `cpu` (+ `cpu_device`): verl's platform for the host CPU, registered as ``cpu``; selected in CPU worker processes
  by ``VERL_PLATFORM=cpu`` and in a CPU-only run's driver by `select_cpu_platform`. GPU processes never select it.
- `quiet`: silences, at their sources, the worker notices a user cannot act on (transformers' torchvision fallback
  notice, diffusers' pipeline-loading bars); imported by every worker process.

Both reach a worker process through verl's own hook for external modules: ``VERL_USE_EXTERNAL_MODULES``, which
`import verl` imports before anything asks for the platform (verl 0.9.1 and verl 8a69493 alike). `process_env` is the
environment a worker process gets (the trainer-started Ray instance's, and each worker group's).

On CPU it also pins MKL's results to the operands' values (``MKL_CBWR=AUTO,STRICT``, `MKL_CBWR_VAR`): by default
MKL's sgemm rounds differently with the operands' memory alignment (measured with torch 2.13's MKL 2024.2 on an AMD
EPYC host: a 2x64 @ 64x64 product moved by 2.9e-6 when the weight started 4 bytes off a 16-byte boundary), and
FSDP2's all-gathered flat buffers place a parameter at any offset, so a sharded trainer rank's forward did not equal
a generator's on the same weights (`trainer.digenrl.rows_alone`'s bit-identity). A value the caller set is kept.
"""

from __future__ import annotations

import os
from typing import Mapping

CPU_PLATFORM_MODULE = "digenrl_verl.platform.cpu"
QUIET_MODULE = "digenrl_verl.platform.quiet"
EXTERNAL_MODULES_VAR = "VERL_USE_EXTERNAL_MODULES"
PLATFORM_VAR = "VERL_PLATFORM"
MKL_CBWR_VAR = "MKL_CBWR"
#: MKL's conditional numerical reproducibility: the code path the CPU picks, strict about alignment (costs nothing
#: measurable at the tiny sizes here: 64x256 @ 256x256 and 1024x512 @ 512x512 products, one thread)
MKL_CBWR_STRICT = "AUTO,STRICT"


def process_env(*, cpu: bool, environ: Mapping[str, str] = os.environ) -> dict[str, str]:
    """Environment variables of a worker process: `QUIET_MODULE` (and, on CPU, `CPU_PLATFORM_MODULE` with
    ``VERL_PLATFORM=cpu`` and ``MKL_CBWR``) appended to the modules `environ` already names in
    ``VERL_USE_EXTERNAL_MODULES``."""
    modules = [m.strip() for m in environ.get(EXTERNAL_MODULES_VAR, "").split(",") if m.strip()]
    for module in (QUIET_MODULE, *((CPU_PLATFORM_MODULE,) if cpu else ())):
        if module not in modules:
            modules.append(module)
    env = {EXTERNAL_MODULES_VAR: ",".join(modules)}
    if cpu:
        env[PLATFORM_VAR] = "cpu"
        env[MKL_CBWR_VAR] = environ.get(MKL_CBWR_VAR) or MKL_CBWR_STRICT
    return env


def select_cpu_platform() -> None:
    """Make the CPU platform this process's verl platform (the driver of a run whose workers are all CPU processes).

    Before verl resolved its platform: silently. After (something already asked, and got verl's fallback): verl's
    `set_platform` replaces it and says so. This process's environment is left as it is."""
    from verl.plugin.platform import platform_manager, set_platform

    from digenrl_verl.platform.cpu import PlatformCPU

    if not isinstance(getattr(platform_manager, "_current_platform", None), PlatformCPU):
        set_platform(PlatformCPU())
