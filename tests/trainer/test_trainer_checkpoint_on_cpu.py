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
