"""verl-omni's default reward, routed by `data_source` as verl-omni routes it.

With no reward function and no custom file, verl-omni's `VisualRewardManager` (verl_omni/reward_loop/reward_manager/
visual.py) scores each sample with `default_compute_score_image(data_source, ...)` (verl_omni/utils/reward_score/
__init__.py), which scores the data source `jpeg_compressibility` and raises NotImplementedError for any other, at
the first sample of that source. Here the same table is checked before any worker starts: a data source without a
default scorer fails the run by name (`default_reward`).
"""

from __future__ import annotations

from typing import Mapping

from digenrl_verl.rewards.base import KEY_REWARD_FUNCTIONS, reward_names

#: verl-omni's default_compute_score_image: data_source -> the registered reward that scores it the same way
DEFAULT_SCORERS = {"jpeg_compressibility": "jpeg_compressibility"}
#: prompts that carry no data_source (text files, the built-in prompts, parquet files without the column, which
#: verl-omni cannot train on) are scored with the reward of the one source verl-omni's default scores
NO_SOURCE_SCORER = "jpeg_compressibility"
KEY_SOURCE = "data.reward_fn_key"


def default_reward(sources: Mapping[str, int], without: int, where: str = "data.train_files",
                   source_key: str = "data_source") -> tuple[dict[str, float], str]:
    """(reward_functions, the plan's line) of verl-omni's default reward for prompts of these data sources
    (`sources`: data_source -> prompts, `without`: prompts without one). A data source verl-omni's default does not
    score raises ValueError naming it, its prompts and the fix. Every scorable source is scored by one reward today,
    so the weighted sum of that one reward is the per-row dispatch."""
    unknown = {s: n for s, n in sources.items() if s not in DEFAULT_SCORERS}
    if unknown:
        listed = ", ".join(f"{s!r} ({n} prompt(s))" for s, n in sorted(unknown.items()))
        raise ValueError(
            f"{where}: data_source {listed} (column {KEY_SOURCE}={source_key!r}) has no default reward: with "
            f"{KEY_REWARD_FUNCTIONS}={{}} and no reward.custom_reward_function.path, verl-omni's "
            f"default_compute_score_image scores only data_source {sorted(DEFAULT_SCORERS)} and raises "
            "NotImplementedError for any other at its first sample. Fix: set "
            f"{KEY_REWARD_FUNCTIONS} (registered rewards: {reward_names()}, or a {{path, name}} entry of a function "
            "in a file) or reward.custom_reward_function.path, as the verl-omni recipe of this data does")
    names = sorted({DEFAULT_SCORERS[s] for s in sources} | ({NO_SOURCE_SCORER} if without or not sources else set()))
    routed = ", ".join(f"{s!r} ({n}) -> {DEFAULT_SCORERS[s]}" for s, n in sorted(sources.items()))
    parts = [f"data_source {routed}"] if routed else []
    if without:
        parts.append(f"{without} prompt(s) without a {source_key!r} column (text files, the built-in prompts or "
                     f"parquet files without it; verl-omni needs the column) -> {NO_SOURCE_SCORER}")
    line = (f"{KEY_REWARD_FUNCTIONS}={{}} and no custom reward file: verl-omni's default reward, routed by data_source "
            f"as its default_compute_score_image: {'; '.join(parts) or 'no prompts'}")
    return {name: 1.0 for name in names}, line
