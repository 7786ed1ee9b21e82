"""DigenRL through verl-omni's OWN entry points, each handing our trainer the config verl-omni composed:
`python -m verl_omni.trainer.main_diffusion_v1 ... trainer.use_v1=true trainer.v1.trainer_mode=digenrl` (unpatched:
the trainer mode is registered by our `verl.plugins` entry point) and `python -m verl_omni.trainer.main_diffusion
... trainer.trainer_class=digenrl` (v0, with the upstream hook patches/verl-omni-a1139baf/ applied).

scripts/test_verl_omni.sh installs the patched verl-omni and the plugin's entry points (groups verl_omni.trainers
and verl.plugins) into `.venv-verl-omni`; without verl-omni, or with an unpatched one, these tests skip.

* the plugin is an installed external trainer whose section `trainer.digenrl` composes with no Hydra `+` (v0), and
  `import verl` registers the v1 trainer mode `digenrl` in a fresh process (not with verl's plugins off);
* verl-omni's 29 FlowGRPO / DanceGRPO example scripts with the flag and a dry run: the v0 ones through verl-omni's
  `main_diffusion`, the v1 ones through `python -m digenrl_verl.integrations.verl_omni` (verl-omni's v1
  composition and `run_diffusion_v1`, checked before Ray starts); each is accepted or rejected by a message naming
  the key or model, none fails in Hydra or with a traceback. The entry points' `main` runs in a process forked from
  one that imported verl-omni once (as `python -m` would run it, without paying verl-omni's import 58 times);
* tiny-model twins of the FlowGRPO SD3.5 v1 recipe (through verl-omni's own unpatched `main_diffusion_v1`, its Ray
  task runner and TransferQueue), the Qwen-Image v0 and the DanceGRPO Wan2.2 v0 recipes (`main_diffusion`) train one
  real step on CPU as written (`rollout.name=vllm_omni`: generators on verl-omni's rollout pipelines, trainers on its
  actor worker), and verl-omni's stock worker resumes their checkpoints.
"""

from __future__ import annotations

import importlib
import importlib.util
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

try:
    import verl_omni  # noqa: F401  (imports vLLM-Omni eagerly)
except ImportError as e:
    pytest.skip(f"verl_omni is not importable here ({e}); run bash scripts/test_verl_omni.sh", allow_module_level=True)
try:
    from verl_omni.trainer import external_trainer
except ImportError:
    pytest.skip("this verl-omni lacks the external-trainer hook (patches/verl-omni-a1139baf/); bash "
                "scripts/test_verl_omni.sh applies it", allow_module_level=True)

from hydra import compose as hydra_compose  # noqa: E402
from hydra import initialize_config_dir  # noqa: E402
from hydra.core.config_store import ConfigStore  # noqa: E402
from hydra.core.global_hydra import GlobalHydra  # noqa: E402
from omegaconf import OmegaConf  # noqa: E402

from digenrl_verl.integrations.verl_omni import (  # noqa: E402
    ENTRY_POINT_NAME,
    TRAINER_MODE,
    DigenRLDiffusionTrainer,
)
from digenrl_verl.integrations.verl_omni_recipes import RECIPES  # noqa: E402

if str(Path(__file__).resolve().parent) not in sys.path:  # pytest's importlib mode leaves this folder out
    sys.path.append(str(Path(__file__).resolve().parent))
from _engine_harness import STAND_IN_REWARD, failure_summary, run_script  # noqa: E402
from _upstream import VERL_OMNI_ARCHIVE, require  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
ARCHIVE = VERL_OMNI_ARCHIVE
CONFIG_DIR = str(Path(verl_omni.__file__).parent / "trainer" / "config")
SELECT = f"trainer.trainer_class={ENTRY_POINT_NAME}"  # v0
SELECT_V1 = ("trainer.use_v1=true", f"trainer.v1.trainer_mode={TRAINER_MODE}")
HANDED = "digenrl_verl runs the config verl-omni composed"
#: what a v1 command line needs on a 2-core machine: Ray may hand out more CPUs than it sees (our task runner, our
#: pools), and verl-omni's TransferQueue with one storage unit (it starts 8 CPU actors by default)
V1_CPU = ("ray_kwargs.ray_init.num_cpus=16", "transfer_queue.backend.SimpleStorage.num_data_storage_units=1")


def _replay_module():
    spec = importlib.util.spec_from_file_location("replay_verl_omni_recipes",
                                                  ROOT / "scripts" / "replay_verl_omni_recipes.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def _verl_omni_config(overrides):
    GlobalHydra.instance().clear()
    try:
        with initialize_config_dir(config_dir=CONFIG_DIR, version_base=None):
            return hydra_compose(config_name="diffusion_trainer", overrides=overrides)
    finally:
        GlobalHydra.instance().clear()


def test_the_plugin_is_an_installed_external_trainer_with_its_section():
    assert ENTRY_POINT_NAME in external_trainer.installed_external_trainers()
    assert external_trainer.load_external_trainer(ENTRY_POINT_NAME) is DigenRLDiffusionTrainer
    try:
        assert ENTRY_POINT_NAME in external_trainer.register_plugin_configs()
        cfg = _verl_omni_config([SELECT, "trainer.digenrl.mode=colocated", "trainer.digenrl.tsp.chunk_size=2"])
        with pytest.raises(Exception, match="not_a_key"):  # closed to unknown keys, as on our entry point
            _verl_omni_config(["trainer.digenrl.not_a_key=1"])
    finally:
        ConfigStore.instance().repo.pop(external_trainer.PLUGIN_CONFIG_GROUP, None)
    assert cfg.trainer.trainer_class == ENTRY_POINT_NAME
    assert cfg.trainer.digenrl.mode == "colocated" and cfg.trainer.digenrl.tsp.chunk_size == 2
    assert cfg.trainer.digenrl.dry_run is False  # our section's defaults, typed (a structured node)
    assert "digenrl" not in _verl_omni_config([]).trainer  # no section while no plugin config is registered


_LOOKUP = ("from verl_omni.trainer.diffusion.v1 import get_diffusion_trainer_cls as get\n"
           "try:\n    print('mode:', get('digenrl').__qualname__)\nexcept ValueError as e:\n    print('mode:', e)\n"
           "import verl_omni.workers.engine.fsdp.diffusers_impl\n"
           "from verl.workers.engine.base import EngineRegistry\n"
           "print('engine:', EngineRegistry.get_engine_cls('diffusion_model', 'fsdp2').__qualname__)\n")


@pytest.mark.slow
def test_import_verl_registers_the_v1_trainer_mode_in_a_fresh_process():
    """verl loads our `verl.plugins` entry point in every process that imports it; verl-omni's registry module,
    once imported, holds `digenrl` (what DiffusionTaskRunnerV1 looks up), and verl's engine registry our TSP engine
    (vendor digenrl_tsp) once verl-omni's FSDP diffusion engine is imported. With verl's plugins off neither."""
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "VERL_ENGINE_DEVICE": "cuda", "VERL_ENGINE_VENDOR": "digenrl_tsp"}
    on = subprocess.run([sys.executable, "-c", _LOOKUP], env=env, capture_output=True, text=True, timeout=600)
    off = subprocess.run([sys.executable, "-c", _LOOKUP], env={**env, "VERL_USE_EXTERNAL_PLUGINS": "none"},
                         capture_output=True, text=True, timeout=600)
    assert "mode: DigenRLDiffusionTrainer" in on.stdout, on.stdout[-2000:] + on.stderr[-2000:]
    assert "engine: TSPDiffusersFSDPEngine" in on.stdout  # importing verl-omni's engine registered ours beside it
    assert "mode: Unknown diffusion trainer 'digenrl'" in off.stdout, off.stdout[-2000:]
    assert "engine: PPODiffusersFSDPEngine" in off.stdout  # verl's plugins off: the vendor finds nothing of ours


# ------------------------------------------------------------------------------------------ entry points, forked
#: v1 scripts run through our v1 main: verl-omni's composition and run_diffusion_v1, the config checked before Ray
V1_MAIN = "digenrl_verl.integrations.verl_omni"


def _flagged(entry: str, localised: list[str]) -> list[str]:
    """The replay's flag as each entry point takes it: v0, `trainer.trainer_class=digenrl` (our section composes);
    v1, the trainer mode instead of `trainer.digenrl.mode` (our v1 main adds Hydra's `+` to our section's keys)."""
    if not entry.endswith("_v1"):
        return [*localised, SELECT]
    return [*(o for o in localised if not o.startswith("trainer.digenrl.mode=")), *SELECT_V1]


#: entry-point runs at once in the replay fixture (each a forked dry run: 2 halve its time on a 2-core machine)
ENTRY_POINT_JOBS = min(2, os.cpu_count() or 1)


@pytest.fixture(scope="module")
def replayed(tmp_path_factory):
    """Every example script through the entry point it calls, with the flag and a dry run: as shipped, and with
    the overrides that switch on unsupported features dropped (the replay script's --drop-unsupported)."""
    require(ARCHIVE)
    replay = _replay_module()
    work = tmp_path_factory.mktemp("replay_entry")
    repo = replay.extract(ARCHIVE, work / "src")
    prompts = work / "prompts.txt"
    # 1024 prompts: verl-omni's dataloader drops a partial batch, so an epoch needs a batch's worth (as the replay)
    prompts.write_text("".join(f'a photo of the word "hello {i}"\n' for i in range(1024)))
    scripts = sorted(p for t in replay.TRAINERS for p in (repo / "examples" / t).rglob("*.sh"))
    rows = {"as shipped": [], "unsupported dropped": []}
    running = []  # (row, forked): ENTRY_POINT_JOBS at once, each a forked child (the rows keep the scripts' order)

    def finish(row, forked):
        proc = forked.result()
        row["result"], row["detail"] = replay.classify(proc)
        row["handed_over"] = HANDED in proc.stdout + proc.stderr

    for i, script in enumerate(scripts):
        rel = str(script.relative_to(repo / "examples"))
        calls = replay.capture(script, repo, work)
        assert len(calls) == 1, f"{rel}: {len(calls)} verl-omni calls captured"
        entry, overrides = calls[0][1], calls[0][2:]
        arch, tiny, model_path = replay.model_of(overrides)
        model_dir = replay.stand_in_model(arch, tiny, work / "models")
        for variant in rows:
            given = overrides
            if variant == "unsupported dropped":
                given, _ = replay.drop_unsupported(overrides)
                upstream, _ = replay.upstream_compose(given, repo / "verl_omni" / "trainer" / "config")
                if upstream != "ok":  # not a verl-omni command line any more (e.g. VeOmni keys without its engine)
                    rows[variant].append({"script": rel, "entry": entry.rsplit(".", 1)[-1], "result": "n/a",
                                          "detail": f"verl-omni's own config rejects the list: {upstream}",
                                          "handed_over": False})
                    continue
            argv = [*_flagged(entry, replay.localise(given, model_path, model_dir, prompts)),
                    f"hydra.run.dir={work / 'hydra' / f'{i}-{len(rows[variant])}'}", "hydra.output_subdir=null"]
            runs = V1_MAIN if entry.endswith("_v1") else entry
            while len(running) >= ENTRY_POINT_JOBS:
                finish(*running.pop(0))
            row = {"script": rel, "entry": entry.rsplit(".", 1)[-1]}
            rows[variant].append(row)
            running.append((row, replay.Forked(runs, argv, repo, work / f"{script.stem}-{variant[:2]}",
                                               timeout=900)))  # as a user runs it, in the archive's tree
    while running:
        finish(*running.pop(0))
    return rows


@pytest.mark.slow
@pytest.mark.parametrize("variant", ["as shipped", "unsupported dropped"])
def test_every_example_script_through_verl_omnis_own_entry_point(replayed, variant):
    rows = replayed[variant]
    counts = {k: sum(r["result"] == k for r in rows)
              for k in ("accepted", "rejected", "hydra error", "traceback", "n/a")}
    for r in rows:
        first = r["detail"].splitlines()[0][:110] if r["detail"] else ""
        print(f"{r['result']:12s} {r['entry']:18s} {r['script']}: {first}")
    print(f"{variant}: {len(rows)} scripts through verl-omni's entry points: " +
          ", ".join(f"{v} {k}" for k, v in counts.items()))
    assert len(rows) == 29
    assert {r["entry"] for r in rows} == {"main_diffusion", "main_diffusion_v1"}
    if variant == "as shipped":
        assert counts["n/a"] == 0
    else:  # only the VeOmni scripts stop composing in verl-omni itself once their engine's keys are dropped
        assert counts["n/a"] <= 2 and counts["accepted"] > 0, counts
    rows = [r for r in rows if r["result"] != "n/a"]
    assert all(r["handed_over"] for r in rows), [r["script"] for r in rows if not r["handed_over"]]
    bad = [(r["script"], r["result"], r["detail"]) for r in rows if r["result"] not in ("accepted", "rejected")]
    assert not bad, bad
    for r in rows:
        assert "use +" not in r["detail"] and "To append" not in r["detail"]
        if r["result"] == "rejected":  # the message starts with the key it rejects (`key=value ...`)
            assert re.match(r"[a-z_]+(\.\w+)*=|[a-z_]+(\.\w+)+[ :]", r["detail"]), r


# ------------------------------------------------------------------------------------------ one real step
#: recipe -> the entry point its script calls; SD3.5 keeps trainer.use_v1=true (dropped at the handover, said)
TWINS = {"sd35_flowgrpo_lora_v1_separate_async": "verl_omni.trainer.main_diffusion_v1",
         "qwen_image_flowgrpo_lora": "verl_omni.trainer.main_diffusion",
         "wan22_dancegrpo": "verl_omni.trainer.main_diffusion"}


def _twin_argv(name: str, tmp_path: Path, extra: tuple[str, ...] = (), workers: int = 2) -> list[str]:
    """The tiny twin's command line for its entry point (model, reward files and parquet prompts written under
    `tmp_path`; the run's output in `tmp_path/run`, checkpoints in `tmp_path/run/checkpoints`), plus `extra`;
    `workers` CPU worker processes from verl-omni's layout keys (2: 1 generator + 1 trainer; 3: 1 + 2)."""
    import pandas as pd

    from digenrl_verl.models.tiny import build_tiny_model_dir

    recipe, entry = RECIPES[name], TWINS[name]
    v1 = entry.endswith("_v1")
    model = build_tiny_model_dir(recipe.architecture, tmp_path / "model", seed=0)
    for file, fn in recipe.reward_files.items():
        (tmp_path / file).write_text(STAND_IN_REWARD.format(name=fn))
    rows = [{"prompt": [{"role": "user", "content": f'A sign that reads "{w}"'}], "data_source": "ocr",
             "reward_model": {"ground_truth": w, "style": "rule"}} for w in ("HELLO", "RL", "GPU", "PIPELINE")]
    for split in ("train", "test"):
        pd.DataFrame(rows).to_parquet(tmp_path / f"{split}.parquet")
    out = tmp_path / "run"
    ours = "+trainer.digenrl" if v1 else "trainer.digenrl"  # no section composed on verl-omni's v1 entry point
    select = [*SELECT_V1, *V1_CPU] if v1 else [SELECT]
    return recipe.render(str(model), str(tmp_path), str(tmp_path),
                         switch_off=[k for k in recipe.blockers if k != "trainer.use_v1"],
                         extra=[*recipe.tiny, "trainer.device=cpu", "trainer.nnodes=1",
                                f"trainer.n_gpus_per_node={workers}",
                                "actor_rollout_ref.rollout.nnodes=0", f"{ours}.output_dir={out}",
                                # FSDP1 (Wan's strategy=fsdp) syncs module states from a GPU; FlashAttention 3
                                # kernels (Qwen-Image's attn_backend) are GPU-only: fsdp2, native on CPU
                                "actor_rollout_ref.actor.strategy=fsdp2", "actor_rollout_ref.model.attn_backend=native",
                                f"trainer.default_local_dir={out}/checkpoints", *select, *extra])


def _run_twin(entry: str, argv: list[str], tmp_path: Path) -> str:
    """`python -m <entry> <argv>` as a user on a CPU host; its console (also in tmp_path/entry_point.log), which
    must end with status 0."""
    # a CPU host: verl's CPU platform (registered by our verl.plugins entry point), else verl falls back to nvidia
    # and verl-omni's auto_set_device turns trainer.device=cpu into cuda
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TORCH_COMPILE_DISABLE": "1", "RAY_USAGE_STATS_ENABLED": "0",
           "TOKENIZERS_PARALLELISM": "false", "VERL_PLATFORM": "cpu"}
    cmd = [sys.executable, "-m", entry, *argv, f"hydra.run.dir={tmp_path / 'hydra'}"]
    proc = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=1800)
    text = proc.stdout + proc.stderr
    (tmp_path / "entry_point.log").write_text(text)  # the whole console, for a failure's diagnosis
    ours = "\n".join(line for line in text.splitlines() if re.match(r"\s*(\(.*?\)\s*)?digenrl", line))
    assert proc.returncode == 0, ours[-3000:] + "\n...\n" + failure_summary(text)
    return text


def _host_script(args: dict) -> dict:
    """`_load_host_checkpoint.py` with `args` on verl's CPU platform (forked from the engine tests' case server, as
    a fresh interpreter would run it); its report."""
    script = str(Path(__file__).resolve().parent / "_load_host_checkpoint.py")
    return run_script(script, args, f"verl-omni's actor worker, {args.get('mode', 'load')}", timeout=600)


def _composed_actor(argv: list[str]) -> dict:
    """verl-omni's composed actor_rollout_ref for the command line, resolved."""
    ours = ("hydra.", "trainer.digenrl.", "+trainer.digenrl.", "trainer.trainer_class=")  # not verl-omni's own keys
    composed = _verl_omni_config([a for a in argv if not a.startswith(ours)])
    return OmegaConf.to_container(composed.actor_rollout_ref, resolve=True)


@pytest.mark.slow
def test_a_verl_omni_checkpoint_resumes_a_digenrl_run(tmp_path):
    """verl-omni's stock actor worker writes step 1 as verl-omni's trainer does (global_step_1/actor, the pointer;
    its LoRA set to seeded values); the SD3.5 twin through main_diffusion_v1 with two steps resumes there (auto):
    it trains step 2 only, the generators received the loaded weights, and step 2's weights are the saved ones plus
    one small update (far from a fresh adapter, whose B factors are zero)."""
    from safetensors.torch import load_file

    from digenrl_verl.integrations.verl_omni_trainer import canonical_name

    name = "sd35_flowgrpo_lora_v1_separate_async"
    argv = _twin_argv(name, tmp_path, extra=("trainer.total_training_steps=2", "trainer.save_freq=1"))
    root = tmp_path / "run" / "checkpoints"
    saved = _host_script({"mode": "save", "actor_rollout_ref": _composed_actor(argv), "root": str(root), "step": 1,
                          "weights_out": str(tmp_path / "saved.safetensors"), "out": str(tmp_path / "save.json")})
    assert saved["saved"] > 0
    text = _run_twin(TWINS[name], argv, tmp_path)
    assert f"resuming from {root / 'global_step_1'} (step 1)" in text and "resumed verl-omni's checkpoint" in text
    written = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert written["summary"]["steps"] == 1 and {w["version"] for w in written["workers"]} == {2}
    before = load_file(str(tmp_path / "saved.safetensors"))
    after = {canonical_name(k): v for k, v in load_file(str(root / "global_step_2" / "model.safetensors")).items()}
    assert before.keys() == after.keys()
    moved = max(float((after[k].float() - before[k]).abs().max()) for k in before)
    scale = max(float(before[k].abs().max()) for k in before if "lora_B" in k)
    print(f"resumed from verl-omni's step 1: step 2 moved the weights by at most {moved:.2e} (|B| up to {scale:.2e})")
    assert 0 < moved < 0.1 * scale


@pytest.mark.slow
def test_the_trainer_pool_runs_verl_omnis_worker_at_world_size_2(tmp_path):
    """The Qwen-Image twin with 1 generator + 2 trainer CPU workers (trainer.n_gpus_per_node=3) under Ray's worker
    groups: verl-omni's actor worker on a gloo world of 2 (fsdp2 shards), one step, both trainer ranks and the
    generator at version 1, and verl-omni's checkpoint written by both ranks."""
    name = "qwen_image_flowgrpo_lora"
    text = _run_twin(TWINS[name], _twin_argv(name, tmp_path, workers=3), tmp_path)
    assert "mode: disaggregated; pools: generator: 1 worker(s), trainer: 2 worker(s)" in text
    assert "trainer.digenrl.trainer_engine=verl_omni: the trainer pool is verl-omni's actor worker" in text
    written = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert written["summary"]["steps"] == 1
    assert sorted(w["worker"] for w in written["workers"]) == ["gen:0", "trn:0", "trn:1"]
    assert {w["version"] for w in written["workers"]} == {1}
    actor = tmp_path / "run" / "checkpoints" / "global_step_1" / "actor"
    assert {p.name for p in actor.glob("model_world_size_2_rank_*.pt")} == {"model_world_size_2_rank_0.pt",
                                                                           "model_world_size_2_rank_1.pt"}


def _check_host_resumes(root: Path, argv: list[str], tmp_path: Path, steps: int) -> None:
    """`<root>/global_step_<steps>/actor` (verl-omni's layout) and verl's `latest_checkpointed_iteration.txt` naming
    it; verl-omni's stock actor worker, built from the config verl-omni composes for the same command line, loads that
    last checkpoint with its own `load_checkpoint` and holds the weights the generators hold at the end
    (`_load_host_checkpoint.py`)."""
    step = root / f"global_step_{steps}"
    assert (step / "actor").is_dir() and (root / "latest_checkpointed_iteration.txt").read_text() == str(steps)
    report = _host_script({"actor_rollout_ref": _composed_actor(argv), "checkpoint": str(step),
                           "out": str(tmp_path / "host_resume.json")})
    print(f"verl-omni's actor worker resumed {step}: {report}")
    # verl-omni may adapt modules that never reach the output (Qwen-Image's last text-stream layers), which the
    # package's policy leaves frozen: every one of ours is matched
    assert report["matched"] == report["ours"] > 0 and report["theirs"] >= report["ours"], report
    assert report["moved_from_built"] > 0 and report["max_diff"] == 0.0, report  # loaded, and not vacuously


#: the Qwen-Image twin runs as the flag's side of test_verl_omni_flag_equals_stock_on_cpu.py (two steps, the same
#: overrides and more), which holds it to these checks too (`check_twin_run`)
TWIN_RUN_ELSEWHERE = "qwen_image_flowgrpo_lora"
#: what the twins add to their recipe's command line
TWIN_EXTRA = ("actor_rollout_ref.rollout.name=vllm_omni", "actor_rollout_ref.rollout.dtype=float32",
              "trainer.digenrl.trainer_engine=verl_omni", "trainer.digenrl.tag.policy=static",
              "trainer.digenrl.tag.static_k=1")


#: the twin whose generators run on verl-omni's rollout replicas (the CUDA default; on CPU with the key below)
TWIN_ON_REPLICAS = "wan22_dancegrpo"
REPLICAS = "trainer.digenrl.generator_replicas"


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(set(TWINS) - {TWIN_RUN_ELSEWHERE}))
def test_tiny_twin_trains_one_real_step_through_verl_omnis_entry_point(name, tmp_path):
    """verl-omni's script as written (`rollout.name=vllm_omni`; SD3.5 LoRA with cps, Wan2.2 DanceGRPO full fine-tune,
    each with an SDE window), its blockers switched off but trainer.use_v1, its `tiny` sizes, one generator and one
    trainer CPU worker from verl-omni's layout keys, through `python -m <its entry point>`: v1 with
    `trainer.v1.trainer_mode=digenrl` (verl-omni's own task runner builds our trainer), v0 with
    `trainer.trainer_class=digenrl`. SD3.5's generators sample with verl-omni's own registered rollout pipeline,
    built by vLLM-Omni's loader in the generator process (rollout engine verl_omni, the CPU default), and its TAG
    micro-batch runs on the trainer rank's own copy of that pipeline. Wan2.2's (TWIN_ON_REPLICAS,
    `generator_replicas=true`, what CUDA runs by default) sample on one of verl-omni's rollout replicas started on
    the generator rank's own bundle (`init_colocated`: its server, AsyncOmni and a spawned diffusion worker, in a
    Ray instance with one logical GPU, which the generator's bundle holds), over two steps with TCSS one version
    ahead (step 1's first micro-batch sampled at version 0 while step 0 updates), and the trainer rank samples its
    TAG micro-batches with its own diffusers engine. Either way the trainer pool (verl-omni's actor worker) trains
    real steps on those samples; the new weights reach the generator (the run ends with it at version 1); the
    checkpoint is in verl-omni's layout and verl-omni's stock worker resumes it. (The package's diffusers generators
    under verl-omni's actor worker: `test_the_trainer_pool_runs_verl_omnis_worker_at_world_size_2`; the Qwen-Image
    twin: TWIN_RUN_ELSEWHERE.)"""
    entry = TWINS[name]
    plus = "+" if entry.endswith("_v1") else ""
    replicas = (f"{REPLICAS}=true", *TCSS_AHEAD) if name == TWIN_ON_REPLICAS else ()
    argv = _twin_argv(name, tmp_path, extra=tuple(e if e.startswith("actor_") else plus + e
                                                  for e in (*TWIN_EXTRA, *replicas)))
    steps = 2 if replicas else 1
    check_twin_run(name, _run_twin(entry, argv, tmp_path), tmp_path / "run", argv, tmp_path, steps=steps,
                   replicas=bool(replicas))
    if replicas:  # TCSS one version ahead on the replica: step 1's first GEN sampled at version 0
        _check_ran_ahead(tmp_path / "run")


#: TCSS one version ahead over two steps (the replica twin; the Qwen-Image twin: `test_tcss_runs_ahead_...`)
TCSS_AHEAD = ("trainer.digenrl.tcss.staleness=1", "trainer.digenrl.tcss.max_stale_fraction=0.5",
              "trainer.digenrl.tcss.guard=false", "trainer.total_training_steps=2")


def _check_ran_ahead(out: Path) -> None:
    """Step 1's first micro-batches were generated with version 0 while step 0 still updated (schedule.txt), and
    no GEN of step 1 sampled another version than 0 or 1."""
    schedule = (out / "schedule.txt").read_text().splitlines()
    gens = [line.split() for line in schedule if line.split()[2:3] == ["GEN"]]
    assert [g for g in gens if g[3] == "s1" and g[5] == "v0"], "\n".join(schedule)  # <start> <end> GEN s m v ...
    assert all(g[5] in ("v0", "v1") for g in gens if g[3] == "s1")


def check_twin_run(name: str, text: str, out: Path, argv: list[str], tmp_path: Path, steps: int,
                   replicas: bool = False) -> None:
    """A twin's run (console `text`, output folder `out`) of `steps` steps: handed over by verl-omni's entry point,
    generators on verl-omni's rollout pipeline (`replicas`: on its rollout replicas), real updates, every worker at
    the last version, TAG on the hybrid pipeline (`replicas`: on the trainer's diffusers engine), verl-omni's stock
    worker resuming its last checkpoint."""
    entry = TWINS[name]
    _check_handed_over(text, entry.endswith("_v1"))
    if replicas:
        assert (f"actor_rollout_ref.rollout.name=vllm_omni on CPU ({REPLICAS}=true): each of the 1 generator ranks "
                "starts one of verl-omni's rollout replicas on its own placement-group bundle") in text
        assert "engines: generation verl_omni_replica" in text
    else:
        assert (f"actor_rollout_ref.rollout.name=vllm_omni on CPU ({REPLICAS}=auto): the generators sample with "
                "verl-omni's own") in text
        assert "engines: generation verl_omni " in text
    written = json.loads((out / "summary.json").read_text())
    summary, workers = written["summary"], written["workers"]
    lines = [m for m in map(json.loads, (out / "metrics.jsonl").read_text().splitlines()) if "summary" not in m]
    trained = [m for m in lines if "actor/grad_norm" in m]  # training steps (validation lines are apart)
    print(f"{name} via {entry} on verl-omni's rollout {'replica' if replicas else 'pipeline'}: summary "
          f"{json.dumps(summary)}")
    print(f"{name} via {entry}: metrics lines {json.dumps(lines)}")
    assert summary["mode"] == "disaggregated" and summary["steps"] == steps and len(trained) == steps
    assert all(m["actor/grad_norm"] > 0 for m in trained)  # real updates
    assert summary["samples"] == 4 * steps  # tiny: 2 prompts x n=2 a step
    assert sorted(w["worker"] for w in workers) == ["gen:0", "trn:0"]
    assert {w["version"] for w in workers} == {steps}
    if replicas:
        assert "trainer ranks generate their TAG micro-batches with their own diffusers engine" in text
    else:
        _check_tag_on_the_hybrid_pipeline(text, out)
    _check_host_resumes(out / "checkpoints", argv, tmp_path, steps)


def _check_handed_over(text: str, v1: bool) -> None:
    """verl-omni's entry point handed the run to our trainer (v0: its trainer_class hook; v1: its own task runner),
    with one generator and one trainer worker, the trainer pool on verl-omni's actor worker."""
    assert HANDED in text
    if not v1:
        assert "the run is handed to digenrl_verl.integrations.verl_omni.DigenRLDiffusionTrainer" in text
    else:
        assert "trainer.use_v1=true: verl-omni's switch between its v0 and v1 task runners" in text
        assert "DiffusionTaskRunnerV1" in text  # verl-omni's own task runner ran it
    assert "mode: disaggregated; pools: generator: 1 worker(s), trainer: 1 worker(s)" in text
    assert "trainer.digenrl.trainer_engine=verl_omni: the trainer pool is verl-omni's actor worker" in text
    assert "trainer verl-omni's actor worker (fsdp2, TSP engine" in text


def _check_tag_on_the_hybrid_pipeline(text: str, out: Path) -> None:
    """The TAG micro-batch ran on the trainer rank's own copy of verl-omni's pipeline (the hybrid engine), its switch
    (pipeline built, trained weights handed over) and its generation as sub-spans of the TAG span in the trace."""
    assert "the trainer rank samples their TAG micro-batches" in text
    events = json.loads((out / "trace.json").read_text())
    events = events["traceEvents"] if isinstance(events, dict) else events
    tags = [e for e in events if e.get("ph") == "X" and str(e.get("name", "")).startswith("TAG")]
    assert tags and all(e["args"].get("engine") == "hybrid" and e["args"]["switch_s"] > 0 for e in tags), tags
    phases = [e["name"] for e in events if e.get("args", {}).get("task_id") == tags[0]["args"]["task_id"]
              and "phase" in e.get("args", {})]
    assert phases == ["wake", "sync", "generate"], phases


@pytest.mark.slow
def test_tcss_runs_ahead_on_verl_omnis_rollout_pipeline_and_actor_worker(tmp_path):
    """TCSS (staleness 1) with both pools on verl-omni's code (generators: its Qwen-Image rollout pipeline;
    trainers: its actor worker): step 1's first micro-batches are generated with version 0 while step 0 still
    updates, each trajectory carries the one version it was sampled with, and both steps train."""
    argv = _twin_argv("qwen_image_flowgrpo_lora", tmp_path, extra=(
        "actor_rollout_ref.rollout.name=vllm_omni", "actor_rollout_ref.rollout.dtype=float32",
        "trainer.digenrl.trainer_engine=verl_omni", "trainer.digenrl.tag.policy=off", *TCSS_AHEAD))
    _run_twin(TWINS["qwen_image_flowgrpo_lora"], argv, tmp_path)
    _check_ran_ahead(tmp_path / "run")
    written = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert written["summary"]["steps"] == 2 and {w["version"] for w in written["workers"]} == {2}
    steps = [m for m in map(json.loads, (tmp_path / "run" / "metrics.jsonl").read_text().splitlines())
             if "actor/grad_norm" in m]
    assert len(steps) == 2 and all(m["actor/grad_norm"] > 0 for m in steps)


@pytest.mark.slow
def test_colocated_mode_on_verl_omnis_pipeline_and_actor_worker(tmp_path):
    """The colocated mode with both roles on verl-omni's code, as verl-omni's hybrid engine runs a step: one rank
    samples with its own copy of verl-omni's Wan2.2 rollout pipeline (handed the trained weights at each new
    version) and trains with verl-omni's actor worker; two steps, so the second samples after a weight hand-over."""
    argv = _twin_argv("wan22_dancegrpo", tmp_path, workers=1, extra=(
        "actor_rollout_ref.rollout.name=vllm_omni", "actor_rollout_ref.rollout.dtype=float32",
        "trainer.digenrl.trainer_engine=verl_omni", "trainer.digenrl.mode=colocated",
        "trainer.total_training_steps=2"))
    text = _run_twin(TWINS["wan22_dancegrpo"], argv, tmp_path)
    assert "the colocated rank samples all their samples (the colocated mode) with its own copy of verl-omni's" in text
    written = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert written["summary"]["mode"] == "colocated" and written["summary"]["steps"] == 2
    assert {w["version"] for w in written["workers"]} == {2}
    events = json.loads((tmp_path / "run" / "trace.json").read_text())
    events = events["traceEvents"] if isinstance(events, dict) else events
    gens = [e for e in events if e.get("ph") == "X" and str(e.get("name", "")).startswith("GEN")]
    assert gens and all(e["args"].get("engine") == "hybrid" for e in gens)
    synced = [e for e in events if e.get("args", {}).get("phase") == "sync"]
    assert len(synced) >= 2  # built at version 0, handed version 1 before step 1's samples
