"""verl's prompt keys (issue 21): what each does in verl-omni and here, said by name.

custom_chat_template / apply_chat_template_kwargs: chat prompts become their user turns under the pipeline's own
template (verl-omni's rendering for its recipes: tests/verl_omni/test_verl_omni_prompts.py); data.max_prompt_length:
verl left-truncates, the pipeline cuts at max_sequence_length; data.truncation: stored, never read by verl;
data.filter_overlong_prompts=true: refused, with the fix.
"""

from __future__ import annotations

import warnings

import pytest

from digenrl_verl.main import TINY_CPU, compose
from digenrl_verl.trainer.config import build_run

A = "actor_rollout_ref"
CASES = [
    (f"{A}.model.custom_chat_template='{{{{ messages[0].content }}}}'", f"{A}.model.custom_chat_template",
     ["user turns' text under the pipeline's own template", "verl-omni's rendering"]),
    ("+data.apply_chat_template_kwargs.enable_thinking=false", "data.apply_chat_template_kwargs",
     ["user turns' text under the pipeline's own template", "verl-omni's rendering"]),
    ("data.max_prompt_length=256", "data.max_prompt_length",
     ["left-truncates", f"{A}.rollout.pipeline.max_sequence_length"]),
    ("data.truncation=right", "data.truncation", ["stores it and never reads it", "max_sequence_length"]),
]


def _build(model_dir, *overrides):
    return build_run(compose([TINY_CPU, f"{A}.model.path={model_dir}", *overrides]))


@pytest.mark.parametrize("override, key, says", CASES, ids=[c[1] for c in CASES])
def test_prompt_key_warns_by_name_with_what_happens(tiny_flux_dir, override, key, says):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        _build(tiny_flux_dir, override)
    lines = [str(w.message) for w in caught if str(w.message).startswith(f"{key}=")]
    assert len(lines) == 1, [str(w.message) for w in caught]
    assert "has no effect" in lines[0]
    for text in says:
        assert text in lines[0], (text, lines[0])


def test_filter_overlong_prompts_is_refused_with_the_fix(tiny_flux_dir):
    with pytest.raises(ValueError) as e:
        _build(tiny_flux_dir, "data.filter_overlong_prompts=true")
    msg = str(e.value)
    assert "data.filter_overlong_prompts=True is not supported" in msg
    assert "set data.filter_overlong_prompts=false" in msg


def test_filter_overlong_prompts_false_is_accepted_silently(tiny_flux_dir):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        _build(tiny_flux_dir, "data.filter_overlong_prompts=false")
    assert not [w for w in caught if "filter_overlong_prompts" in str(w.message)]
