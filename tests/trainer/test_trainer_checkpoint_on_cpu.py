"""Checkpoint files: safetensors round trip, atomic commit, keep-last-N, crash mid-write."""

import pytest
import torch

import digenrl_verl.trainer.checkpoint as ckpt
import digenrl_verl.weights.state as state_files


def _model_and_opt(seed):
    torch.manual_seed(seed)
    m = torch.nn.Linear(3, 2)
    opt = torch.optim.AdamW(m.parameters(), lr=1e-2)
    m(torch.randn(4, 3)).sum().backward()
    opt.step()
    opt.zero_grad()
    return m, opt


def _save(writer, m, opt, step):
    tmp = writer.begin(step)
    ckpt.save_trainer_state(tmp, dict(m.named_parameters()), opt)
    return writer.commit(tmp, step, {"global_step": step})


def test_round_trip_restores_weights_optimizer_and_rng(tmp_path):
    m, opt = _model_and_opt(0)
    path = _save(ckpt.CheckpointWriter(tmp_path), m, opt, 1)
    rng_after_save = torch.rand(3)
    m2, opt2 = _model_and_opt(1)
    ckpt.load_trainer_state(path, dict(m2.named_parameters()), opt2)
    assert torch.equal(torch.rand(3), rng_after_save)  # RNG restored to the saved point
    x = torch.randn(5, 3)
    for model, o in ((m, opt), (m2, opt2)):
        model(x).pow(2).sum().backward()
        o.step()
    assert torch.equal(m.weight, m2.weight) and torch.equal(m.bias, m2.bias)


def test_keep_last_n_and_latest(tmp_path):
    m, opt = _model_and_opt(0)
    writer = ckpt.CheckpointWriter(tmp_path, keep=2)
    for step in (2, 4, 6):
        _save(writer, m, opt, step)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["global_step_4", "global_step_6",
                                                          "latest_checkpointed_iteration.txt"]
    assert (tmp_path / "latest_checkpointed_iteration.txt").read_text() == "6"  # verl's pointer to the newest
    assert ckpt.latest_checkpoint(tmp_path).name == "global_step_6"


def test_a_crash_mid_write_leaves_the_previous_checkpoint_as_latest(tmp_path, monkeypatch):
    m, opt = _model_and_opt(0)
    writer = ckpt.CheckpointWriter(tmp_path)
    _save(writer, m, opt, 2)
    calls = []

    def dying_save(tensors, filename):
        calls.append(filename)
        if len(calls) == 2:  # the optimizer file: the process "dies" half way through the checkpoint
            raise OSError("disk full")
        return real(tensors, filename)

    real = state_files.save_file
    monkeypatch.setattr(state_files, "save_file", dying_save)
    tmp = writer.begin(4)
    with pytest.raises(OSError):
        ckpt.save_trainer_state(tmp, dict(m.named_parameters()), opt)
    assert tmp.exists() and (tmp / "model.safetensors").exists()  # the half-written directory is there...
    assert ckpt.latest_checkpoint(tmp_path).name == "global_step_2"  # ...and never picked up


def test_loading_into_another_model_names_the_mismatch(tmp_path):
    m, opt = _model_and_opt(0)
    path = _save(ckpt.CheckpointWriter(tmp_path), m, opt, 1)
    other = torch.nn.Sequential(torch.nn.Linear(3, 2))
    with pytest.raises(ValueError, match="does not match the model"):
        ckpt.load_trainer_state(path, dict(other.named_parameters()), None)


def test_a_verl_omni_checkpoint_is_found_and_read(tmp_path):
    """verl-omni's layout (global_step_<k>/actor/, verl's latest_checkpointed_iteration.txt, no meta.json): found by
    `latest_checkpoint` up to the step the pointer names, its step read from the directory, and refused by a run
    whose trainer is not verl-omni's actor worker."""
    from types import SimpleNamespace

    from digenrl_verl.main import check_resumable
    from digenrl_verl.trainer.checkpoint import is_host_checkpoint

    for step in (3, 5):
        (tmp_path / f"global_step_{step}" / "actor").mkdir(parents=True)
    assert ckpt.latest_checkpoint(tmp_path) is None  # no pointer: verl-omni has not finished saving either
    (tmp_path / "latest_checkpointed_iteration.txt").write_text("3\n")
    assert ckpt.latest_checkpoint(tmp_path) == tmp_path / "global_step_3"  # step 5 is past the pointer: incomplete
    assert is_host_checkpoint(tmp_path / "global_step_3")
    assert ckpt.read_meta(tmp_path / "global_step_3") == {"global_step": 3, "policy_version": 3,
                                                         "host_checkpoint": True}
    ours = SimpleNamespace(train=SimpleNamespace(engine="digenrl"), prompts_per_step=2, n=2)
    with pytest.raises(ValueError, match="trainer.digenrl.trainer_engine=verl_omni"):
        check_resumable(tmp_path / "global_step_3", ours)
    check_resumable(tmp_path / "global_step_3", SimpleNamespace(train=SimpleNamespace(engine="verl_omni")))


def test_the_writer_keeps_every_checkpoint_by_default(tmp_path):
    """keep=None (verl-omni's ``max_actor_ckpt_to_keep: null``) prunes nothing."""
    m, opt = _model_and_opt(0)
    writer = ckpt.CheckpointWriter(tmp_path)
    for step in (1, 2, 3):
        _save(writer, m, opt, step)
    assert sorted(p.name for p in tmp_path.glob("global_step_*")) == ["global_step_1", "global_step_2",
                                                                       "global_step_3"]
