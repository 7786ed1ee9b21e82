"""verl-omni's reward keys → the plugin's `RewardConfig` and VLM judge (`reward.reward_functions`,
`reward.custom_reward_function`, `reward.reward_model.*`): the reward half of the verl-omni adapter
(`config.verl_omni` holds the key classes and the other builders; every key read goes through its `RecipeKeys`)."""

from __future__ import annotations

import importlib.util
import warnings
from pathlib import Path
from typing import Any

from digenrl_verl.config.digenrl import DigenRLConfig
from digenrl_verl.config.verl_omni import (
    DEVICES, DTYPES, RecipeKeys, at_least, changed_keys, check_cpu_processes, plan_for_cluster,
)
from digenrl_verl.rewards.base import KEY_REWARD_FUNCTIONS, get_reward, reward_names
from digenrl_verl.rewards.compose import RewardConfig
from digenrl_verl.rewards.data_source import default_reward
from digenrl_verl.rewards.ocr import INSTALL_HINT as OCR_INSTALL_HINT
from digenrl_verl.config.prompt_files import data_sources
from digenrl_verl.rewards.vlm_judge import (
    JUDGE_BACKENDS, JUDGE_FUNCTION, JUDGE_REWARD, KEY_BACKEND, KEY_ENABLE, KEY_MODEL_PATH, KEY_POOL, KEY_TP,
    VLLM_INSTALL_HINT, JudgeConfig, JudgePoolSpec, is_judge_function, judge_backend_unavailable, judge_family,
    resolve_judge_path,
)

#: reward.reward_functions when none is given and no custom file, for prompts of data_source `jpeg_compressibility`
#: or of none: verl-omni's default_compute_score_image scores that one source (`rewards.data_source.default_reward`)
DEFAULT_REWARD = {"jpeg_compressibility": 1.0}

# verl-omni's multi-reward sentinel: reward.custom_reward_function.name when reward.reward_functions holds the files
MULTI_REWARD_PLACEHOLDER = "_multi_reward_placeholder"
_RF = KEY_REWARD_FUNCTIONS
_ENTRY_KEYS = ("path", "name", "weight", "required")


_RM = "reward.reward_model"
#: `reward.reward_model.rollout.*` keys that set the vLLM judge's engine (`rewards.judge_vllm.engine_kwargs`)
JUDGE_ENGINE_KEYS = ("tensor_model_parallel_size", "gpu_memory_utilization", "enforce_eager", "dtype", "max_model_len",
                     "max_num_seqs", "max_num_batched_tokens", "prompt_length", "response_length")
#: the keys that size the judge's own pool (`enable_resource_pool=True` only)
JUDGE_POOL_KEYS = (f"{_RM}.n_gpus_per_node", f"{_RM}.nnodes")
JUDGE_SERVING_KEYS = (KEY_BACKEND, KEY_POOL, *JUDGE_POOL_KEYS, *(f"{_RM}.rollout.{k}" for k in JUDGE_ENGINE_KEYS))


def build_judge(keys: RecipeKeys, digenrl: DigenRLConfig) -> JudgeConfig | None:
    """`reward.reward_model.*` → the VLM judge (None when disabled): the model path resolved now (a local directory
    or a cached Hugging Face id) and its family checked, so a bad path fails before any worker starts; the backend
    (`rollout.name`: vllm, or null = transformers) and its engine settings; with `enable_resource_pool=True` its own
    pool of `n_gpus_per_node` x `nnodes` devices (`JudgePoolSpec`), its processes counted with the worker pools'."""
    enable = bool(keys(KEY_ENABLE))
    path = keys(KEY_MODEL_PATH)
    serving = {key: keys(key) for key in JUDGE_SERVING_KEYS}
    if not enable:
        for key in ([KEY_MODEL_PATH] if path is not None else []) + changed_keys(keys, JUDGE_SERVING_KEYS):
            warnings.warn(f"{key}={keys.peek(key)!r} has no effect: {KEY_ENABLE}=false", UserWarning, stacklevel=3)
        return None
    resolved = resolve_judge_path(path)
    family = judge_family(resolved)
    use_gpu = DEVICES.get(keys("trainer.device")) == "cuda"
    backend = _judge_backend(keys, serving, use_gpu, digenrl.dry_run)
    engine = _judge_engine(serving) if backend == "vllm" else {}
    colocated = _colocated_judge(keys, serving, digenrl, use_gpu)
    _warn_unused_judge_keys(keys, serving, backend, colocated is not None)
    pool = colocated
    if serving[KEY_POOL]:
        per_replica = engine.get("tensor_parallel_size", 1) if use_gpu else 1
        pool = JudgePoolSpec(nnodes=serving[f"{_RM}.nnodes"], per_node=serving[f"{_RM}.n_gpus_per_node"],
                             use_gpu=use_gpu, devices_per_replica=per_replica)
    if pool is not None:
        _check_judge_processes(pool, digenrl)
    judge = JudgeConfig(model_path=resolved, backend=backend, pool=pool, **engine).with_env_overrides()
    if pool is not None:
        keys.decide(_colocated_note(pool, judge) if pool.colocated else _pool_note(keys, pool))
    where = ("in its own Ray pool (the reward pool)" if pool is not None and not pool.colocated else
             "as replicas colocated on the worker pools' devices" if pool is not None else
             "in-process in each scoring worker (the generators)")
    shared = " of the GPU that holds the diffusion model" if pool is None else \
        " of each GPU it shares" if pool.colocated else ""
    how = (f"vLLM (tensor_parallel_size {judge.tensor_parallel_size}, gpu_memory_utilization "
           f"{judge.gpu_memory_utilization}{shared}"
           f", dtype {judge.dtype}, max_model_len {judge.max_model_len})"
           if backend == "vllm" else f"transformers generate ({judge.micro_batch_size} images per call)")
    keys.decide(f"{KEY_MODEL_PATH}={path!r}: a {family} judge ({resolved}) {where}, served by {how}; temperature "
                f"{judge.temperature}, top_p {judge.top_p}, at most {judge.max_new_tokens} new tokens")
    return judge


def _warn_unused_judge_keys(keys: RecipeKeys, serving: dict[str, Any], backend: str, colocated: bool) -> None:
    """Warn by name about the changed serving keys that the chosen serving does not use: the pool's size without
    the pool, vLLM's engine settings with the transformers judge (chosen, or fallen back to; a colocated judge's
    tensor_model_parallel_size still counts its replicas)."""
    if not serving[KEY_POOL]:
        where = "replicas colocated on the worker pools' devices" if colocated else "in each scoring worker"
        for key in changed_keys(keys, JUDGE_POOL_KEYS):
            warnings.warn(f"{key}={keys.peek(key)!r} has no effect with {KEY_POOL}=false: the judge runs {where} "
                          f"(set {KEY_POOL}=true to give it a pool of this size)", UserWarning, stacklevel=4)
    if backend != "vllm":
        fallback = " (fallen back to transformers)" if serving[KEY_BACKEND] == "vllm" else ""
        engine_keys = [k for k in JUDGE_ENGINE_KEYS if not (colocated and k == "tensor_model_parallel_size")]
        for key in changed_keys(keys, tuple(f"{_RM}.rollout.{k}" for k in engine_keys)):
            warnings.warn(f"{key}={keys.peek(key)!r} has no effect with {KEY_BACKEND}={serving[KEY_BACKEND]}"
                          f"{fallback}: the transformers judge holds one whole model per replica (vLLM engine "
                          f"settings apply to {KEY_BACKEND}=vllm)", UserWarning, stacklevel=4)


def _colocates(serving: dict[str, Any]) -> bool:
    """Whether the judge's replicas are colocated on the worker pools' devices: a vLLM judge of
    `tensor_model_parallel_size` > 1 (checked: an integer >= 1) without its own pool."""
    return (not serving[KEY_POOL] and serving[KEY_BACKEND] == "vllm"
            and at_least(KEY_TP, serving[KEY_TP], low=1) > 1)


def _colocated_judge(keys: RecipeKeys, serving: dict[str, Any], digenrl: DigenRLConfig,
                     use_gpu: bool) -> JudgePoolSpec | None:
    """A vLLM judge of `tensor_model_parallel_size` > 1 without its own pool (verl-omni's Qwen-Image OCR recipes:
    `REWARD_TP=4` on the training GPUs): replicas colocated on the worker pools' devices, as verl-omni puts its reward
    model on the `global_pool` (`devices // TP` replicas), on CPU too (transformers there: the same placement, one
    process per replica); None otherwise. The pools' nodes: one-node pools that fit on one node of
    `trainer.n_gpus_per_node` devices together share it (the derived single-node split), else each pool's nodes are
    its own. ValueError naming the key, before any worker starts, when the pools share GPUs (`gpu_fraction` < 1),
    their nodes differ in size, or a replica is wider than a node on GPUs; on CPU a replica wider than a node is
    narrowed to the node (warned: there TP only counts the replicas)."""
    if not _colocates(serving):
        return None
    tp = serving[KEY_TP]
    pools = [digenrl.pools[role] for role in digenrl.roles]
    shapes = ", ".join(f"{role} {digenrl.pools[role].nnodes} x {digenrl.pools[role].workers_per_node}"
                       for role in digenrl.roles)
    fix = f"set {KEY_POOL}=true (the judge's own pool: reward.reward_model.n_gpus_per_node / nnodes)"
    if any(p.shares_a_device for p in pools):
        raise ValueError(f"{KEY_TP}={tp} with {KEY_POOL}=false: the judge's replicas would share the worker pools' "
                         f"GPUs, and these pools share GPUs themselves (gpu_fraction < 1), so a node's distinct GPUs "
                         f"are not known before they are placed; {fix}")
    node_size = at_least("trainer.n_gpus_per_node", keys("trainer.n_gpus_per_node"), low=1)
    if all(p.nnodes == 1 for p in pools) and sum(p.workers_per_node for p in pools) <= node_size:
        nodes = [sum(p.workers_per_node for p in pools)]
    else:
        nodes = [p.workers_per_node for p in pools for _ in range(p.nnodes)]
    if len(set(nodes)) > 1:
        raise ValueError(f"{KEY_TP}={tp} with {KEY_POOL}=false: the judge's replicas would share the worker pools' "
                         f"devices, whose nodes differ in size ({shapes}); give the pools nodes of one size, or {fix}")
    per_node = nodes[0]
    if tp > per_node and not use_gpu:
        warnings.warn(f"{KEY_TP}={tp} with {KEY_POOL}=false on trainer.device=cpu: a replica would take {tp} of a "
                      f"node's {per_node} CPU workers ({shapes}); on CPU the judge runs one replica per {per_node} "
                      f"(the tensor-parallel degree only counts the replicas there); on GPUs it needs {tp} per node",
                      UserWarning, stacklevel=4)
        keys.decide(f"{KEY_TP}={tp} -> {per_node} on trainer.device=cpu: a colocated judge replica per node's "
                    f"{per_node} CPU workers")
        tp = per_node
    if tp > per_node:
        raise ValueError(f"{KEY_TP}={tp} with {KEY_POOL}=false: a judge replica takes {tp} GPUs of one node, and "
                         f"the worker pools hold {per_node} per node ({shapes}); lower {KEY_TP} to at most {per_node}, "
                         f"or {fix} with n_gpus_per_node >= {tp}")
    return JudgePoolSpec(nnodes=len(nodes), per_node=per_node, use_gpu=use_gpu, devices_per_replica=tp,
                         colocated=True)


def _colocated_note(pool: JudgePoolSpec, judge: JudgeConfig) -> str:
    """The plan's line for a judge colocated on the worker pools' devices: what it shares and what it costs."""
    note = (f"judge replicas ({KEY_TP}={pool.devices_per_replica}, {KEY_POOL}=false): {pool.describe()}, as verl-omni "
            "places its reward model on the training GPUs (global_pool); the scoring workers send the decoded images "
            "to the replicas actor-to-actor (SCORE stays on the generators)")
    if pool.use_gpu:
        note += (f"; each replica's vLLM takes {_RM}.rollout.gpu_memory_utilization={judge.gpu_memory_utilization} of "
                 "each of its GPUs next to the generators' and trainers' models, and computes beside them (it is not "
                 "put to sleep while the trainer trains, unlike verl-omni's colocated reward model); it starts once "
                 "the workers have joined, and vLLM stops at start-up when that much memory is not free then (memory "
                 "the workers take later, such as optimizer state at the first step, is not seen): lower it, or set "
                 f"{KEY_POOL}=true for GPUs of its own. A replica shares its node's fate: lost with the node, not "
                 "restarted")
    else:
        note += (f"; on CPU each replica is a whole copy of the judge model (transformers) in its own process: "
                 f"{pool.replicas} copies in memory")
    return note


def _pool_note(keys: RecipeKeys, pool: JudgePoolSpec) -> str:
    """The plan's reward-pool line; on CPU it says how many copies of the judge model that is."""
    note = (f"reward pool ({KEY_POOL}=True): {pool.describe()}, from {_RM}.n_gpus_per_node={pool.per_node} x "
            f"{_RM}.nnodes={pool.nnodes} on trainer.device={keys.peek('trainer.device')}; the scoring workers send the "
            "decoded images to the judge replicas actor-to-actor (SCORE stays on the generators)")
    if not pool.use_gpu:
        default = "" if changed_keys(keys, (f"{_RM}.n_gpus_per_node",)) else \
            f" ({_RM}.n_gpus_per_node={pool.per_node} is the default)"
        note += (f"; on CPU each replica is a whole copy of the judge model in its own process: {pool.replicas} "
                 f"copies in memory{default}; lower {_RM}.n_gpus_per_node for fewer")
    return note


def _judge_backend(keys: RecipeKeys, serving: dict[str, Any], use_gpu: bool, dry_run: bool) -> str:
    """`reward.reward_model.rollout.name` → the judge backend. vllm on trainer.device=cpu: the transformers backend
    instead, whatever is installed (warned, in the plan); on cuda where vLLM cannot run: a ValueError naming the key
    and the fix (a dry run plans for the cluster: a decision)."""
    name = serving[KEY_BACKEND]
    backend = "transformers" if name is None else str(name)
    if backend not in JUDGE_BACKENDS:
        raise ValueError(f"unknown {KEY_BACKEND}={backend!r}; valid: {list(JUDGE_BACKENDS)} (null: transformers; "
                         "verl-omni's recipes serve the judge with vllm)")
    if backend != "vllm":
        return backend
    if not use_gpu:
        why = judge_backend_unavailable(backend) or "vLLM judges on CUDA only"
        unused = f"vLLM's memory settings are not used; {KEY_TP} still counts the replicas colocated on the workers" \
            if _colocates(serving) else f"{KEY_TP} and vLLM's memory settings are not used"
        note = (f"{KEY_BACKEND}=vllm -> transformers: trainer.device=cpu ({why}); the judge runs with transformers' "
                f"generate instead (same checkpoint, chat, sampling and score; one whole model per replica, so "
                f"{unused}). Fix: trainer.device=cuda ({VLLM_INSTALL_HINT}), "
                f"or set {KEY_BACKEND}=transformers to choose it")
        warnings.warn(note, UserWarning, stacklevel=4)
        keys.decide(note)
        return "transformers"
    why = judge_backend_unavailable(backend)
    if why is not None and not dry_run:
        raise ValueError(f"{KEY_BACKEND}=vllm cannot be used here: {why}. Fix: {VLLM_INSTALL_HINT}, or set "
                         f"{KEY_BACKEND}=transformers (transformers' generate, CPU or GPU)")
    if why is not None:
        plan_for_cluster(keys, f"{KEY_BACKEND}=vllm", "vLLM", why)
    return backend


def _judge_engine(serving: dict[str, Any]) -> dict[str, Any]:
    """The vLLM judge's engine settings (`JudgeConfig` fields) from `reward.reward_model.rollout.*`; max_model_len
    null is prompt_length + response_length, as verl's vLLM server sizes it."""
    def rollout(name: str) -> Any:
        return serving[f"{_RM}.rollout.{name}"]

    max_len = rollout("max_model_len")
    if max_len is None and rollout("prompt_length") and rollout("response_length"):
        max_len = int(rollout("prompt_length")) + int(rollout("response_length"))
    dtype = str(rollout("dtype") or "bfloat16")
    if dtype not in DTYPES:
        raise ValueError(f"{_RM}.rollout.dtype={dtype!r}; valid: {sorted(DTYPES)}")
    memory = rollout("gpu_memory_utilization")
    if isinstance(memory, bool) or not isinstance(memory, (int, float)):
        raise ValueError(f"{_RM}.rollout.gpu_memory_utilization={memory!r} must be a number in (0, 1]: the share of "
                         "each of its GPUs that the vLLM judge takes (verl's default 0.5)")
    counts = {name: None if rollout(name) is None else at_least(f"{_RM}.rollout.{name}", rollout(name), low=1)
              for name in ("max_num_seqs", "max_num_batched_tokens")}
    return {"tensor_parallel_size": at_least(KEY_TP, serving[KEY_TP], low=1), "gpu_memory_utilization": float(memory),
            "enforce_eager": bool(rollout("enforce_eager")), "dtype": DTYPES[dtype], "max_model_len": max_len, **counts}


def _check_judge_processes(pool: JudgePoolSpec, digenrl: DigenRLConfig) -> None:
    """The judge's CPU processes count with the CPU worker pools' against one limit (`check_cpu_processes`)."""
    if pool.use_gpu:
        return
    workers = sum(digenrl.pools[r].size for r in digenrl.roles if not digenrl.pools[r].use_gpu)
    if pool.colocated:
        sizing, fix = (f"{KEY_TP}={pool.devices_per_replica} with {KEY_POOL}=false on trainer.device=cpu: "
                       f"{pool.replicas} judge processes colocated with the {workers} of the worker pools",
                       f"set {KEY_TP}=1 (the judge then runs inside each scoring worker, no process of its own), "
                       "lower trainer.n_gpus_per_node / trainer.nnodes, or set trainer.device=cuda")
    else:
        sizing, fix = (f"{KEY_POOL}=True on trainer.device=cpu: {_RM}.n_gpus_per_node={pool.per_node} x {_RM}.nnodes="
                       f"{pool.nnodes} = {pool.replicas} judge processes + {workers} of the worker pools",
                       f"lower {_RM}.n_gpus_per_node, or set trainer.device=cuda")
    check_cpu_processes(workers + pool.replicas, sizing, fix)


def _function_entries(functions: dict) -> tuple[dict[str, Any], dict[str, tuple[str, str]]]:
    """`reward.reward_functions` → (name → weight, name → (file, function)): a number is a registered reward's
    weight; a mapping is verl-omni's `{path, name, weight, required}` entry of a function in a file."""
    weights: dict[str, Any] = {}
    files: dict[str, tuple[str, str]] = {}
    for name, entry in functions.items():
        if not isinstance(entry, dict):
            weights[name] = entry
            continue
        extra = sorted(set(entry) - set(_ENTRY_KEYS))
        if extra:
            raise ValueError(f"{_RF}.{name}: {extra} would be extra arguments of the function, which digenrl_verl does "
                             f"not pass; remove them (an entry takes {list(_ENTRY_KEYS)})")
        if not entry.get("path"):
            raise ValueError(f"{_RF}.{name}.path is not set: give the file that defines the function")
        weights[name] = float(entry.get("weight", 1.0))
        files[name] = (str(entry["path"]), str(entry.get("name") or "compute_score"))
    if files and not all(str(e.get("required", False)).lower() == "true" for e in functions.values()
                         if isinstance(e, dict)):
        warnings.warn(f"{_RF}.*.required: a reward function that raises fails its scoring task here (retried, then the "
                      "run stops), as verl-omni's required=true; verl-omni's default required=false would score it 0",
                      UserWarning, stacklevel=3)
    return weights, files


def _judge_note(where: str, function: str) -> str:
    return (f"{where}:{function} (verl-omni's judge-backed OCR reward) is scored by digenrl_verl's VLM judge "
            "(same instruction, sampling and Levenshtein score; the file is not loaded)")


def build_reward(keys: RecipeKeys, digenrl: DigenRLConfig) -> RewardConfig:
    """`reward.*` → the run's reward; `digenrl`: the section with its pools (the judge's process count, dry run)."""
    custom = keys.section("reward.custom_reward_function", ("path", "name"))
    functions = keys(_RF)
    judge = build_judge(keys, digenrl)
    files: dict[str, tuple[str, str]] = {}
    if functions is not None:
        functions, files = _function_entries(functions)
    if files and custom.get("name") == MULTI_REWARD_PLACEHOLDER:
        warnings.warn(f"reward.custom_reward_function {custom.get('path')}:{MULTI_REWARD_PLACEHOLDER} is verl-omni's "
                      f"multi-reward placeholder: the reward is the weighted sum of {_RF} {sorted(files)}", UserWarning,
                      stacklevel=2)
        custom = {}
    if judge is not None and custom.get("path"):
        function = custom.get("name") or "compute_score"
        if not is_judge_function(custom["path"], function):
            raise ValueError(
                f"{KEY_ENABLE}=True with reward.custom_reward_function {custom['path']}:{function}: verl-omni hands "
                "such a function the address of its served reward model; digenrl_verl runs the judge itself and "
                f"scores it as verl-omni's {':'.join(JUDGE_FUNCTION)} does: point reward.custom_reward_function at "
                f"that function (or set {_RF}={{{JUDGE_REWARD}: 1.0}}), or set {KEY_ENABLE}=false")
        warnings.warn(_judge_note(f"reward.custom_reward_function {custom['path']}", function) +
                      f": reward {JUDGE_REWARD!r}", UserWarning, stacklevel=2)
        custom = {}
        functions = {**(functions or {}), JUDGE_REWARD: 1.0}
    if not functions and not custom.get("path"):  # the YAML default, {} as verl-omni's
        functions = _default_reward(keys)
    functions = functions or {}
    reward = RewardConfig(reward_functions=dict(functions), aggregation=keys("reward.aggregation"),
                          custom_reward_function_path=custom.get("path"),
                          custom_reward_function_name=custom.get("name") or "compute_score", reward_model=judge,
                          function_files=files)
    judged = [name for name, f in files.items() if is_judge_function(*f)]
    for name in judged:
        warnings.warn(_judge_note(f"{_RF}.{name} {files[name][0]}", files[name][1]), UserWarning, stacklevel=2)
    if judge is not None and JUDGE_REWARD not in reward.weights() and not judged:
        warnings.warn(f"{KEY_ENABLE}=True has no effect: no reward uses the judge (add {JUDGE_REWARD} to {_RF})",
                      UserWarning, stacklevel=2)
    for name in reward.weights():
        if name in ("custom", JUDGE_REWARD) or name in files:
            continue
        if name not in reward_names():
            get_reward(name)  # ValueError listing the valid reward names
        if name == "ocr" and _missing("rapidocr_onnxruntime"):  # checked without loading the OCR models
            raise ValueError(f"{_RF} names 'ocr': {OCR_INSTALL_HINT}")
    for name, (path, _) in files.items():
        if name not in judged and not Path(path).is_file():
            raise ValueError(f"{_RF}.{name}.path={path!r} is not a file")
    if reward.custom_reward_function_path and not Path(reward.custom_reward_function_path).is_file():
        raise ValueError(f"reward.custom_reward_function.path={reward.custom_reward_function_path!r} is not a file")
    return reward


def _default_reward(keys: RecipeKeys) -> dict[str, float]:
    """verl-omni's default reward for the data sources of the prompts it would score: the training prompts, and the
    validation prompts (data.val_files) when validation runs; a source it cannot score fails here, before any worker
    starts (`rewards.data_source.default_reward`)."""
    source_key = str(keys.peek("data.reward_fn_key"))
    files = [("data.train_files", keys.peek("data.train_files"))]
    test_freq = keys.peek("trainer.test_freq")
    validates = bool(keys.peek("trainer.val_before_train")) or (isinstance(test_freq, int) and test_freq > 0)
    if validates and keys.peek("data.val_files") is not None:
        files.append(("data.val_files", keys.peek("data.val_files")))
    functions: dict[str, float] = {}
    lines = []
    for where, value in files:
        sources, without = data_sources(value, source_key)
        weights, line = default_reward(sources, without, where, source_key)
        functions.update(weights)
        lines.append(line if len(files) == 1 else f"{where}: {line}")
    for line in lines:
        keys.decide(line)
    return functions


def _missing(module: str) -> bool:
    return importlib.util.find_spec(module) is None
