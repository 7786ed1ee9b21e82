"""`digenrl-sim --mini-batches k`: several optimizer steps per global step in the simulator."""

from __future__ import annotations

import json

from digenrl_verl.sim.cli import main


def _run(capsys, *flags: str) -> dict:
    assert main(["--scenario", "flux.1", "--steps", "2", "--json", *flags]) == 0
    return json.loads(capsys.readouterr().out.strip().splitlines()[-1])


def test_mini_batches_flag_runs_k_optimizer_steps_per_step(capsys, tmp_path):
    text = tmp_path / "schedule.txt"
    one = _run(capsys)
    two = _run(capsys, "--mini-batches", "2", "--schedule-text", str(text))
    assert two["config"]["mini_batches_per_step"] == 2 and one["config"]["mini_batches_per_step"] == 1
    lines = text.read_text().splitlines()
    assert [sum(f"OPT s{step} " in line for line in lines) for step in (0, 1)] == [2, 2]
    assert two["makespan_s"] >= one["makespan_s"] * 0.9  # same work plus one OPT per step: no free lunch


def test_a_count_that_does_not_divide_the_prompts_fails_by_name(capsys):
    assert main(["--scenario", "flux.1", "--mini-batches", "3"]) == 2
    assert "mini_batches_per_step=3" in capsys.readouterr().err
