"""patches/: the verl 0.9.1 series applies to the installed verl and the patched verl works; the verl-omni
series parses, and its new files (the trainer-mode loader) work against this package."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
VERL_PATCHES = sorted((ROOT / "patches" / "verl-0.9.1").glob("*.patch"))
OMNI_PATCHES = sorted((ROOT / "patches" / "verl-omni-a1139baf").glob("*.patch"))


def _installed_verl() -> tuple[Path, str]:
    import verl

    return Path(verl.__file__).resolve().parent.parent, getattr(verl, "__version__", "?")


def _git_apply(args: list[str], cwd: Path) -> subprocess.CompletedProcess:
    # GIT_CEILING_DIRECTORIES: never treat an enclosing checkout as the repository (plain patch mode)
    env = {**os.environ, "GIT_CEILING_DIRECTORIES": str(cwd.parent)}
    return subprocess.run(["git", "apply", *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=60)


def test_series_are_present_and_numbered():
    assert [p.name[:4] for p in VERL_PATCHES] == ["0001", "0002", "0003"]
    assert [p.name[:4] for p in OMNI_PATCHES] == ["0001", "0002"]
    for p in VERL_PATCHES + OMNI_PATCHES:
        head = p.read_text().splitlines()[:3]
        assert head[0].startswith("From 0000000000000000000000000000000000000000")
        assert head[2].startswith("Subject: [PATCH")


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
    """The whole series applied in order to a copy of the installed verl: the CPU platform is selectable, the
    pool classes take the new arguments."""
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
        "assert (p.device_name, p.ray_resource_name(), p.communication_backend_name()) == ('cpu', 'CPU', 'gloo')\n"
        "from verl.single_controller.ray.base import RayResourcePool, ResourcePoolManager\n"
        "m = ResourcePoolManager(resource_pool_spec={'g': [2]}, mapping={}, max_colocate_count=1, use_gpu=False)\n"
        "assert m.use_gpu is False\n"
        "pool = RayResourcePool([2], use_gpu=False, max_colocate_count=1, custom_resources={'kind_a': 1e-3})\n"
        "assert pool.custom_resources == {'kind_a': 1e-3}\n"
        "print('patched verl ok')\n" % str(tmp_path)
    )
    env = {**os.environ, "PYTHONPATH": str(tmp_path), "VERL_PLATFORM": "cpu"}
    proc = subprocess.run([sys.executable, "-c", probe], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0 and "patched verl ok" in proc.stdout, proc.stderr[-3000:]


def test_verl_omni_series_parses_and_its_new_files_load_our_trainer(tmp_path):
    for patch in OMNI_PATCHES:
        proc = _git_apply(["--numstat", str(patch)], cwd=tmp_path)
        assert proc.returncode == 0 and proc.stdout.strip(), proc.stderr
    # 0001 adds files only: it applies to an empty tree, and the loader it adds finds this package's trainer mode.
    proc = _git_apply(["-p1", str(OMNI_PATCHES[0])], cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    loader = tmp_path / "verl_omni" / "trainer" / "diffusion" / "v1" / "trainer_digenrl.py"
    import importlib.util

    spec = importlib.util.spec_from_file_location("verl_omni_trainer_digenrl_probe", loader)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    from digenrl_verl.integrations.verl_omni import TRAINER_MODE, DigenRLDiffusionTrainer

    assert module.DIGENRL_TRAINER_MODE == TRAINER_MODE
    assert module.load_digenrl_trainer() is DigenRLDiffusionTrainer
    assert (tmp_path / "docs" / "algo" / "digenrl.md").is_file()
