"""TCSS at the recipes' default clip (1e-4) vs on-policy on the tiny FLUX model: stale-row clip statistics and the
reward trajectory.

Measured on the 2-core machine (tiny FLUX, brightness reward, lr 3e-3 as recipes/run_tiny_cpu.sh, 12 steps, tag off,
TCSS guard off; gain = mean reward of the last 3 steps − of the first 3; runs are deterministic per rollout.seed):

| batch | seed | on-policy gain | TCSS f=0.5 gain (stale share) | TCSS f=0.25 | TCSS f=0.5, clip 1e-2 |
|---|---|---|---|---|---|
| 2×4 | 42 | +0.033 | +0.007 (0.46) | no stale (one group = 0.5) | +0.012 |
| 2×4 | 1  | +0.017 | +0.007 | | |
| 2×4 | 2  | +0.003 | +0.002 | | |
| 4×4 | 42 | +0.030 | +0.012 (0.29) | +0.019 (0.23) | |
| 4×4 | 1  | +0.046 | +0.016 (0.27) | +0.016 (0.23) | |

At clip 1e-4 the stale rows (one optimizer step old, ratios ~0.93–1.05) are 96–99% outside the clip and about half
of them (48–55%) are on the zero-gradient side (A > 0 and ratio > 1 + ε, or A < 0 and ratio < 1 − ε). The rows that
keep a gradient are the ones the last step moved against their advantage, so the stale rows' gradient leans against
the previous update: TCSS reaches 40–60% of the on-policy gain at the same seed, and lowering max_stale_fraction to
0.25 (23% stale) does not close the gap. TCSS does not match the on-policy trajectory at the default clip here; the
comparison below is an expected failure (xfail, with the numbers) until it does, while the metrics and "TCSS still
learns" are hard checks.
"""

from __future__ import annotations

import numpy as np
import pytest

pytestmark = pytest.mark.slow  # trains on Ray workers (two runs of ~25 s)

COMMON = ["data.train_batch_size=2", "actor_rollout_ref.rollout.n=4", "trainer.digenrl.mode=disaggregated",
          "trainer.digenrl.tag.policy=off", "trainer.digenrl.tcss.guard=false", "trainer.total_training_steps=12",
          "actor_rollout_ref.actor.optim.lr=3e-3",  # recipes/run_tiny_cpu.sh
          "actor_rollout_ref.actor.diffusion_loss.clip_ratio=1e-4",  # the shipped default, said explicitly
          "trainer.digenrl.final_eval_prompts=0"]
# "matches": the last-3-step mean reward within 0.01 of the on-policy run's. Step means of 8 samples scatter by
# ~0.003, so 0.01 is > 3 sigma of a 3-step mean; the seed-to-seed spread of the on-policy gain itself is larger
# (+0.003 … +0.046 above), which is why the comparison is paired (same rollout.seed, same prompts, same noise).
MATCH_TOL = 0.01


def _gain(rewards):
    return float(np.mean(rewards[-3:]) - np.mean(rewards[:3]))


def test_tcss_at_the_default_clip_logs_stale_clipping_and_is_compared_with_on_policy(train_run):
    on = train_run(*COMMON, "trainer.digenrl.tcss.staleness=0", name="on_policy")
    tcss = train_run(*COMMON, "trainer.digenrl.tcss.staleness=1", "trainer.digenrl.tcss.max_stale_fraction=0.5",
                     name="tcss")
    h_on, h_tc = on.reporter.history, tcss.reporter.history
    # on-policy: no stale row, and every row's ratio is 1 (same numerics on both pools), so nothing is clipped
    assert all(h["actor/stale_rows"] == 0 and h["actor/onpolicy_clip_frac"] == 0 for h in h_on)
    # TCSS: the stale rows are counted per step, exactly the stale samples' rows
    k = round(h_tc[0]["actor/rows"] / 8)
    assert [h["actor/stale_rows"] for h in h_tc] == [h["schedule/stale_samples"] * k for h in h_tc]
    assert sum(h["schedule/stale_samples"] for h in h_tc) > 0
    assert all(h["actor/onpolicy_clip_frac"] == 0 for h in h_tc)  # only stale rows are ever clipped
    run = tcss.summary
    # at clip 1e-4 nearly every stale row is outside the clip, about half on the zero-gradient side (measured 0.55)
    assert run["actor/stale_clip_frac"] > 0.9, run
    assert 0.3 < run["actor/stale_zero_grad_frac"] < 0.7, run
    assert run["actor/pg_zero_grad_frac"] == pytest.approx(
        run["actor/stale_zero_grad_frac"] * sum(h["actor/stale_rows"] for h in h_tc)
        / sum(h["actor/rows"] for h in h_tc))
    r_on, r_tc = [h["reward/mean"] for h in h_on], [h["reward/mean"] for h in h_tc]
    print(f"on-policy rewards {np.round(r_on, 4).tolist()}\nTCSS rewards {np.round(r_tc, 4).tolist()}\n"
          f"gains: on-policy {_gain(r_on):+.4f}, TCSS {_gain(r_tc):+.4f}; "
          f"stale clip {run['actor/stale_clip_frac']:.3f}, stale zero-grad {run['actor/stale_zero_grad_frac']:.3f}")
    assert r_on[0] == r_tc[0]  # paired: step 0 is on-policy in both runs, same samples
    assert _gain(r_on) > 0.01, r_on  # the reference learns (measured +0.033)
    assert _gain(r_tc) > 0.004, r_tc  # TCSS still learns at the default clip (measured +0.007), only slower
    gap = float(np.mean(r_on[-3:]) - np.mean(r_tc[-3:]))
    if gap > MATCH_TOL:
        pytest.xfail(f"TCSS at clip 1e-4 trails on-policy by {gap:.4f} in the last-3-step mean reward (tolerance "
                     f"{MATCH_TOL}); gains {_gain(r_tc):+.4f} vs {_gain(r_on):+.4f}: see the module docstring")
