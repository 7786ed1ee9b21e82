"""The verl-omni bridge without verl-omni: the install message, lazy imports, the config translation (v1 trainer-mode
path) and the handover of verl-omni's entry-point overrides (external-trainer path)."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest
from omegaconf import OmegaConf

from digenrl_verl.integrations import verl_omni as vo
from digenrl_verl.trainer.config import build_run


def test_not_installed_says_how_to_install_and_which_commit(capsys):
    if vo.verl_omni_available():
        pytest.skip("verl-omni is installed here (the verl-omni venv): the not-installed path cannot be shown")
    commit = "a1139bafffb5b9711f0a6b6edff8ecaa60bfff30"
    with pytest.raises(vo.VerlOmniNotInstalled, match=f"pip install 'verl-omni @ git\\+.*@{commit}'"):
        vo.require_verl_omni()
    with pytest.raises(ImportError, match="a1139baf"):
        vo.register()
    assert vo.main(["trainer.v1.trainer_mode=digenrl"]) == 2
    err = capsys.readouterr().err
    assert "verl_omni is not installed" in err and "digenrl_verl.main" in err and vo.VERL_OMNI_COMMIT in err


_PROBE = textwrap.dedent("""
    import json, sys
    import digenrl_verl, digenrl_verl.main, digenrl_verl.trainer.config, digenrl_verl.integrations
    import digenrl_verl.integrations.verl_omni as vo
    from digenrl_verl.engines.base import VLLM_OMNI
    from digenrl_verl.main import compose
    from digenrl_verl.trainer.config import build_run
    out = {"verl_omni_available": vo.verl_omni_available(), "vllm_omni_reason": VLLM_OMNI.unavailable_reason()}
    try:
        build_run(compose(["actor_rollout_ref.model.path=" + sys.argv[1], "actor_rollout_ref.rollout.name=vllm_omni"]))
    except ValueError as e:
        out["error"] = str(e)
    out["imported"] = sorted(m for m in sys.modules if m.split(".")[0] in ("verl_omni", "vllm", "vllm_omni"))
    print(json.dumps(out))
""")


@pytest.mark.slow  # a fresh interpreter
def test_importing_the_package_never_imports_verl_omni_or_vllm(tmp_path, tiny_dirs):
    """Fake `verl_omni`, `vllm` and `vllm_omni` packages that raise when imported sit on the path: the package,
    the entry point, both integration modules and a build_run that selects verl-omni's rollout (its replicas)
    must only ever *find* them, never import them."""
    for name in ("verl_omni", "vllm", "vllm_omni"):
        (tmp_path / name).mkdir()
        (tmp_path / name / "__init__.py").write_text(f"raise RuntimeError('{name} was imported')\n")
    env_path = f"{tmp_path}"
    proc = subprocess.run([sys.executable, "-c", _PROBE, tiny_dirs["FluxPipeline"]], capture_output=True, text=True,
                          timeout=120, env={**__import__("os").environ, "PYTHONPATH": env_path})
    assert proc.returncode == 0, proc.stderr[-2000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["imported"] == []
    assert out["verl_omni_available"] is True  # found (on the path) without being imported
    assert out["vllm_omni_reason"] is None  # found: verl-omni's rollout is planned (the default device, cuda: its
    # replicas) and refused for FLUX (verl-omni has no FLUX rollout), by name, before any import
    assert ("actor_rollout_ref.model.path is a FluxPipeline with actor_rollout_ref.rollout.name=vllm_omni on "
            "verl-omni's replicas") in out["error"]
    assert "set actor_rollout_ref.rollout.name=diffusers" in out["error"]


# ------------------------------------------------------------------------------------------ translation
def _verl_omni_like(**over):
    """A verl-omni-shaped config (nested dicts), with verl-omni's defaults where ours differ."""
    cfg = {
        "data": {"train_batch_size": 4},
        "actor_rollout_ref": {
            "model": {"path": over.pop("path"), "algorithm": "flow_grpo", "lora_rank": 0},
            "actor": {"optim": {"lr": 3e-5}, "ppo_mini_batch_size": 4},
            "rollout": {"name": "diffusers", "n": 2, "tensor_model_parallel_size": 2, "nnodes": 0,
                        "n_gpus_per_node": 8, "pipeline": {"height": 64, "width": 64, "num_inference_steps": 4,
                                                           "video_flow_shift": 12, "frame_rate": 24},
                        "algo": {"noise_level": 0.9, "sde_type": "sde"}},
        },
        "reward": {"reward_functions": {}, "custom_reward_function": {"path": None, "name": "compute_score"}},
        "trainer": {"device": "cpu", "nnodes": 1, "n_gpus_per_node": 2, "total_training_steps": 3,
                    "val_before_train": True, "use_v1": True, "v1": {"trainer_mode": "digenrl"}},
    }
    for dotted, value in over.items():
        *head, last = dotted.split("__")
        node = cfg
        for h in head:
            node = node.setdefault(h, {})
        node[last] = value
    return cfg


def test_translation_takes_their_values_and_mode_and_derives_pools(tiny_dirs):
    ours = vo.translate_config(_verl_omni_like(path=tiny_dirs["FluxPipeline"]))
    assert ours.trainer.digenrl.mode == "disaggregated" and ours.trainer.use_v1 is False
    spec = build_run(ours)  # validates: verl-omni's defaults that we do not follow were not carried
    assert spec.n == 2 and spec.prompts_per_step == 4 and spec.num_steps == 3
    assert spec.policy.rollout.noise_level == pytest.approx(0.9) and spec.policy.rollout.num_inference_steps == 4
    assert spec.train.optim.lr == pytest.approx(3e-5) and spec.policy.pipeline.height == 64
    assert spec.reward.weights() == {"jpeg_compressibility": 1.0}  # verl-omni's default reward
    pools = {r: (spec.digenrl.pools[r].size, spec.digenrl.pools[r].use_gpu) for r in spec.digenrl.roles}
    assert pools == {"generator": (1, False), "trainer": (1, False)}
    sync = vo.translate_config(_verl_omni_like(path=tiny_dirs["FluxPipeline"], trainer__v1__trainer_mode="sync"))
    assert sync.trainer.digenrl.mode == "colocated"
    assert dict(sync.trainer.digenrl.pools.colocated)["workers_per_node"] == 2


def test_translation_carries_explicit_unsupported_values_so_they_fail(tiny_dirs):
    ours = vo.translate_config(_verl_omni_like(path=tiny_dirs["FluxPipeline"],
                                               actor_rollout_ref__rollout__tensor_model_parallel_size=4))
    with pytest.raises(ValueError, match="tensor_model_parallel_size=4"):
        build_run(ours)
    with pytest.raises(ValueError, match=r"trainer\.v1\.trainer_mode='separate_async'.*valid here"):
        vo.translate_config(_verl_omni_like(path=tiny_dirs["FluxPipeline"], trainer__v1__trainer_mode="separate_async"))


def test_translation_warns_about_a_key_that_our_config_lacks(tiny_dirs):
    """A key of verl-omni's config that ours lacks is not carried (verl-omni's own keys all exist in ours:
    tests/verl_omni), so it is one the user added: warned by name, never dropped silently."""
    with pytest.warns(UserWarning, match=r"actor_rollout_ref\.actor\.optim\.lr_typo=0\.1 has no effect"):
        ours = vo.translate_config(_verl_omni_like(path=tiny_dirs["FluxPipeline"],
                                                   actor_rollout_ref__actor__optim__lr_typo=0.1))
    assert "lr_typo" not in ours.actor_rollout_ref.actor.optim


# ------------------------------------------------------------------------------------------ the handover
def test_the_handover_runs_the_config_verl_omni_composed_with_its_sections_mode(tiny_dirs):
    """What verl-omni's v0 entry point hands over (trainer.trainer_class=digenrl, our section composed with mode
    disaggregated): the composed config itself, translated key by key; the selecting keys are said and not
    carried; the pools come from verl-omni's layout keys; verl-omni's `trainer.v1.trainer_mode` (sync by
    default) does not choose the mode there, the section does."""
    section = OmegaConf.to_container(vo.DigenRLDiffusionTrainer.config_section())
    source = _verl_omni_like(path=tiny_dirs["FluxPipeline"], trainer__trainer_class="digenrl",
                             trainer__n_gpus_per_node=4, trainer__v1__trainer_mode="sync", trainer__digenrl=section)
    source["trainer"]["digenrl"]["dry_run"] = True
    notes = vo.handover_notes(source)
    assert [n.split(":")[0] for n in notes] == ["trainer.trainer_class=digenrl", "trainer.use_v1=true"]
    ours = vo.translate_config(source)
    assert ours.trainer.trainer_class is None and ours.trainer.use_v1 is False
    spec = build_run(ours)
    assert spec.digenrl.mode == "disaggregated" and spec.digenrl.dry_run is True
    assert {r: spec.digenrl.pools[r].size for r in spec.digenrl.roles} == {"generator": 2, "trainer": 2}
    assert spec.train.optim.lr == pytest.approx(3e-5)  # the composed value, not a re-composition's default
    source["trainer"]["digenrl"]["mode"] = "colocated"  # the user's mode wins
    assert vo.translate_config(source).trainer.digenrl.mode == "colocated"


def test_the_v1_trainer_mode_needs_no_section_and_names_a_wrong_key(tiny_dirs):
    """verl-omni's v1 entry point, unpatched: `trainer.v1.trainer_mode=digenrl` selects us, our keys come with
    Hydra's `+` (a partial section), and a key our section lacks is named with the valid ones."""
    source = _verl_omni_like(path=tiny_dirs["FluxPipeline"], trainer__digenrl={"dry_run": True})
    assert vo.handover_notes(source)[-1].startswith("trainer.v1.trainer_mode=digenrl: trainer.digenrl.mode=")
    ours = vo.translate_config(source)
    assert ours.trainer.digenrl.mode == "disaggregated" and ours.trainer.digenrl.dry_run is True
    with pytest.raises(ValueError, match=r"trainer\.digenrl\.dryrun.*valid keys.*dry_run"):
        vo.translate_config(_verl_omni_like(path=tiny_dirs["FluxPipeline"], trainer__digenrl={"dryrun": True}))


def test_the_handover_fails_by_name_with_the_entry_points_status(tiny_dirs, capsys):
    """A bad config leaves verl-omni's process with our status (2) and a message naming the key, no traceback."""
    source = _verl_omni_like(path=tiny_dirs["FluxPipeline"], trainer__trainer_class="digenrl",
                             actor_rollout_ref__rollout__tensor_model_parallel_size=4)
    trainer = vo.DigenRLDiffusionTrainer(config=source)
    with pytest.raises(SystemExit) as exit_info:
        trainer.fit()
    assert exit_info.value.code == 2
    assert "tensor_model_parallel_size=4" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exit_info:  # a trainer mode we cannot run: named in init()
        vo.DigenRLDiffusionTrainer(config=_verl_omni_like(path=tiny_dirs["FluxPipeline"],
                                                          trainer__v1__trainer_mode="separate_async")).init()
    assert exit_info.value.code == 2 and "trainer.v1.trainer_mode='separate_async'" in capsys.readouterr().err


def test_the_package_registers_its_trainer_in_verl_omnis_entry_point_group():
    """setup.py's `verl_omni.trainers` entry point: what `trainer.trainer_class=digenrl` resolves to in verl-omni's
    external-trainer hook (patches/verl-omni-a1139baf)."""
    from importlib.metadata import entry_points

    eps = {e.name: e for e in entry_points(group="verl_omni.trainers")}
    assert "digenrl" in eps, "reinstall the package (pip install -e .): setup.py declares the entry point"
    assert eps["digenrl"].load() is vo.DigenRLDiffusionTrainer
    plugins = {e.name: e.value for e in entry_points(group=vo.VERL_PLUGIN_GROUP)}
    assert plugins.get("digenrl") == "digenrl_verl.integrations.verl_plugin"  # registers the v1 trainer mode
    assert vo.entry_points_txt().count("[") == 2 and "[verl.plugins]" in vo.entry_points_txt()
