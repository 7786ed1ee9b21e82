"""The accumulating actor worker (`digenrl_verl.integrations.verl_omni_worker.TSPActorWorker`) against verl-omni's
own `TrainingWorker.train_mini_batch`.

Two workers are built in one process the way verl-omni's `ActorRolloutRefWorker.init_model` builds its actor (its
Hydra model / actor configs -> `TrainingWorkerConfig`, `reset()`, `set_loss_fn(diffusion_loss)`), fsdp2, fp32, the
CPU platform with the gloo group started first, from the same tiny Qwen-Image directory and the same weights
(LoRA factors set to the same random values). verl-omni's worker runs `train_mini_batch` over micro-batches A+B as
ONE mini-batch (2 micro-batches of MICRO rows per rank: its loss divided by 2 x T); ours runs `accumulate(A)`,
`accumulate(B)`, `optimizer_step()`. Twice (Adam state and the warm-up LR schedule carry over). Checked after
each step: every parameter (max |w - w_ref| / max |w_ref| <= 1e-6, and the update itself, max |dw - dw_ref| /
max |dw_ref|), grad_norm and lr. Then `export_weights()` against the engine's parameters.

Mutations (each must fail): ``step_each`` steps after each micro-batch (2 optimizer steps per mini-batch);
``scale`` declares 1 micro-batch per step (each loss divided by T only: twice the gradient).
Each case runs in a fresh interpreter (this file as a script: the platform is chosen before verl is imported).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

if __name__ != "__main__":
    pytest.importorskip("verl_omni", reason="no verl-omni (the verl-omni tier: scripts/test_verl_omni.sh)")
if str(Path(__file__).resolve().parent) not in sys.path:  # pytest's importlib mode leaves this folder out
    sys.path.append(str(Path(__file__).resolve().parent))
from _engine_harness import (  # noqa: E402
    finish_rank, hydra_configs, init_gloo, near_policy, rel, rollout_batch, run_main, run_script, same_weights,
    tiny_qwen_dir, trainable_params, with_meta)

NUM_STEPS, MICRO, HEIGHT, ROUNDS = 3, 2, 64, 3
TOLERANCE = 1e-6


# ---------------------------------------------------------------- the worker process

def _actor_config(model_dir: str, lora: bool, world: int, sp: int = 1):
    model_config, actor_config = hydra_configs(
        model_dir, lora=lora, loss_mode="flow_grpo", num_steps=NUM_STEPS, height=HEIGHT, micro=MICRO, world=world,
        optim=["optim.lr=1e-3", "optim.lr_warmup_steps=4", "optim.total_training_steps=10", "grad_clip=1.0"],
        actor_extra=(f"fsdp_config.ulysses_sequence_parallel_size={sp}",) if sp > 1 else ())
    actor_config.model_config = model_config
    return actor_config


def _build(cls, actor_config, env: dict):
    """A worker as verl-omni's ActorRolloutRefWorker.init_model builds its actor; `env` picks the engine."""
    from copy import deepcopy
    from functools import partial

    from verl.workers.config import TrainingWorkerConfig
    from verl_omni.workers.utils.losses import diffusion_loss

    config = deepcopy(actor_config)
    training_config = TrainingWorkerConfig(model_type="diffusion_model", model_config=config.model_config,
                                           engine_config=config.engine, optimizer_config=config.optim,
                                           checkpoint_config=config.checkpoint)
    training_config.engine_config.micro_batch_size_per_gpu = MICRO
    training_config.engine_config.infer_micro_batch_size_per_gpu = MICRO
    for key in ("VERL_ENGINE_DEVICE", "VERL_ENGINE_VENDOR"):
        os.environ.pop(key, None)
    os.environ.update(env)
    worker = cls(config=training_config)
    worker.reset()
    worker.set_loss_fn(partial(diffusion_loss, config=config))
    return worker


def _with_meta(td, **extra):
    return with_meta(td, micro=MICRO, height=HEIGHT, **extra)


def _ours_step(worker, part_a, part_b, mutation: str) -> dict:
    """accumulate(A), accumulate(B), optimizer_step() (or a mutation of it); the step's grad_norm / lr."""
    declared = 1 if mutation == "scale" else 2
    worker.accumulate(_with_meta(part_a, grad_accum_micro_batches=declared))
    if mutation == "step_each":
        worker.optimizer_step(update_lr_scheduler=False)
    worker.accumulate(_with_meta(part_b, grad_accum_micro_batches=declared))
    return worker.optimizer_step()


def _export_check(worker, lora: bool) -> dict:
    """export_weights() against the engine's parameters: every exported tensor equal (in the export's dtype) to
    the parameter of its name; which trainable (LoRA) parameters were not exported."""
    weights = worker.export_weights()
    params = {f"transformer.{n}": p for n, p in trainable_params(worker.engine).items()}
    wanted = {n for n in params if "lora_" in n or not lora}
    report = {"exported": len(weights), "matched": 0, "export_err": 0.0, "unmatched": [], "dtypes": []}
    seen = set()
    for name, tensor in weights.items():
        key = name if name in params else name.replace(".weight", ".default.weight").replace(".bias", ".default.bias")
        if key not in params:
            report["unmatched"].append(name)
            continue
        seen.add(key)
        report["matched"] += 1
        ref = params[key]
        err = float((tensor - ref.to(tensor.dtype)).abs().max().float() / ref.abs().max().clamp_min(1e-30))
        report["export_err"] = max(report["export_err"], err)
        report["dtypes"] = sorted(set(report["dtypes"]) | {str(tensor.dtype)})
    report["not_exported"] = sorted(wanted - seen)
    report["wanted"] = len(wanted)
    report["non_lora"] = [n for n in weights if "lora_" not in n][:5]
    return report


def _recompute_check(rank: int, world: int, args: dict) -> dict:
    """`recompute` (the old-log-prob pass) against verl-omni's stock `infer_batch` on the same weights and batch:
    with no accumulation open, and between two accumulations (train mode kept); under Ulysses SP every rank of the
    group must get the source rank's outputs. verl-omni returns them on the source rank only (None elsewhere): the
    source's reference log-probs are sent to every rank of its group, and each rank's outputs are compared with
    them. Every rank's largest relative error, gathered. Mutation ``rank1``: rank 1's shared outputs perturbed."""
    import torch
    from verl.utils import tensordict_utils as tu
    from verl_omni.workers.engine_workers import TrainingWorker

    from digenrl_verl.integrations.verl_omni_worker import TSPActorWorker

    actor_config = _actor_config(args["model_dir"], args["lora"], world, args["sp"])
    stock = _build(TrainingWorker, actor_config, {"VERL_ENGINE_DEVICE": "cuda"})
    ours = _build(TSPActorWorker, actor_config, {"VERL_ENGINE_VENDOR": "digenrl_tsp"})
    if args["mutation"] == "rank1" and rank == 1:
        share = ours._share_in_sp_group
        ours._share_in_sp_group = lambda output, shapes: _perturbed(share(output, shapes))
    same_weights([stock.engine, ours.engine], args["lora"])
    dp_rank = rank // args["sp"]  # an SP group's ranks hold the same samples
    td = rollout_batch(actor_config.model_config, 2 * MICRO, seed=7 + dp_rank, num_steps=NUM_STEPS, height=HEIGHT,
                       random_old=False)
    mine = ours.engine.ulysses_sequence_parallel_size <= 1 or ours.engine.is_mp_src_rank_with_outputs()
    ref = stock.infer_batch(_with_meta(td, compute_loss=False))  # None on an SP group's other ranks
    assert (ref is not None) == bool(mine), (rank, mine)
    lp = _source_log_probs(ours, ref, td)
    closed = ours.recompute(_with_meta(td))  # every rank makes the same collective calls, in the same order
    part_a = tu.index_select_tensor_dict(td, torch.arange(0, MICRO))
    ours.accumulate(_with_meta(part_a, grad_accum_micro_batches=2))
    opened = ours.recompute(_with_meta(td))

    def err(out) -> float:
        return float((tu.get(out, "log_probs").float() - lp).abs().max() / lp.abs().max())

    row = {"rank": rank, "source": bool(mine), "closed": err(closed), "open": err(opened),
           "ref_norm": float(lp.norm()), "mean_shape": list(tu.get(opened, "prev_sample_mean").shape)}
    rows = [None] * world
    torch.distributed.all_gather_object(rows, row)
    return {"ranks": rows}


def _source_log_probs(worker, ref, td):
    """verl-omni's reference log-probs as the SP group's source rank computed them, on every rank of the group (sent
    over the gloo group, independently of the worker's own sharing); without SP, this rank's own."""
    import torch
    from verl.utils import tensordict_utils as tu

    if worker.engine.ulysses_sequence_parallel_size <= 1:
        return tu.get(ref, "log_probs").float()
    group = worker.engine.ulysses_device_mesh.get_group(mesh_dim="ulysses")
    shape = tuple(td["all_timesteps"].shape)
    lp = tu.get(ref, "log_probs").float().contiguous() if ref is not None else torch.full(shape, float("nan"))
    torch.distributed.broadcast(lp, src=torch.distributed.get_global_rank(group, 0), group=group)
    assert torch.isfinite(lp).all()
    return lp


def _perturbed(out):
    """The mutation: a rank's shared log-probs off by 1e-3 of their scale."""
    from verl.utils import tensordict_utils as tu

    lp = tu.get(out, "log_probs")
    lp += 1e-3 * lp.abs().max()
    return out


def worker(rank: int, world: int, port: int, args: dict) -> None:
    init_gloo(rank, world, port, DIGENRL_TSP_CHUNK_SIZE=str(MICRO * 2))
    if args.get("mode") == "recompute":
        finish_rank(rank, args, _recompute_check(rank, world, args))
        return
    import torch
    from verl.utils import tensordict_utils as tu
    from verl_omni.workers.engine_workers import TrainingWorker

    from digenrl_verl.integrations.verl_omni_worker import TSPActorWorker

    actor_config = _actor_config(args["model_dir"], args["lora"], world)
    stock = _build(TrainingWorker, actor_config, {"VERL_ENGINE_DEVICE": "cuda"})  # verl-omni's stock engine
    ours = _build(TSPActorWorker, actor_config,
                  {"VERL_ENGINE_VENDOR": "digenrl_tsp"} if args["engine"] == "tsp" else {"VERL_ENGINE_DEVICE": "cuda"})
    same_weights([stock.engine, ours.engine], args["lora"])
    td = rollout_batch(actor_config.model_config, 2 * MICRO, seed=7 + rank, num_steps=NUM_STEPS, height=HEIGHT,
                       random_old=False)
    near_policy(stock.engine, td, _with_meta(td), seed=11 + rank)
    report = {"engines": [type(stock.engine).__name__, type(ours.engine).__name__], "steps": []}
    before = trainable_params(stock.engine)
    for _ in range(ROUNDS):
        whole = _with_meta(td, mini_batch_size=2 * MICRO * world, epochs=1, seed=1,
                           dataloader_kwargs={"shuffle": False})
        ref_metrics = tu.get(stock.train_mini_batch(whole), "metrics")
        part_a, part_b = (tu.index_select_tensor_dict(td, torch.arange(i * MICRO, (i + 1) * MICRO)) for i in (0, 1))
        step = _ours_step(ours, part_a, part_b, args["mutation"])
        ref, got = trainable_params(stock.engine), trainable_params(ours.engine)
        report["steps"].append({
            "weight_err": rel(got, ref),
            "update_max": max(float((got[n] - before[n]).abs().max()) for n in got),
            "update_err": rel({n: got[n] - before[n] for n in got}, {n: ref[n] - before[n] for n in ref}),
            "grad_norm": [float(ref_metrics["grad_norm"][-1] if isinstance(ref_metrics["grad_norm"], list)
                                else ref_metrics["grad_norm"]), step["grad_norm"]],
            "lr": [float(ref_metrics["lr"][-1] if isinstance(ref_metrics["lr"], list) else ref_metrics["lr"]),
                   step["lr"]], "micro_batches": step["micro_batches"]})
        before = ref
    report["export"] = _export_check(ours, args["lora"])
    finish_rank(rank, args, report)


if __name__ == "__main__":
    run_main(worker, sys.argv[1:])


# ---------------------------------------------------------------- the tests

@pytest.fixture(scope="module")
def qwen_dir(tmp_path_factory) -> str:
    return tiny_qwen_dir(tmp_path_factory, "accum_worker")


def run_case(model_dir: str, tmp_path: Path, *, lora: bool, engine: str = "stock", world: int = 1,
             mutation: str = "", mode: str = "", sp: int = 1) -> dict:
    out = tmp_path / f"report-{lora}-{engine}-{world}-{mutation}-{mode}-{sp}.json"
    args = dict(model_dir=model_dir, lora=lora, engine=engine, world=world, mutation=mutation, mode=mode, sp=sp,
                out=str(out))
    return run_script(__file__, args,
                      f"accumulating worker lora={lora} engine={engine} world={world} mutation={mutation!r}")


def _steps_match(report: dict, update_tolerance: float) -> bool:
    assert report["steps"][-1]["update_max"] > 0, report  # the reference moved (warm-up: the first lr is 0)
    for step in report["steps"]:
        ref_norm, norm = step["grad_norm"]
        if not (step["weight_err"] <= TOLERANCE and step["update_err"] <= update_tolerance
                and abs(norm - ref_norm) <= 1e-5 * abs(ref_norm) and step["lr"][0] == pytest.approx(step["lr"][1])):
            return False
    return True


def _check_export(report: dict, lora: bool) -> None:
    export = report["export"]
    assert export["exported"] > 0 and export["matched"] == export["exported"] and not export["unmatched"], export
    assert export["export_err"] == 0.0, export  # equal in the export's dtype (verl-omni sends DTensors as bf16)
    assert not export["not_exported"], export
    if lora:
        assert not export["non_lora"], export


@pytest.mark.slow
@pytest.mark.parametrize("lora", [False, True], ids=["full", "lora"])
def test_accumulate_then_step_equals_train_mini_batch(qwen_dir, tmp_path, lora):
    report = run_case(qwen_dir, tmp_path, lora=lora)
    assert report["engines"] == ["PPODiffusersFSDPEngine", "PPODiffusersFSDPEngine"], report
    assert all(step["micro_batches"] == 2 for step in report["steps"]), report
    assert _steps_match(report, update_tolerance=1e-5), report
    _check_export(report, lora)


@pytest.mark.slow
def test_accumulate_on_the_tsp_engine(qwen_dir, tmp_path):
    report = run_case(qwen_dir, tmp_path, lora=True, engine="tsp")
    assert report["engines"] == ["PPODiffusersFSDPEngine", "TSPDiffusersFSDPEngine"], report
    assert _steps_match(report, update_tolerance=1e-3), report  # Adam's first steps amplify the TSP's 1e-7 grads


@pytest.mark.slow
@pytest.mark.parametrize("mutation", ["step_each", "scale"])
def test_mutations_fail(qwen_dir, tmp_path, mutation):
    assert not _steps_match(run_case(qwen_dir, tmp_path, lora=False, mutation=mutation), update_tolerance=1e-5)


@pytest.mark.slow
def test_world_size_2(qwen_dir, tmp_path):
    # full fine-tune (the LoRA export at world size 2 goes through the worker's own gather, as at world size 1)
    report = run_case(qwen_dir, tmp_path, lora=False, world=2)
    assert _steps_match(report, update_tolerance=1e-5), report
    _check_export(report, lora=False)


@pytest.mark.slow
@pytest.mark.parametrize("world,sp", [(1, 1), (2, 2)], ids=["world1", "sp2"])
def test_recompute_equals_verl_omnis_infer_batch_open_or_not(qwen_dir, tmp_path, world, sp):
    """The old-log-prob pass the trainer pool runs between accumulations (train mode kept, so offload never moves
    the accumulated gradients) gives verl-omni's `infer_batch` numbers; under Ulysses SP 2 both ranks of the group
    get them (verl-omni returns them on the source rank only)."""
    report = run_case(qwen_dir, tmp_path, lora=True, engine="tsp", world=world, mode="recompute", sp=sp)
    assert _recompute_matches(report, world), report


def _recompute_matches(report: dict, world: int) -> bool:
    rows = report["ranks"]
    assert len(rows) == world and sum(r["source"] for r in rows) == 1, rows  # one source rank per SP group
    assert len({r["ref_norm"] for r in rows}) == 1 and rows[0]["ref_norm"] > 0, rows  # one reference: the source's
    assert all(r["mean_shape"][:2] == [2 * MICRO, NUM_STEPS] for r in rows), rows
    return all(r["closed"] <= 1e-6 and r["open"] <= 1e-6 for r in rows)


@pytest.mark.slow
def test_recompute_sp2_mutation_on_rank_1_fails(qwen_dir, tmp_path):
    """Rank 1 (not the source) with outputs off by 1e-3: the check must see it."""
    report = run_case(qwen_dir, tmp_path, lora=True, engine="tsp", world=2, mode="recompute", sp=2,
                      mutation="rank1")
    assert not _recompute_matches(report, 2), report
    assert [r["closed"] > 1e-4 for r in report["ranks"]] == [False, True], report
