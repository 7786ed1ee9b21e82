"""A 3-node Ray cluster on this machine (driver node, generator node, trainer node; `ray.cluster_utils.Cluster`):
the tiny disaggregated job places its pools by custom resource, rendezvous and weight sync cross nodes, and losing
the generator node ends as documented (README, "Running on an existing Ray cluster"): the lost GEN is re-issued,
the trainer generates the rest (TAG), every sample is trained once, the checkpoints stay, and the replacement the
elastic pool asks for waits for a node with the generator label.

The cluster and both runs live in one subprocess (`multinode_cluster_job.py`): the session's Ray instance is
single-node. Each test reads the one report.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from digenrl_verl.metric_names import METRICS as M

pytestmark = pytest.mark.slow  # starts a 3-node Ray cluster and two training runs

JOB = Path(__file__).with_name("multinode_cluster_job.py")
HEAD_IP, GEN_IP, TRN_IP = "127.0.0.1", "127.0.0.2", "127.0.0.3"
SAMPLES_PER_STEP = 8  # data.train_batch_size=2 x rollout.n=4


@pytest.fixture(scope="module")
def report(tiny_flux_dir, tmp_path_factory):
    out = tmp_path_factory.mktemp("multinode")
    env = dict(os.environ, RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER="0")
    env.pop("RAY_ADDRESS", None)
    proc = subprocess.run([sys.executable, str(JOB), str(tiny_flux_dir), str(out)], env=env, capture_output=True,
                          text=True, timeout=1500)
    assert proc.returncode == 0, proc.stderr[-6000:]
    (out / "report.json").write_text(proc.stdout.strip().splitlines()[-1])
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _schedule(run: dict) -> list[tuple]:
    return [(round(c["start"], 3), round(c["end"], 3), c["kind"], c["step"], c["mb"], c["workers"], c["ok"])
            for c in run["completions"]]


def _trained_once(run: dict) -> None:
    counts: dict[tuple[int, int], int] = {}
    for c in run["completions"]:
        if c["ok"] and c["kind"] == "UPDATE":
            for s in c["samples"]:
                counts[(c["step"], s)] = counts.get((c["step"], s), 0) + 1
    assert counts == {(st, s): 1 for st in (0, 1) for s in range(SAMPLES_PER_STEP)}


def test_three_nodes_pools_on_their_nodes_rendezvous_on_the_trainer_node(report):
    nodes = {n["address"]: n for n in report["nodes"]}
    assert set(nodes) == {HEAD_IP, GEN_IP, TRN_IP}
    assert nodes[GEN_IP]["resources"].get("digenrl_gen") == 1 and nodes[TRN_IP]["resources"].get("digenrl_trn") == 1
    run = report["healthy"]
    assert run["placement"] == {"gen:0": GEN_IP, "trn:0": TRN_IP}
    # the process group's rendezvous is trainer rank 0's node, not the driver's: in the worker group, in what the
    # workers joined, in trainer rank 0's environment
    rdv = run["rendezvous"]
    assert rdv["master_addr"] == rdv["collective_master_addr"] == rdv["trainer0_env_master_addr"] == TRN_IP
    assert TRN_IP != report["driver_node"]
    assert run["steps"] == [0, 1] and run["dead"] == []
    _trained_once(run)
    # the weight sync crossed nodes: the generator holds the trainer's weights of the last version
    trn, gen = run["checksums"]["trn:0"], run["checksums"]["gen:0"]
    assert trn["version"] == gen["version"] == 2 and trn["checksum"] == gen["checksum"]
    syncs = [c for c in run["completions"] if c["kind"] == "SYNC"]
    assert [c["ok"] for c in syncs] == [True, True] and all("gen:0" in c["workers"] for c in syncs)
    assert {k: v["global_step"] for k, v in run["checkpoints"].items()} == {"global_step_1": 1, "global_step_2": 2}


def test_losing_the_generator_node_reissues_its_work_on_the_trainer_and_keeps_the_checkpoints(report):
    run = report["node_lost"]
    assert run["placement"]["trn:0"] == TRN_IP and run["placement"]["gen:0"] is None  # its node is gone
    # the driver saw the actor's calls fail (socket closed) at once; Ray's GCS lists the node dead later
    assert report["node_dead_after_s"] is not None
    assert {n["address"]: n["alive"] for n in report["nodes_after"]}[GEN_IP] is False
    comps = run["completions"]
    lost = run["lost_at"]
    # the first failure names the dead generator: the GEN in flight, or (when that GEN finished before the node went
    # down) the SCORE that followed it on the generator
    failed = [c for c in comps if not c["ok"]]
    assert failed and failed[0]["kind"] in ("GEN", "SCORE") and failed[0]["step"] == 1, _schedule(run)
    assert "gen:0" in failed[0]["info"]["dead_workers"] and run["dead"] == ["gen:0"]
    assert any(d["action"] == "dead" for d in run["decisions"])
    # once the driver knows, nothing runs on the generator: the trainer generates (TAG) and scores the rest of step 1
    detected = failed[0]["end"]
    after = [c for c in comps if c["start"] >= detected and c["ok"]]
    assert after and all(c["workers"] == ["trn:0"] for c in after), _schedule(run)
    assert any(c["kind"] == "TAG" and c["step"] == 1 for c in after), _schedule(run)
    assert all(c["start"] < lost for c in comps if c["ok"] and "gen:0" in c["workers"] and c["kind"] != "GEN")
    assert run["steps"] == [0, 1]
    _trained_once(run)
    # nothing lost from the last checkpoint: step 0's (version 1) was written before the loss and kept, the run went
    # on from there to version 2 and checkpointed it too
    ckpt = {c["step"]: c for c in comps if c["kind"] == "CKPT"}
    assert ckpt[0]["ok"] and ckpt[0]["end"] <= lost
    assert {k: v["global_step"] for k, v in run["checkpoints"].items()} == {"global_step_1": 1, "global_step_2": 2}
    assert run["checksums"]["trn:0"]["version"] == 2
    assert run["history"][-1][M["workers_dead"]] == 1
    # the elastic pool asked for a replacement in the dead generator's placement-group bundle; that bundle's node is
    # gone and no other node has the label, so it is still waiting at the end (it never joined, nothing ran on it)
    assert run["supervisor"]["restarts"] == {"gen:0": 1} and run["supervisor"]["pending"] == ["gen:0"]
