"""Starting Ray safely: a local cluster on loopback, no dashboard unless asked; or joining a running cluster."""

from __future__ import annotations

import ipaddress
import os
import signal
import socket

from typing import Mapping

import psutil
import ray
from ray._private import ray_constants

from digenrl_verl.platform import process_env
from digenrl_verl.platform.filters import drop_message

#: The address every service of a trainer-started (one-node) Ray instance binds; `DigenRLTrainer.rendezvous` tells
#: such a cluster by its node reporting this address.
LOCAL_NODE_IP = "127.0.0.1"

WORKER_ENV = {
    "TORCH_COMPILE_DISABLE": "1",
    "TORCHINDUCTOR_DISABLE": "1",
    "HF_HUB_OFFLINE": "1",
    "TOKENIZERS_PARALLELISM": "false",
    "RAY_USAGE_STATS_ENABLED": "0",
    "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0",
    # transformers' (and huggingface_hub's) bars, read at import: a worker's bar reaches the console through Ray one
    # refresh per line, and workers download nothing (HF_HUB_OFFLINE); diffusers' are off in `platform.quiet`
    "HF_HUB_DISABLE_PROGRESS_BARS": "1",
}

#: Ray's notice on every trainer-started instance that it enabled token authentication by default (its default
#: since Ray 2.5x; the notice names RAY_AUTH_MODE=disabled, an opt-out of a loopback-only cluster's protection). Ray
#: stays silent when RAY_AUTH_MODE is set before it reads its config, which happens at `import ray`, before any code
#: of ours; so the notice is dropped at its logger, and the cluster keeps Ray's default (token authentication).
RAY_TOKEN_NOTICE = ("ray._private.authentication.authentication_token_setup",
                    "Token authentication is enabled for this Ray cluster")


#: Ray's raylet settings for a trainer-started instance. Ray prestarts `num_cpus` idle worker processes when the first
#: driver connects and `ray.init` waits for them to register; our actors never use them (verl gives each actor its
#: own runtime_env, so each gets a fresh process), so they only cost start-up time and CPU.
LOCAL_SYSTEM_CONFIG = {"prestart_worker_first_driver": False}


def init_local_ray(num_cpus: int | None = None, *, num_gpus: int | None = None, dashboard: bool = False,
                   torch_threads: int = 1, resources: dict[str, float] | None = None, cpu_only: bool = False,
                   extra_env: Mapping[str, str] | None = None) -> None:
    """Start a local Ray instance that listens on 127.0.0.1 only.

    Args:
        num_cpus: logical CPUs Ray may hand out. Worker bundles take 1 each, so tests over-subscribe.
        num_gpus: GPUs Ray may hand out (None: the host's); on a CPU host, Ray's logical GPUs (the devices of
            verl-omni's replicas, `trainer.runner.local_ray_resources`).
        dashboard: start the dashboard (off by default: it opens another port).
        torch_threads: intra-op threads per worker process (OMP_NUM_THREADS), so workers do not fight
            over the cores of a small machine.
        resources: custom resources this node advertises (heterogeneous placement tests).
        cpu_only: every worker process is a CPU one (`trainer.device=cpu`): they get verl's CPU platform
            (`digenrl_verl.platform.process_env`). Worker groups also set it per pool.
        extra_env: more environment variables for every worker process (they win over ours).
    """
    # Ray turns 127.0.0.1 into the machine's routable address unless it believes multi-node clusters are
    # off; a trainer-started cluster is single-node, so keep every Ray service on loopback.
    os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"
    ray_constants.ENABLE_RAY_CLUSTER = False
    env = dict(WORKER_ENV, OMP_NUM_THREADS=str(torch_threads), MKL_NUM_THREADS=str(torch_threads))
    for k, v in env.items():
        os.environ.setdefault(k, v)
    env.update(process_env(cpu=cpu_only), **(extra_env or {}))  # the workers' only: not this process's environment
    drop_message(*RAY_TOKEN_NOTICE)
    # gloo listens on the address this machine's name resolves to (a routable one on most hosts) unless told an
    # interface; the workers of a one-node cluster keep their collectives on loopback too (the caller's value wins)
    gloo_ifname = os.environ.get("GLOO_SOCKET_IFNAME") or loopback_interface()
    if gloo_ifname:
        env["GLOO_SOCKET_IFNAME"] = gloo_ifname
    # ray.init replaces the process's SIGTERM handler with one that aborts; keep the caller's (the trainer
    # checkpoints and flushes its outputs on SIGTERM).
    handlers = {sig: signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGINT)}
    ray.init(
        address="local",
        num_cpus=num_cpus,
        num_gpus=num_gpus,
        resources=resources,
        include_dashboard=dashboard,
        _node_ip_address=LOCAL_NODE_IP,
        runtime_env={"env_vars": env},
        log_to_driver=True,
        logging_level="WARNING",
        _system_config=dict(LOCAL_SYSTEM_CONFIG),
    )
    for sig, handler in handlers.items():
        if handler is not None:
            signal.signal(sig, handler)


def loopback_interface() -> str | None:
    """The name of this machine's loopback network interface (``lo`` on Linux, ``lo0`` on macOS), or None."""
    for name, addrs in psutil.net_if_addrs().items():
        if any(a.family == socket.AF_INET and ipaddress.ip_address(a.address).is_loopback for a in addrs):
            return name
    return None


def connect_ray(address: str, *, torch_threads: int = 1) -> None:
    """Connect this driver to a running Ray cluster (``ray start --head`` on one node, ``ray start
    --address=<head>:6379`` on the others; `address` as ``ray.init`` takes it: ``auto``, ``<head>:6379``).

    The cluster's nodes keep their own resources and addresses (custom resources from ``ray start --resources``
    place the pools, see `workers.pools`); the worker processes get the same environment as on a local instance
    (threads, offline hub, `digenrl_verl.platform.quiet`), except the loopback pin; CPU worker groups select verl's
    CPU platform themselves (their pool's `process_env`).
    """
    env = {k: v for k, v in WORKER_ENV.items() if k != "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"}
    env.update(OMP_NUM_THREADS=str(torch_threads), MKL_NUM_THREADS=str(torch_threads), **process_env(cpu=False))
    handlers = {sig: signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGINT)}
    ray.init(address=address, runtime_env={"env_vars": env}, log_to_driver=True, logging_level="WARNING")
    for sig, handler in handlers.items():
        if handler is not None:
            signal.signal(sig, handler)
