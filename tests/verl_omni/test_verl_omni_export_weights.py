"""`TSPActorWorker.export_weights` sends every LoRA tensor of the adapter, whatever verl-omni's collector leaves out.

verl-omni a1139baf's FSDP2 collectors skip the root module's own layers (a DiT's ``img_in`` / ``proj_out`` under
``target_modules=all-linear``; fixed by ``patches/verl-omni-a1139baf/0004``, which the tier installs). On a verl-omni
without that patch the worker fills the gap from its own gather and names it in a warning; with the patch nothing
is added and nothing warned. Here the engine is a stand-in whose export leaves out the root's layers (as the
unpatched collector does), on a PEFT model; the worker's method is verl-omni's registered one. Fresh interpreter.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

pytest.importorskip("verl_omni", reason="no verl-omni (the verl-omni tier: scripts/test_verl_omni.sh)")
if str(Path(__file__).resolve().parent) not in sys.path:
    sys.path.append(str(Path(__file__).resolve().parent))
from _engine_harness import run_code  # noqa: E402

_SCRIPT = """
import json, sys, types, warnings
import peft, torch
from digenrl_verl.integrations.verl_omni_worker import TSPActorWorker


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.img_in = torch.nn.Linear(4, 4)
        self.transformer_blocks = torch.nn.ModuleList([torch.nn.Linear(4, 4)])


config = peft.LoraConfig(r=2, target_modules=["img_in", "transformer_blocks.0"], init_lora_weights=False)
module = peft.inject_adapter_in_model(config, Net(), adapter_name="default")
module.peft_config = {"default": config}
whole = {"transformer." + k: v for k, v in peft.get_peft_model_state_dict(module, adapter_name="default").items()}


def export(leave_out):
    def get_per_tensor_param(layered_summon=False, base_sync_done=False, adapter_name=None):
        return iter([(k, v) for k, v in whole.items() if leave_out is None or leave_out not in k]), config.to_dict()

    engine = types.SimpleNamespace(module=module, get_per_tensor_param=get_per_tensor_param)
    worker = types.SimpleNamespace(engine=engine)
    worker._lora_tensors = types.MethodType(TSPActorWorker._lora_tensors, worker)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        weights = TSPActorWorker.export_weights(worker)
    return {"names": sorted(weights), "whole": sorted(whole), "warnings": [str(w.message) for w in caught],
            "equal": all(torch.equal(weights[k], whole[k]) for k in whole if k in weights)}


print(json.dumps({"img_in": export("img_in"), "none": export(None)}))
"""


@pytest.fixture(scope="module")
def reports() -> dict:
    console = run_code(_SCRIPT, timeout=300)
    return json.loads(next(line for line in reversed(console.splitlines()) if line.startswith('{"img_in"')))


def test_the_tensors_the_collector_leaves_out_are_sent_and_named(reports):
    report = reports["img_in"]
    assert report["names"] == report["whole"] and len(report["whole"]) == 4 and report["equal"], report
    said = [w for w in report["warnings"] if "left out 2 adapter tensors" in w]
    assert said and "transformer.img_in.lora_A.weight" in said[0] and "0004" in said[0], report["warnings"]


def test_a_whole_collection_is_sent_as_it_is(reports):
    report = reports["none"]
    assert report["names"] == report["whole"] and report["equal"], report
    assert not [w for w in report["warnings"] if "left out" in w], report["warnings"]
