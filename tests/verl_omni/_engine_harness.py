"""What the verl-omni tier's engine tests share (test_verl_omni_tsp_engine.py, test_verl_omni_accumulating_worker.py).

Both build verl-omni engines / workers from its Hydra configs on the CPU platform (gloo, fp32), from the same tiny
Qwen-Image directory, and run each case in a fresh process: the test file itself as a script (the platform must
be chosen before verl is imported), forking the gloo ranks for world size > 1, the report written as JSON. The
process is forked by `_case_server.py`, one interpreter per test session that imported verl-omni once (~20 s a
case saved); `DIGENRL_CASE_SERVER=0` runs each case in its own fresh interpreter instead, as `python <script>`.

A plain module, not a package or conftest: each test file puts this folder on sys.path (pytest's importlib mode does
not; a script's own folder is already there). Nothing here imports verl or torch at import time.
"""

from __future__ import annotations

import atexit
import json
import os
import re
import select
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from digenrl_verl.integrations.verl_omni_recipes import STAND_IN_REWARD  # noqa: F401  (the tests import it here)

ROOT = Path(__file__).resolve().parents[2]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


# ---------------------------------------------------------------- in the fresh interpreter

def run_main(worker, argv: list[str]) -> None:
    """The script's entry: `worker(rank, world, port, args)` for the JSON args, in this process for world size 1,
    else on `world` spawned ranks."""
    args = json.loads(argv[0])
    world, port = args["world"], free_port()
    if world == 1:
        worker(0, 1, port, args)
        return
    import torch.multiprocessing as mp

    # forked, not spawned: the ranks start from this process's imports (it has no thread running yet)
    mp.start_processes(worker, args=(world, port, args), nprocs=world, join=True, start_method="fork")


def init_gloo(rank: int, world: int, port: int, **env: str) -> None:
    """This rank's environment (plus `env`), one torch thread, the gloo group (started before any engine)."""
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), LOCAL_RANK=str(rank),
                      WORLD_SIZE=str(world), **env)
    import torch

    torch.set_num_threads(1)
    torch.distributed.init_process_group("gloo", rank=rank, world_size=world)


def finish_rank(rank: int, args: dict, report: dict) -> None:
    """Rank 0 writes the report to args["out"] (JSON); every rank leaves the gloo group."""
    import torch

    if rank == 0:
        Path(args["out"]).write_text(json.dumps(report))
    torch.distributed.destroy_process_group()


def hydra_configs(model_dir: str, *, lora: bool, loss_mode: str, num_steps: int, height: int, micro: int,
                  world: int, optim: list[str], sde_type: str = "sde", true_cfg_scale: float = 1.0,
                  clip_ratio: float | None = 0.2, model_extra: tuple[str, ...] = (),
                  actor_extra: tuple[str, ...] = ()):
    """verl-omni's model and actor configs (its Hydra files) for the tiny model: fsdp2, fp32, `optim` overrides.
    `clip_ratio` None keeps verl-omni's default (1e-4); `model_extra` / `actor_extra`: more overrides."""
    import verl_omni
    from hydra import compose, initialize_config_dir
    from verl.utils.config import omega_conf_to_dataclass

    config_root = Path(verl_omni.__file__).parent / "trainer" / "config" / "diffusion"
    model_overrides = [f"path={model_dir}", f"tokenizer_path={model_dir}/tokenizer", f"lora_rank={8 if lora else 0}",
                       "lora_alpha=16", f"pipeline.height={height}", f"pipeline.width={height}",
                       f"pipeline.num_inference_steps={num_steps}", f"pipeline.true_cfg_scale={true_cfg_scale}",
                       "algo.noise_level=1.2", f"algo.sde_type={sde_type}", "attn_backend=native",
                       "enable_gradient_checkpointing=False", *model_extra]
    with initialize_config_dir(config_dir=str(config_root / "model"), version_base=None):
        model_config = omega_conf_to_dataclass(compose(config_name="diffusion_model", overrides=model_overrides))
    clip = [] if clip_ratio is None else [f"diffusion_loss.clip_ratio={clip_ratio}"]
    actor_overrides = ["strategy=fsdp2", f"diffusion_loss.loss_mode={loss_mode}", *clip,
                       "diffusion_loss.adv_clip_max=5.0", f"ppo_mini_batch_size={micro * 2}",
                       f"ppo_micro_batch_size_per_gpu={micro}", *optim, "fsdp_config.model_dtype=fp32",
                       "fsdp_config.dtype=float32", "+fsdp_config.mixed_precision.param_dtype=fp32",
                       f"fsdp_config.fsdp_size={world}", *actor_extra]
    with initialize_config_dir(config_dir=str(config_root / "actor"), version_base=None):
        actor_config = omega_conf_to_dataclass(compose(config_name="dp_diffusion_actor", overrides=actor_overrides))
    return model_config, actor_config


def rollout_batch(model_config, rows: int, seed: int, *, num_steps: int, height: int, random_old: bool):
    """A rollout batch in verl-omni's layout (as its own engine test builds one), without the non-tensor meta.
    `random_old`: old log-probs and SDE means drawn at random (else zero log-probs and no means)."""
    import torch
    from tensordict import TensorDict
    from verl_omni.pipelines.utils import build_scheduler
    from verl_omni.workers.utils.padding import embeds_padding_2_no_padding

    tconf = json.loads((Path(model_config.local_path) / "transformer" / "config.json").read_text())
    tokens, dim, text = (height // 16) ** 2, tconf["in_channels"], tconf["joint_attention_dim"]
    g = torch.Generator().manual_seed(seed)
    timesteps = build_scheduler(model_config).timesteps[:num_steps].float()[None].repeat(rows, 1)
    latents = torch.randn(rows, num_steps + 1, tokens, dim, generator=g)
    fields = {
        "old_log_probs": (torch.randn(rows, num_steps, generator=g) * 0.1 if random_old
                          else torch.zeros(rows, num_steps)),
        "advantages": torch.randn(rows, num_steps, generator=g),
        "all_latents": latents, "all_timesteps": timesteps,
    }
    if random_old:
        fields["old_prev_sample_mean"] = latents[:, 1:] + 0.01 * torch.randn(rows, num_steps, tokens, dim,
                                                                             generator=g)
    fields.update({
        "prompt_embeds": torch.randn(rows, 7, text, generator=g),
        "prompt_embeds_mask": torch.ones(rows, 7, dtype=torch.int32),
        "negative_prompt_embeds": torch.randn(rows, 7, text, generator=g),
        "negative_prompt_embeds_mask": torch.ones(rows, 7, dtype=torch.int32),
    })
    return embeds_padding_2_no_padding(TensorDict(fields, batch_size=rows))


def video_rollout_batch(model_config, rows: int, seed: int, *, steps: range, height: int, frames: int):
    """A rollout batch in verl-omni's layout for a Wan-style video transformer (latents (B, C, F, H, W) per step,
    as its wan22_dance_grpo rollout records an SDE window): only the window `steps` of the scheduler's timesteps,
    latents for those steps and the one after; old log-probs zero (set them with `near_policy`)."""
    import torch
    from tensordict import TensorDict
    from verl_omni.pipelines.utils import build_scheduler
    from verl_omni.workers.utils.padding import embeds_padding_2_no_padding

    tconf = json.loads((Path(model_config.local_path) / "transformer" / "config.json").read_text())
    channels, text = tconf["in_channels"], tconf["text_dim"]
    latent_frames, side = (frames - 1) // 4 + 1, height // 8  # the Wan VAE: 4x in time, 8x in space
    g = torch.Generator().manual_seed(seed)
    timesteps = build_scheduler(model_config).timesteps[steps.start:steps.stop].float()[None].repeat(rows, 1)
    window = len(steps)
    fields = {
        "old_log_probs": torch.zeros(rows, window), "advantages": torch.randn(rows, window, generator=g),
        "all_latents": torch.randn(rows, window + 1, channels, latent_frames, side, side, generator=g),
        "all_timesteps": timesteps,
        "prompt_embeds": torch.randn(rows, 7, text, generator=g),
        "prompt_embeds_mask": torch.ones(rows, 7, dtype=torch.int32),
        "negative_prompt_embeds": torch.randn(rows, 5, text, generator=g),
        "negative_prompt_embeds_mask": torch.ones(rows, 5, dtype=torch.int32),
    }
    return embeds_padding_2_no_padding(TensorDict(fields, batch_size=rows))


def with_meta(td, *, micro: int, height: int, **extra):
    """A copy of `td` with the non-tensor meta verl-omni's engine reads (plus `extra`)."""
    from verl.utils import tensordict_utils as tu

    td = td.clone()
    tu.assign_non_tensor(td, micro_batch_size_per_gpu=micro, height=height, width=height, vae_scale_factor=8,
                         **extra)
    return td


def near_policy(engine, td, inputs, seed: int, noise: float = 0.05) -> None:
    """Old log-probs / SDE means in `td` = the current policy's on `inputs` (`td` ready for the engine) plus a
    little noise (`noise` on the log-probs): ratios near 1, few rows clipped at clip_ratio 0.2, so (nearly) every
    row and step carries gradient."""
    import torch

    with torch.no_grad(), engine.eval_mode():
        out = engine.forward_backward_batch(inputs, None, forward_only=True)["model_output"]
    g = torch.Generator().manual_seed(seed)
    td["old_log_probs"] = out["log_probs"] + noise * torch.randn(out["log_probs"].shape, generator=g)
    mean = out["prev_sample_mean"]
    td["old_prev_sample_mean"] = mean + 0.01 * torch.randn(mean.shape, generator=g)


def full_tensor(t):
    """The whole tensor of a (possibly sharded) DTensor."""
    from torch.distributed.tensor import DTensor

    return t.full_tensor() if isinstance(t, DTensor) else t


def same_weights(engines, lora: bool) -> None:
    """Copy the first engine's weights into the others; LoRA: both factors set to the same seeded values."""
    import torch
    from torch.distributed.tensor import DTensor, distribute_tensor

    g = torch.Generator().manual_seed(123)
    named = [dict(e.module.named_parameters()) for e in engines]
    for name, ref in named[0].items():
        full = full_tensor(ref).detach().clone()
        if lora and "lora_" in name:
            full = torch.randn(full.shape, generator=g, dtype=full.dtype) * 0.05
        for params in named:
            p = params[name]
            value = distribute_tensor(full, p.device_mesh, p.placements) if isinstance(p, DTensor) else full
            with torch.no_grad():
                p.copy_(value)


def trainable_params(engine) -> dict:
    """{name: a copy of the whole tensor} of the engine's trainable parameters."""
    return {n: full_tensor(p).detach().clone() for n, p in engine.module.named_parameters() if p.requires_grad}


def rel(a: dict, b: dict) -> float:
    """max over tensors of max |a - b| / max |b| (the same names in both)."""
    assert a.keys() == b.keys() and a, (sorted(a)[:3], sorted(b)[:3])
    return max(float((a[n] - b[n]).abs().max() / b[n].abs().max().clamp_min(1e-30)) for n in b)


# ---------------------------------------------------------------- in the test process

def tiny_qwen_dir(tmp_path_factory, name: str) -> str:
    from digenrl_verl.models.tiny import build_tiny_model_dir

    return str(build_tiny_model_dir("QwenImagePipeline", tmp_path_factory.mktemp(name) / "qwen", seed=0))


def cpu_env(**extra: str) -> dict:
    """The environment of a fresh interpreter on verl's CPU platform (our platform module, the repo importable)."""
    return {**os.environ, "VERL_PLATFORM": "cpu", "VERL_USE_EXTERNAL_MODULES": "digenrl_verl.platform.cpu",
            "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]), **extra}


#: what the case server imports once (what every engine case imports before its first engine)
PRELOAD = ("torch", "verl", "verl_omni", "hydra", "tensordict", "verl.workers.config", "verl.utils.tensordict_utils",
           "verl_omni.workers.engine_workers", "verl_omni.workers.utils.losses", "verl_omni.pipelines.utils",
           "_engine_harness")
_server: subprocess.Popen | None = None


def _case_server() -> subprocess.Popen:
    """The session's case server (`_case_server.py`), started on first use with the cases' environment."""
    global _server
    if _server is None or _server.poll() is not None:
        log = open(Path(tempfile.gettempdir()) / f"digenrl-case-server-{os.getpid()}.log", "w")  # noqa: SIM115
        _server = subprocess.Popen([sys.executable, str(Path(__file__).with_name("_case_server.py")), *PRELOAD],
                                   env=cpu_env(OMP_NUM_THREADS="1"), cwd=str(ROOT), stdin=subprocess.PIPE,
                                   stdout=subprocess.PIPE, stderr=log, bufsize=0)  # unbuffered: select sees every line
        atexit.register(_server.kill)
        ready = _server.stdout.readline()
        assert ready, f"the case server did not start: {Path(log.name).read_text()[-4000:]}"
    return _server


def _answer(server: subprocess.Popen, timeout: float) -> dict:
    if not select.select([server.stdout], [], [], timeout)[0]:
        raise TimeoutError(f"no answer from the case server in {timeout:.0f} s")
    line = server.stdout.readline()  # a raw pipe reads up to the newline, never past it
    assert line, "the case server died"
    return json.loads(line)


def _run_forked(script: str, argv: list[str], log: Path, timeout: float) -> tuple[int, str]:
    """`python script *argv` in a process forked from the case server; its exit code and console."""
    server = _case_server()
    server.stdin.write(json.dumps({"script": script, "argv": argv, "log": str(log)}).encode() + b"\n")
    pid = _answer(server, 60)["pid"]
    try:
        rc = _answer(server, timeout)["rc"]
    except TimeoutError:
        os.killpg(pid, signal.SIGKILL)
        rc = _answer(server, 60)["rc"]
    return rc, log.read_text()


def _run_case(script: str, argv: list[str], log: Path, timeout: float) -> str:
    """`python script *argv` on verl's CPU platform (one thread per rank), forked from the case server, or in a fresh
    interpreter with DIGENRL_CASE_SERVER=0; its console, which must end with status 0."""
    if os.environ.get("DIGENRL_CASE_SERVER", "1") == "0":
        proc = subprocess.run([sys.executable, script, *argv], env=cpu_env(OMP_NUM_THREADS="1"), cwd=str(ROOT),
                              capture_output=True, text=True, timeout=timeout)
        rc, console = proc.returncode, proc.stdout + proc.stderr
    else:
        rc, console = _run_forked(script, argv, log, timeout)
    assert rc == 0, failure_summary(console)
    return console


def run_script(script: str, args: dict, label: str, timeout: float = 900) -> dict:
    """`python <script> <json args>` (`_run_case`); the report it wrote to args["out"], printed."""
    start = time.time()
    _run_case(script, [json.dumps(args)], Path(args["out"]).with_suffix(".log"), timeout)
    report = json.loads(Path(args["out"]).read_text())
    print(f"\n{label}: {report} ({time.time() - start:.1f} s)")
    return report


def run_code(code: str, timeout: float = 600, **env: str) -> str:
    """`python -c <code>` with `env` set before it runs (`_run_case`); its console."""
    work = Path(tempfile.mkdtemp(prefix="digenrl-case-"))
    (work / "case.py").write_text(f"import os\nos.environ.update({env!r})\n{code}")
    return _run_case(str(work / "case.py"), [], work / "case.log", timeout)


_ERROR_LINE = re.compile(r"\b\w*(Error|Exception|Timeout)\b[:(]")


def failure_summary(console: str, tail: int = 4000) -> str:
    """A failed run's console for an assertion message: its distinct error lines first (a Ray traceback's root cause
    sits far above its tail, which CI's log cuts), then the last `tail` characters."""
    seen = list(dict.fromkeys(line.strip() for line in console.splitlines() if _ERROR_LINE.search(line)))
    return "error lines:\n" + "\n".join(seen[:25]) + f"\n--- last {tail} characters:\n" + console[-tail:]
