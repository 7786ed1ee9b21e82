"""patches/: the verl 0.9.1 series applies to the installed verl and the patched verl works; the verl-omni series
parses and `git am`s onto verl-omni a1139baf (its source archive in ../shared/upstream/), where its hook resolves
this package's trainer by the name our entry point registers (the run itself is tests/verl_omni/, in the verl-omni
venv)."""

from __future__ import annotations

import importlib.util
import os
import re
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

from digenrl_verl.platform import process_env

from _upstream import VERL_OMNI_ARCHIVE, require

ROOT = Path(__file__).resolve().parents[2]
VERL_PATCHES = sorted((ROOT / "patches" / "verl-0.9.1").glob("*.patch"))
OMNI_PATCHES = sorted((ROOT / "patches" / "verl-omni-a1139baf").glob("*.patch"))
OMNI_ARCHIVE = VERL_OMNI_ARCHIVE


def _installed_verl() -> tuple[Path, str]:
    import verl

    return Path(verl.__file__).resolve().parent.parent, getattr(verl, "__version__", "?")


def _git_apply(args: list[str], cwd: Path) -> subprocess.CompletedProcess:
    # GIT_CEILING_DIRECTORIES: never treat an enclosing checkout as the repository (plain patch mode)
    env = {**os.environ, "GIT_CEILING_DIRECTORIES": str(cwd.parent)}
    return subprocess.run(["git", "apply", *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=60)


def test_series_are_present_and_numbered():
    # verl's CPU platform is no patch: the package ships it through verl's external-module hook
    # (digenrl_verl/platform/cpu.py; tests/integrations/test_integ_cpu_platform_on_cpu.py)
    assert [p.name[:4] for p in VERL_PATCHES] == ["0001", "0002"]
    assert not any("platform" in p.name for p in VERL_PATCHES)
    assert [p.name[:4] for p in OMNI_PATCHES] == ["0001", "0002", "0003", "0004"]
    for p in VERL_PATCHES + OMNI_PATCHES:
        head = p.read_text().splitlines()[:5]
        assert head[0].startswith("From 0000000000000000000000000000000000000000")
        assert any(line.startswith("Subject: [PATCH") for line in head), head


@pytest.mark.parametrize("patch", VERL_PATCHES, ids=[p.name for p in VERL_PATCHES])
def test_verl_patch_applies_to_the_installed_verl_and_names_its_workaround(patch):
    site, version = _installed_verl()
    if version != "0.9.1":
        pytest.skip(f"patches are for verl 0.9.1, installed: {version}")
    proc = _git_apply(["--check", "-p1", str(patch)], cwd=site)
    assert proc.returncode == 0, proc.stderr
    # every patch says which run-time workaround of this package it makes unnecessary, and that file exists
    workaround = re.search(r"Workaround in digenrl-verl until this lands:.*?(digenrl_verl/[\w/]+\.py)",
                           patch.read_text(), flags=re.S)
    assert workaround and (ROOT / workaround.group(1)).is_file()


@pytest.mark.slow  # copies and imports a patched verl in a subprocess
def test_patched_verl_copy_works(tmp_path):
    """The whole series applied in order to a copy of the installed verl: the pool classes take the new arguments,
    and the patched copy still takes the package's CPU platform through its external-module hook."""
    site, version = _installed_verl()
    if version != "0.9.1":
        pytest.skip(f"patches are for verl 0.9.1, installed: {version}")
    shutil.copytree(site / "verl", tmp_path / "verl", ignore=shutil.ignore_patterns("__pycache__"))
    for patch in VERL_PATCHES:
        proc = _git_apply(["-p1", str(patch)], cwd=tmp_path)
        assert proc.returncode == 0, f"{patch.name}: {proc.stderr}"
    probe = (
        "import inspect, verl\n"
        "assert verl.__file__.startswith(%r), verl.__file__\n"
        "from verl.plugin.platform import get_platform\n"
        "p = get_platform()\n"
        "assert type(p).__module__ == 'digenrl_verl.platform.cpu', type(p)\n"
        "assert (p.device_name, p.ray_resource_name(), p.communication_backend_name()) == ('cpu', 'CPU', 'gloo')\n"
        "from verl.single_controller.ray.base import RayResourcePool, ResourcePoolManager\n"
        "m = ResourcePoolManager(resource_pool_spec={'g': [2]}, mapping={}, max_colocate_count=1, use_gpu=False)\n"
        "assert m.use_gpu is False\n"
        "pool = RayResourcePool([2], use_gpu=False, max_colocate_count=1, custom_resources={'kind_a': 1e-3})\n"
        "assert pool.custom_resources == {'kind_a': 1e-3}\n"
        "print('patched verl ok')\n" % str(tmp_path)
    )
    env = {**os.environ, "PYTHONPATH": str(tmp_path), **process_env(cpu=True, environ={})}
    proc = subprocess.run([sys.executable, "-c", probe], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0 and "patched verl ok" in proc.stdout, proc.stderr[-3000:]


def test_verl_omni_series_parses():
    for patch in OMNI_PATCHES:
        proc = _git_apply(["--numstat", str(patch)], cwd=ROOT / "patches")
        assert proc.returncode == 0 and proc.stdout.strip(), proc.stderr


def _git(args: list[str], cwd: Path) -> subprocess.CompletedProcess:
    ident = ["-c", "user.name=t", "-c", "user.email=t@invalid"]
    env = {**os.environ, "GIT_CEILING_DIRECTORIES": str(cwd.parent)}
    return subprocess.run(["git", *ident, *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=120)


@pytest.mark.slow  # unpacks verl-omni and runs git in subprocesses
def test_verl_omni_series_git_ams_onto_a1139baf_and_its_hook_finds_our_trainer(tmp_path, monkeypatch):
    """`git am` of the whole series onto the a1139baf tree (as proposed upstream); the result adds the hook module,
    its CPU test, its docs page in the index, `trainer.trainer_class` in the YAML and the generated references, and
    the hook in v0 `main_diffusion` only (v1 selects a trainer through its registry, unpatched).
    The hook module, loaded from the patched tree, resolves our trainer by the FQN our entry point names."""
    with tarfile.open(require(OMNI_ARCHIVE)) as tar:
        tar.extractall(tmp_path, filter="data")
    (tree,) = [p for p in tmp_path.iterdir() if p.is_dir()]
    for args in (["init", "-q"], ["add", "-A"], ["commit", "-q", "-m", "a1139baf"]):
        assert _git(args, tree).returncode == 0
    proc = _git(["am", "--keep-non-patch", *map(str, OMNI_PATCHES)], tree)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    subjects = _git(["log", "--format=%s", "-4"], tree).stdout.splitlines()
    assert [s.split(" ")[0] for s in subjects] == ["[worker]", "[worker]", "[doc]", "[trainer,"], subjects
    assert (tree / "tests" / "utils" / "test_fsdp_utils_root_lora_on_cpu.py").is_file()
    assert (tree / "tests" / "trainer" / "test_external_trainer_on_cpu.py").is_file()
    assert "algo/external_trainer.md" in (tree / "docs" / "index.md").read_text()
    assert "Last updated:" in (tree / "docs" / "algo" / "external_trainer.md").read_text()
    config = tree / "verl_omni" / "trainer" / "config"
    for name in ("diffusion_trainer.yaml", "_generated_diffusion_trainer.yaml",
                 "_generated_diffusion_veomni_trainer.yaml"):
        assert "  trainer_class: null" in (config / name).read_text(), name
    assert "- optional trainer_plugins@trainer: installed" in (config / "diffusion_trainer.yaml").read_text()
    text = (tree / "verl_omni" / "trainer" / "main_diffusion.py").read_text()  # v0: the hook
    assert "register_plugin_configs()" in text and "if run_external_trainer(config):" in text
    v1 = (tree / "verl_omni" / "trainer" / "main_diffusion_v1.py").read_text()  # v1: untouched (trainer registry)
    assert "run_external_trainer" not in v1 and "register_plugin_configs" not in v1
    from digenrl_verl.integrations.verl_omni import DigenRLDiffusionTrainer, entry_points_txt

    # our entry point as pip writes it from setup.py's entry_points, on sys.path; the hook module from the tree
    dist = tmp_path / "site" / "digenrl_verl_probe-0.0.0.dist-info"
    dist.mkdir(parents=True)
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: digenrl-verl-probe\nVersion: 0.0.0\n")
    (dist / "entry_points.txt").write_text(entry_points_txt())
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    spec = importlib.util.spec_from_file_location("verl_omni_external_trainer_probe",
                                                  tree / "verl_omni" / "trainer" / "external_trainer.py")
    hook = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(hook)
    assert hook.load_external_trainer("digenrl") is DigenRLDiffusionTrainer
    assert hook.load_external_trainer("digenrl_verl.integrations.verl_omni.DigenRLDiffusionTrainer") \
        is DigenRLDiffusionTrainer
    section = DigenRLDiffusionTrainer.config_section()
    assert section.mode == "disaggregated" and section.dry_run is False
