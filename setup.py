"""digenrl-verl: disaggregated RL post-training of diffusion models, as a verl plugin."""

from setuptools import find_packages, setup

INSTALL_REQUIRES = [
    # torch is not listed on purpose: install torch==2.13.0 first (see constraints.txt), verl does not pin it.
    "verl>=0.9.0.dev0,<0.10",  # 0.9.1, or the 0.9.0.dev0 that verl-omni a1139baf pins (git 8a69493)
    "ray>=2.40",
    "diffusers>=0.38,<0.43",  # admits verl-omni's vLLM-Omni 0.27.0rc1 (0.38); the contract tier runs 0.40
    "transformers>=4.51",
    "omegaconf>=2.3",
    "hydra-core>=1.3",
    "safetensors",
    "peft>=0.15",
    "tqdm",
    "matplotlib",
    "pillow",
    "numpy",
    "pandas",
    "pyarrow",
    "rich",
    "tensorboard",
    # what verl's trainer modules import (verl[verl-core] pins another torch, so list them here)
    "cachetools",
    "uvicorn",
    "fastapi",
    "TransferQueue>=0.1.8,<0.2",  # verl 0.9.1 wants 0.1.11, verl-omni a1139baf 0.1.8
    "pyzmq",
    "msgspec",
]

EXTRAS = {
    "test": ["pytest>=8", "pytest-asyncio", "pytest-xdist", "hypothesis", "ruff>=0.6"],
    "ocr": ["rapidocr-onnxruntime"],
    # the `vllm` judge backend (GPU). verl-omni's rollout brings its own vLLM-Omni (docs/verl_omni.md).
    "vllm": ["vllm==0.28.0"],
}

setup(
    name="digenrl-verl",
    version="0.1.0",
    description="DigenRL for verl: disaggregated Flow-GRPO / DanceGRPO training of diffusion models",
    packages=find_packages(include=["digenrl_verl", "digenrl_verl.*"]),
    package_data={"digenrl_verl": ["config/*.yaml", "config/preset/*.yaml", "schedule/golden/*.txt", "data/*.txt"]},
    python_requires=">=3.10",
    install_requires=INSTALL_REQUIRES,
    extras_require=EXTRAS,
    entry_points={
        "console_scripts": [
            "digenrl-train=digenrl_verl.main:main",
            "digenrl-sim=digenrl_verl.sim.cli:main",
        ],
        # the external-trainer hook of v0 main_diffusion (patches/verl-omni-a1139baf): trainer.trainer_class=digenrl
        "verl_omni.trainers": ["digenrl = digenrl_verl.integrations.verl_omni:DigenRLDiffusionTrainer"],
        # loaded by `import verl`: registers verl-omni's v1 trainer mode `digenrl` (no verl-omni file patched)
        "verl.plugins": ["digenrl = digenrl_verl.integrations.verl_plugin"],
        # the host CPU as vLLM's and vLLM-Omni's platform, resolved in every process (spawned diffusion workers too);
        # active only where no accelerator is visible, DIGENRL_CPU_PLATFORM=0 turns them off (platform/vllm_plugins.py)
        "vllm.platform_plugins": ["digenrl_cpu = digenrl_verl.platform.vllm_plugins:vllm_platform_plugin"],
        "vllm_omni.platform_plugins": ["digenrl_cpu = digenrl_verl.platform.vllm_plugins:omni_platform_plugin"],
        "vllm_omni.general_plugins": ["digenrl_cpu = digenrl_verl.platform.vllm_plugins:cpu_worker_plugin"],
    },
)
