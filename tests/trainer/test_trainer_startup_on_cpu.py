"""Start-up (issue 13 item 6): where the time from the command to the first step goes, and what a trainer-started Ray
instance does at `ray.init`.

- `DigenRLTrainer.startup_phases` turns the driver's and the workers' wall-clock marks into the phases that
  `summary.json` (`startup/*`) and `python -m digenrl_verl.bench e2e` report;
- `init_local_ray` starts Ray without prestarting idle worker processes (Ray's default prestarts `num_cpus` of them
  when the first driver connects and `ray.init` waits for them; verl's actors never use them: each actor carries its
  own runtime_env, so each gets a fresh process).
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest

from digenrl_verl.bench import e2e
from digenrl_verl.main import TINY_CPU, compose
from digenrl_verl.trainer.config import build_run
from digenrl_verl.trainer.runner import DigenRLTrainer
from digenrl_verl.workers import roles


def test_startup_phases_from_driver_and_worker_marks(tiny_flux_dir, tmp_path):
    cfg = compose([TINY_CPU, f"actor_rollout_ref.model.path={tiny_flux_dir}", f"trainer.digenrl.output_dir={tmp_path}",
                   "trainer.digenrl.mode=disaggregated"])
    trainer = DigenRLTrainer(build_run(cfg))
    p = roles.process_start()
    trainer.marks.update(fit_start=p + 5.0, ray_ready=p + 8.0, submitted_generator=p + 9.0, submitted_trainer=p + 9.5,
                         workers_submitted=p + 9.5, joined=p + 20.0, train_start=p + 20.1, first_step=p + 21.0)
    # gen:0 got a fresh process 0.5 s after its pool's submission; trn:0 a process that Ray had started 3 s before
    # its submission (prestarted): its spawn is 0 and its imports count from the submission
    trainer.worker_startup = {
        "gen:0": {"process_start": p + 9.5, "imported": p + 14.5, "init_start": p + 14.7, "model_loaded": p + 17.7,
                  "init_end": p + 17.8, "join_start": p + 19.0, "join_end": p + 19.5},
        "trn:0": {"process_start": p + 6.5, "imported": p + 15.5, "init_start": p + 15.6, "model_loaded": p + 18.6,
                  "init_end": p + 18.6, "join_start": p + 19.0, "join_end": p + 19.9},
    }
    s = trainer.startup_phases()
    expect = {"driver_start_s": 5.0, "ray_init_s": 3.0, "pools_s": 1.5, "workers_ready_s": 10.5, "first_step_s": 0.9,
              "time_to_first_step_s": 21.0, "fit_to_first_step_s": 16.0,
              "worker_spawn_s": 0.5, "worker_boot_imports_s": 6.0, "worker_actor_init_wait_s": 0.2,
              "model_load_s": 3.0, "worker_init_rest_s": 0.1, "group_join_s": 0.9}
    assert {k: s[k] for k in expect} == pytest.approx(expect, abs=1e-6)
    assert s["per_worker"]["trn:0"]["worker_spawn_s"] == 0.0
    assert s["critical_worker"] == "trn:0"


def test_startup_bench_flags_exclude_each_other(capsys):
    with pytest.raises(SystemExit) as e:
        e2e.main(["--startup-only", "--no-startup"])
    assert e.value.code == 2 and "--startup-only and --no-startup exclude each other" in capsys.readouterr().err


_COUNT_IDLE_WORKERS = textwrap.dedent("""
    import json, sys, time
    import psutil, ray
    from ray._private import ray_constants
    from digenrl_verl.trainer import ray_runtime

    if sys.argv[1] == "ray-default":
        ray_runtime.LOCAL_SYSTEM_CONFIG = {}
    ray_runtime.init_local_ray(num_cpus=2)
    node = ray._private.worker._global_node
    raylet = psutil.Process(node.all_processes[ray_constants.PROCESS_TYPE_RAYLET][0].process.pid)

    def workers():  # a worker process runs default_worker.py, which renames itself ray::IDLE once connected
        cmds = [" ".join(p.cmdline()) for p in raylet.children(recursive=True)]
        return sum("default_worker.py" in c or c.startswith("ray::IDLE") for c in cmds)

    at_init = workers()
    time.sleep(2.0)
    print(json.dumps({"at_init": at_init, "after_2s": workers()}))
    ray.shutdown()
""")


@pytest.mark.slow
@pytest.mark.parametrize("config", ["trainer", "ray-default"])
def test_startup_a_trainer_started_ray_prestarts_no_idle_worker(config):
    """The trainer's Ray instance has no worker process until an actor asks for one; Ray's default (the control,
    `LOCAL_SYSTEM_CONFIG` emptied) has its prestarted ones by the time `ray.init` returns."""
    out = subprocess.run([sys.executable, "-c", _COUNT_IDLE_WORKERS, config], capture_output=True, text=True,
                         timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    counts = json.loads(out.stdout.strip().splitlines()[-1])
    if config == "trainer":
        assert counts == {"at_init": 0, "after_2s": 0}
    else:
        assert counts["at_init"] >= 1, counts
