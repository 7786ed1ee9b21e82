"""Tiny diffusers model directories, built once per test session into a temporary folder."""

from __future__ import annotations

import os

os.environ["HF_HUB_OFFLINE"] = "1"  # nothing is ever downloaded: every model comes from digenrl_verl.models.tiny

from pathlib import Path

import pytest
import torch

from digenrl_verl.models import build_tiny_model_dir, get_model_spec, load_adapter, tiny_architectures

torch.set_num_threads(2)


@pytest.fixture(scope="session")
def pipeline_kwargs() -> dict[str, dict]:
    """`load_adapter(path, **pipeline_kwargs[arch])` for a fast tiny run of each architecture (its spec's
    `tiny_sampling`)."""
    return {arch: dict(get_model_spec(arch).tiny_sampling) for arch in tiny_architectures()}


@pytest.fixture(scope="session")
def prompts() -> list[str]:
    return ["a photo of a cat", "a red dog on grass", "xyz"]


@pytest.fixture(scope="session")
def tiny_dirs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("tiny_models")
    return {arch: build_tiny_model_dir(arch, root / arch, seed=0) for arch in tiny_architectures()}


@pytest.fixture(scope="session")
def tiny_adapter(tiny_dirs: dict[str, Path], pipeline_kwargs: dict[str, dict]):
    """`tiny_adapter(arch)`: one shared full-fine-tune adapter per architecture, for tests that never change
    its weights (load a fresh one with `load_adapter` to train)."""
    cache: dict[str, object] = {}

    def get(arch: str):
        if arch not in cache:
            cache[arch] = load_adapter(tiny_dirs[arch], **pipeline_kwargs[arch])
        return cache[arch]

    return get
