"""One loss-statistics function (issue 33, item 2): the UPDATE result of verl-omni's actor worker
(`integrations.verl_omni_trainer.loss_stats`, over the log-probs its engine returned) is built by the package's own
`diffusion.loss.loss_stats`, so it carries every `LossStats` field the package's trainer reports, the stale rows'
importance weights included (the copy it replaced had drifted and lacked them)."""

from __future__ import annotations

import math

import pytest

pytest.importorskip("verl_omni", reason="no verl-omni (the verl-omni tier: scripts/test_verl_omni.sh)")

import torch  # noqa: E402
from verl.utils import tensordict_utils as tu  # noqa: E402

from digenrl_verl.diffusion.loss import LossStats  # noqa: E402
from digenrl_verl.integrations.verl_omni_trainer import loss_stats  # noqa: E402

CLIP = 1e-2


def _update_output(stale_rows: list[bool]):
    """verl-omni's engine output for 4 samples x 3 steps (log-probs, its metrics) and the batch it trained."""
    g = torch.Generator().manual_seed(0)
    old = torch.randn(4, 3, generator=g)
    new = old + torch.randn(4, 3, generator=g) * 0.02
    batch = {"old_log_probs": old, "advantages": torch.tensor([1.0, -1.0, 0.5, -0.5]).reshape(4, 1).expand(4, 3)}
    output = tu.get_tensordict({"log_probs": new}, non_tensor_dict={"metrics": {"actor/pg_loss": [0.25, 0.35],
                                                                                 "loss": [0.5]}})
    return output, batch, torch.tensor(stale_rows)


def test_the_worker_reports_every_field_with_the_stale_rows_weights():
    output, batch, stale = _update_output([False, True, False, True])
    got = loss_stats(output, batch, stale, CLIP)
    assert set(got) == set(vars(LossStats()))  # every field, as the package's trainer reports
    ratio = (tu.get(output, "log_probs") - batch["old_log_probs"]).exp()
    on_stale = ratio[stale]
    assert got["rows"] == 12 and got["stale_rows"] == 6
    assert got["stale_is_weight_sum"] == pytest.approx(float(on_stale.sum()))
    assert got["stale_is_weight_max"] == pytest.approx(float(on_stale.max()))
    assert got["stale_is_capped"] == 0.0  # verl-omni's loss clips stale rows like the others: nothing capped
    assert got["pg_sum"] == pytest.approx(0.3 * 12) and got["loss_sum"] == pytest.approx(0.5)
    assert got["clipped"] == float(((ratio - 1).abs() > CLIP).sum())
    metrics = LossStats(**got).metrics()
    assert all(math.isfinite(v) for v in metrics.values())


def test_without_stale_rows_the_weight_fields_are_empty_and_the_metrics_finite():
    output, batch, stale = _update_output([False] * 4)
    got = loss_stats(output, batch, stale, CLIP)
    assert got["stale_rows"] == 0.0 and got["stale_is_weight_sum"] == 0.0
    assert all(math.isfinite(v) for v in LossStats(**got).clip_metrics().values())
