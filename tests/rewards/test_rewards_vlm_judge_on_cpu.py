"""The VLM judge reward (verl-omni's `reward.reward_model.enable=True` OCR reward) on tiny random Qwen-VL judges:
the real transformers loading, chat template, image processor and `generate` path; the score rules; the config."""

from __future__ import annotations

import json
import sys
import types
import warnings
from pathlib import Path

import pytest
import torch

from digenrl_verl.config.verl_omni import (
    NO_EFFECT, UNSUPPORTED, RecipeKeys, build_digenrl, build_layout, check_unsupported,
)
from digenrl_verl.config.verl_omni_reward import build_reward
from digenrl_verl.main import TINY_CPU, compose
from digenrl_verl.rewards import JUDGE_REWARD, JudgeConfig, RewardConfig, VLMJudgeReward, build_reward as make_reward
from digenrl_verl.rewards.ocr import levenshtein
from digenrl_verl.rewards.tiny_judge import TINY_FAMILIES, build_tiny_judge_dir
from digenrl_verl.rewards.vlm_judge import (
    OCR_INSTRUCTION, JudgePoolSpec, JudgeProcessor, judge_family, judge_ocr_score, resolve_judge_path,
)

torch.set_num_threads(1)
GENRM = "/somewhere/verl_omni/utils/reward_score/genrm_ocr.py"  # verl-omni's file; never loaded


@pytest.fixture(scope="module", params=TINY_FAMILIES)
def judge_dir(request, tmp_path_factory):
    return str(build_tiny_judge_dir(tmp_path_factory.mktemp("judges") / request.param, request.param, seed=0))


def _images(b=3, h=32, w=32, seed=0):
    return torch.randint(0, 256, (b, 3, h, w), generator=torch.Generator().manual_seed(seed), dtype=torch.uint8)


@pytest.mark.parametrize("text,target,want", [
    ("HELLO", "hello", 1.0),                         # case and whitespace do not count
    ("The sign reads: Hello World!", "hello world", 1.0),  # the target inside a longer answer scores 1
    ("HELLP", "hello", 0.8),                         # one substitution in five characters
    ("x" * 40, "hello", 0.0),                        # a long hallucination costs at most the target's length
    ("", "", 1.0), ("abc", "", 0.0),                 # an empty target: only an empty answer matches
])
def test_judge_ocr_score_follows_verl_omni_genrm_ocr(text, target, want):
    assert judge_ocr_score(text, target) == pytest.approx(want)


def test_judge_ocr_score_equals_verl_omnis_own_function(monkeypatch):
    genrm = pytest.importorskip("verl_omni.utils.reward_score.genrm_ocr")  # only in .venv-verl-omni
    try:
        import Levenshtein  # noqa: F401  (verl-omni's `ocr` extra; not in .venv-verl-omni)
    except ImportError:  # verl-omni's normalisation, substring and cap rules, with our edit distance
        monkeypatch.setitem(sys.modules, "Levenshtein", types.SimpleNamespace(distance=levenshtein))
    for text, target in [("HELLO", "hello"), ("a b c d", "abce"), ("zzz", "hello"), ("", ""), ("x", ""),
                         ("Say hi to Bob", "hi bob"), ("OpenAI 2026", "openal 2O26")]:
        assert judge_ocr_score(text, target) == pytest.approx(genrm._levenshtein_score(text, target))
    assert genrm.DEFAULT_GRM_PROMPT == OCR_INSTRUCTION
    defaults = JudgeConfig("x")
    assert genrm.DEFAULT_SAMPLING_PARAMS == {"temperature": defaults.temperature, "top_p": defaults.top_p,
                                             "max_tokens": defaults.max_new_tokens}


def test_tiny_judge_directory_is_a_real_checkpoint(judge_dir):
    from transformers import AutoConfig, AutoModelForImageTextToText

    cfg = AutoConfig.from_pretrained(judge_dir)
    assert judge_family(judge_dir) == cfg.model_type
    model = AutoModelForImageTextToText.from_pretrained(judge_dir)
    assert sum(p.numel() for p in model.parameters()) < 100_000
    a = build_tiny_judge_dir(f"{judge_dir}_again", cfg.model_type, seed=0)
    b = json.loads((a / "config.json").read_text())
    assert b["model_type"] == cfg.model_type  # same family, same seed: same directory
    again = AutoModelForImageTextToText.from_pretrained(a)
    for (k, v), (_, w) in zip(model.state_dict().items(), again.state_dict().items()):
        assert torch.equal(v, w), k


def test_processor_gives_one_placeholder_per_merged_patch(judge_dir):
    from transformers import AutoConfig

    cfg = AutoConfig.from_pretrained(judge_dir)
    proc = JudgeProcessor(judge_dir, cfg.image_token_id)
    from PIL import Image

    images = [Image.new("RGB", (28, 28)), Image.new("RGB", (56, 56)), Image.new("RGB", (56, 28))]
    inputs = proc(images, OCR_INSTRUCTION, "You are a helpful assistant.")
    grid = inputs["image_grid_thw"]
    assert grid.tolist() == [[1, 2, 2], [1, 4, 4], [1, 2, 4]]
    per_row = (inputs["input_ids"] == cfg.image_token_id).sum(1)
    assert per_row.tolist() == (grid.prod(-1) // 4).tolist()  # merge_size 2: one token per 2x2 patches
    assert inputs["pixel_values"].shape[0] == int(grid.prod(-1).sum())
    # left padding: every row ends with the generation prompt, shorter rows are padded in front
    assert (inputs["attention_mask"][:, -1] == 1).all() and (inputs["attention_mask"][0, 0] == 0)
    text = proc.tokenizer.decode(inputs["input_ids"][1], skip_special_tokens=False)
    assert "You are a helpful assistant." in text and OCR_INSTRUCTION in text and text.endswith("assistant\n")


def test_judge_reward_scores_a_batch_through_generate(judge_dir):
    cfg = JudgeConfig(judge_dir, max_new_tokens=5, seed=7, micro_batch_size=2)
    reward = make_reward(RewardConfig(reward_functions={JUDGE_REWARD: 1.0}, reward_model=cfg))
    judge = reward.components[JUDGE_REWARD][0]
    assert isinstance(judge, VLMJudgeReward)
    prompts = ['a sign that says "OPEN"', "a poster", 'a "Cafe" logo']
    extra = [{}, {"reward_model": {"ground_truth": "Sale"}}, {}]
    scores = reward.score(_images(), prompts, extra)
    assert scores.dtype == torch.float32 and scores.shape == (3,)
    answers = list(judge.last_answers)
    assert len(answers) == 3 and all(isinstance(a, str) and a for a in answers)
    want = [judge_ocr_score(a, t) for a, t in zip(answers, ["OPEN", "Sale", "Cafe"])]
    torch.testing.assert_close(scores, torch.tensor(want, dtype=torch.float32))
    # the same seed gives the same answers; the micro-batch size does not change them (greedy decoding)
    assert reward.score(_images(), prompts, extra).tolist() == scores.tolist() and judge.last_answers == answers
    greedy = [VLMJudgeReward(JudgeConfig(judge_dir, max_new_tokens=5, temperature=0.0, micro_batch_size=m))
              for m in (1, 3)]
    for g in greedy:
        g.score(_images(), prompts, extra)
    assert greedy[0].last_answers == greedy[1].last_answers


def test_judge_reward_judges_every_fourth_video_frame_like_verl_omni(judge_dir):
    reward = VLMJudgeReward(JudgeConfig(judge_dir, max_new_tokens=3, temperature=0.0))
    video = torch.randint(0, 256, (2, 5, 3, 32, 32), generator=torch.Generator().manual_seed(1), dtype=torch.uint8)
    scores = reward.score(video, ['"A"', '"B"'])
    assert scores.shape == (2,) and len(reward.last_answers) == 4  # frames 0 and 4 of each video
    reward.score(video, ['"A"', '"B"'], [{"extra_info": {"frame_interval": 1}}] * 2)
    assert len(reward.last_answers) == 10
    with pytest.raises(ValueError, match="no OCR target"):
        reward.score(video, ["no quotes", '"B"'])


def test_judge_config_checks_and_verl_omni_environment_overrides(tmp_path):
    with pytest.raises(ValueError, match="max_new_tokens=0"):
        JudgeConfig("x", max_new_tokens=0)
    with pytest.raises(ValueError, match="device='tpu'"):
        JudgeConfig("x", device="tpu")
    env = {"GENRM_OCR_TEMPERATURE": "0.2", "GENRM_OCR_MAX_TOKENS": "16", "GENRM_OCR_SEED": "5"}
    got = JudgeConfig("x").with_env_overrides(env)
    assert (got.temperature, got.top_p, got.max_new_tokens, got.seed) == (0.2, 0.8, 16, 5)
    with pytest.raises(ValueError, match="GENRM_OCR_TOP_P='high'"):
        JudgeConfig("x").with_env_overrides({"GENRM_OCR_TOP_P": "high"})
    with pytest.raises(ValueError, match=r"reward\.reward_model\.model_path='Qwen/Nope-VL'.*hf download"):
        resolve_judge_path("Qwen/Nope-VL")  # HF_HUB_OFFLINE=1 (tests/conftest.py) and not cached
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "llama"}))
    with pytest.raises(ValueError, match=r"'llama' model; the VLM judge supports .*qwen2_5_vl"):
        judge_family(str(tmp_path))
    with pytest.raises(ValueError, match=r"names 'genrm_ocr'.*reward\.reward_model\.enable=true"):
        RewardConfig(reward_functions={JUDGE_REWARD: 1.0})


# --- the verl-omni adapter: reward.reward_model.* ---------------------------------------------------------------

def _build_reward(keys):
    """The adapter's reward, with the run's pools as `build_run` gives them."""
    return build_reward(keys, build_layout(keys, build_digenrl(keys)))


def _reward(*overrides):
    return _build_reward(RecipeKeys(compose([TINY_CPU, *overrides])))


def test_verl_omni_ocr_recipe_keys_build_the_judge(judge_dir, monkeypatch):
    monkeypatch.setenv("GENRM_OCR_MAX_TOKENS", "12")
    keys = RecipeKeys(compose([TINY_CPU,
        "reward.reward_model.enable=True", f"reward.reward_model.model_path={judge_dir}",
        "reward.reward_model.rollout.name=vllm", "reward.reward_model.rollout.tensor_model_parallel_size=4",
        "trainer.digenrl.mode=disaggregated", "trainer.n_gpus_per_node=4",  # the Qwen-Image OCR scripts' layout
        f"reward.custom_reward_function.path={GENRM}", "reward.custom_reward_function.name=compute_score_ocr"]))
    check_unsupported(keys)  # enable=True is no longer a blocker
    with pytest.warns(UserWarning, match=r"genrm_ocr\.py:compute_score_ocr .*digenrl_verl's VLM judge.*not loaded"):
        reward = _build_reward(keys)
    assert reward.weights() == {JUDGE_REWARD: 1.0} and reward.custom_reward_function_path is None
    # the TP-4 judge without a reward pool: one replica colocated on the worker pools' 4 devices, as on GPUs
    assert reward.reward_model == JudgeConfig(judge_dir, max_new_tokens=12, pool=JudgePoolSpec(
        1, 4, use_gpu=False, devices_per_replica=4, colocated=True))
    assert {"reward.reward_model.enable", "reward.reward_model.model_path"} <= keys.read
    family = json.loads((Path(judge_dir) / "config.json").read_text())["model_type"]
    assert [d for d in keys.decisions if d.startswith("reward.reward_model.model_path")] == [
        f"reward.reward_model.model_path={judge_dir!r}: a {family} judge ({judge_dir}) as replicas colocated on the "
        "worker pools' devices, served by transformers generate (8 images per call); temperature 0.7, top_p 0.8, "
        "at most 12 new tokens"]  # printed by the dry run's plan
    assert "reward.reward_model.rollout.name" not in NO_EFFECT and "reward.reward_model.enable" not in UNSUPPORTED


def test_verl_omni_reward_model_keys_that_cannot_be_honoured_fail_by_name(judge_dir):
    with pytest.raises(ValueError, match=r"reward\.reward_model\.model_path.*is not set|needs reward\.reward_model"
                                         r"\.model_path"):
        _reward("reward.reward_model.enable=True", f"reward.custom_reward_function.path={GENRM}",
                "reward.custom_reward_function.name=compute_score_ocr")
    with pytest.raises(ValueError, match=r"enable=True with reward\.custom_reward_function .*my\.py:score.*"
                                         r"genrm_ocr\.py:compute_score_ocr"):
        _reward("reward.reward_model.enable=True", f"reward.reward_model.model_path={judge_dir}",
                "reward.custom_reward_function.path=/x/my.py", "reward.custom_reward_function.name=score")
    with pytest.raises(ValueError, match=r"reward\.reward_model\.nnodes=0 must be an integer >= 1 with "
                                         r"reward\.reward_model\.enable_resource_pool=True"):
        _reward("reward.reward_model.enable=True", f"reward.reward_model.model_path={judge_dir}",
                "reward.reward_model.enable_resource_pool=True", "reward.reward_functions={genrm_ocr: 1.0}")


def test_verl_omni_reward_model_keys_without_effect_warn_by_name(judge_dir):
    with pytest.warns(UserWarning, match=r"reward\.reward_model\.model_path=.* has no effect: .*enable=false"):
        _reward(f"reward.reward_model.model_path={judge_dir}")
    with pytest.warns(UserWarning, match=r"reward\.reward_model\.enable=True has no effect: no reward uses the judge"):
        _reward("reward.reward_model.enable=True", f"reward.reward_model.model_path={judge_dir}",
                "reward.reward_functions={brightness: 1.0}")
    with warnings.catch_warnings():  # the native spelling: no translation, no warning
        warnings.simplefilter("error")
        got = _reward("reward.reward_model.enable=True", f"reward.reward_model.model_path={judge_dir}",
                      "reward.reward_functions={genrm_ocr: 0.5, brightness: 0.5}")
    assert got.weights() == {JUDGE_REWARD: 0.5, "brightness": 0.5}


# --- verl-omni's multi-reward entries: reward.reward_functions.<name>.{path,name,weight} --------------------------

JPEG_FILE = """
import io
from PIL import Image

def compute_score(data_source, solution_image, ground_truth, extra_info):
    buf = io.BytesIO()
    Image.fromarray(solution_image.permute(1, 2, 0).numpy()).save(buf, format="JPEG", quality=95)
    return {"score": -buf.tell() / 500_000.0, "kb": buf.tell() / 1000}
"""


def test_function_file_entries_mix_the_judge_and_a_loaded_file(judge_dir, tmp_path):
    (tmp_path / "jpeg_compressibility.py").write_text(JPEG_FILE)
    files = {"ocr": (GENRM, "compute_score_ocr"), "jpeg": (str(tmp_path / "jpeg_compressibility.py"), "compute_score")}
    cfg = RewardConfig(reward_functions={"ocr": 0.25, "jpeg": 0.75}, function_files=files,
                       reward_model=JudgeConfig(judge_dir, max_new_tokens=3, temperature=0.0))
    reward = make_reward(cfg)
    judge, jpeg = reward.components["ocr"][0], reward.components["jpeg"][0]
    assert isinstance(judge, VLMJudgeReward) and judge.name == "ocr"  # a file entry wins over the registered 'ocr'
    assert type(jpeg).__name__ == "CustomReward" and jpeg.name == "jpeg"
    parts = reward.score_components(_images(2), ['"OPEN"', '"SALE"'])
    torch.testing.assert_close(reward.combine(parts), 0.25 * parts["ocr"] + 0.75 * parts["jpeg"])
    assert (parts["jpeg"] < 0).all()
    with pytest.raises(ValueError, match=r"reward_functions\.ocr is verl-omni's judge-backed compute_score_ocr.*"
                                         r"reward\.reward_model\.enable=true"):
        RewardConfig(reward_functions={"ocr": 1.0}, function_files={"ocr": files["ocr"]})
    with pytest.raises(ValueError, match=r"reward_functions\.jpeg: a function file without a weight"):
        RewardConfig(reward_functions={"ocr": 1.0}, function_files={"jpeg": files["jpeg"]})


def test_verl_omni_multi_reward_script_keys_build_the_judge_and_the_file(judge_dir, tmp_path):
    (tmp_path / "jpeg_compressibility.py").write_text(JPEG_FILE)
    jpeg = tmp_path / "jpeg_compressibility.py"
    script = [  # flowgrpo_trainer/qwen_image/run_qwen_image_ocr_multi_reward.sh, reward keys
        "reward.reward_model.enable=True", f"reward.reward_model.model_path={judge_dir}",
        "reward.custom_reward_function.path=pkg://verl_omni.reward_loop.reward_manager.multi",
        "reward.custom_reward_function.name=_multi_reward_placeholder",
        "reward.reward_manager.name=MultiVisualRewardManager",
        f"+reward.reward_functions.ocr.path={GENRM}", "+reward.reward_functions.ocr.name=compute_score_ocr",
        "+reward.reward_functions.ocr.weight=0.5", f"+reward.reward_functions.jpeg.path={jpeg}",
        "+reward.reward_functions.jpeg.name=compute_score", "+reward.reward_functions.jpeg.weight=0.5",
        "reward.aggregation=weighted_sum"]
    with pytest.warns(UserWarning) as record:
        reward = _reward(*script)
    text = "\n".join(str(w.message) for w in record)
    assert "_multi_reward_placeholder is verl-omni's multi-reward placeholder" in text
    assert "reward.reward_functions.ocr " in text and "digenrl_verl's VLM judge" in text
    assert "verl-omni's default required=false would score it 0" in text
    assert reward.weights() == {"ocr": 0.5, "jpeg": 0.5} and reward.custom_reward_function_path is None
    assert reward.function_files == {"ocr": (GENRM, "compute_score_ocr"), "jpeg": (str(jpeg), "compute_score")}
    with pytest.raises(ValueError, match=r"reward\.reward_functions\.jpeg: \['scale'\] would be extra arguments"):
        _reward(*script, "+reward.reward_functions.jpeg.scale=2")
    with pytest.raises(ValueError, match=r"reward\.reward_functions\.jpeg\.path='/nope/j\.py' is not a file"):
        _reward(*script, "reward.reward_functions.jpeg.path=/nope/j.py")


def test_a_hugging_face_id_resolves_from_the_local_cache_only(judge_dir, tmp_path, monkeypatch):
    """`Qwen/...` ids resolve to their snapshot in the local HF cache (a cache laid out as huggingface_hub writes it),
    without any download (HF_HUB_OFFLINE=1)."""
    from huggingface_hub import constants

    snapshot = tmp_path / "hub" / "models--Tiny--Judge-VL" / "snapshots" / "0123abcd"
    snapshot.mkdir(parents=True)
    for f in Path(judge_dir).iterdir():
        (snapshot / f.name).write_bytes(f.read_bytes())
    (snapshot.parents[1] / "refs").mkdir()
    (snapshot.parents[1] / "refs" / "main").write_text("0123abcd")
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    assert Path(resolve_judge_path("Tiny/Judge-VL")) == snapshot
    got = _reward("reward.reward_model.enable=True", "reward.reward_model.model_path=Tiny/Judge-VL",
                  "reward.reward_functions={genrm_ocr: 1.0}")
    assert Path(got.reward_model.model_path) == snapshot
    with pytest.raises(ValueError, match=r"model_path='Tiny/Other-VL' is neither a local directory nor a model in "
                                         "the Hugging Face cache"):
        resolve_judge_path("Tiny/Other-VL")


def test_tiny_judge_cli_writes_a_directory(tmp_path, capsys):
    from digenrl_verl.rewards import tiny_judge

    assert tiny_judge.main([str(tmp_path / "j"), "--family", "qwen3_vl", "--seed", "1"]) == 0
    assert capsys.readouterr().out.strip() == str(tmp_path / "j")
    assert judge_family(str(tmp_path / "j")) == "qwen3_vl"
    with pytest.raises(ValueError, match=r"unknown family 'llava'; valid: \['qwen2_5_vl', 'qwen3_vl'\]"):
        build_tiny_judge_dir(tmp_path / "k", "llava")
