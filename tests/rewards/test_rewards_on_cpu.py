import sys
import textwrap

import numpy as np
import pytest
import torch

from digenrl_verl.rewards import (
    RewardConfig,
    Reward,
    build_reward,
    get_reward,
    register_reward,
    reward_names,
)
from digenrl_verl.rewards.image import COLORS, jpeg_kilobytes
from digenrl_verl.rewards.ocr import INSTALL_HINT, levenshtein, ocr_text_score

torch.set_num_threads(1)


def _smooth_and_noisy(h=64, w=64):
    ramp = torch.linspace(0, 255, w).round().to(torch.uint8)
    smooth = ramp.expand(3, h, w).clone()
    noisy = torch.randint(0, 256, (3, h, w), generator=torch.Generator().manual_seed(0), dtype=torch.uint8)
    return torch.stack([smooth, noisy])


def test_registry_lists_builtins_and_rejects_duplicates():
    assert {"jpeg_compressibility", "jpeg_incompressibility", "brightness", "color_match", "ocr"} <= set(reward_names())
    with pytest.raises(ValueError, match=r"unknown reward 'aesthetic'.*valid names: \[.*'brightness'"):
        get_reward("aesthetic")
    with pytest.raises(ValueError, match="already registered"):
        register_reward("brightness")(lambda: None)


def test_jpeg_rewards_separate_smooth_from_noisy():
    imgs = _smooth_and_noisy()
    inc = get_reward("jpeg_incompressibility").score(imgs, ["a", "b"])
    comp = get_reward("jpeg_compressibility").score(imgs, ["a", "b"])
    assert inc.dtype == torch.float32 and inc.shape == (2,)
    assert inc[1] > 4 * inc[0] and inc[1] > 5.0  # 64×64 noise is > 5 kB at quality 95
    assert comp[0] > comp[1]
    torch.testing.assert_close(comp, -inc / 500)
    assert jpeg_kilobytes(imgs[1], quality=95) > jpeg_kilobytes(imgs[1], quality=30)


def test_brightness_by_hand_and_videos():
    imgs = _smooth_and_noisy()
    got = get_reward("brightness").score(imgs, ["a", "b"])
    torch.testing.assert_close(got, imgs.float().mean(dim=(1, 2, 3)) / 255)
    video = torch.stack([torch.zeros(3, 8, 8, dtype=torch.uint8), torch.full((3, 8, 8), 255, dtype=torch.uint8)])
    assert get_reward("brightness").score(video[None], ["v"]).item() == pytest.approx(0.5)
    with pytest.raises(ValueError, match="uint8"):
        get_reward("brightness").score(imgs.float(), ["a", "b"])
    with pytest.raises(ValueError, match="prompts"):
        get_reward("brightness").score(imgs, ["a"])


def test_color_match_picks_the_named_colour():
    reward = get_reward("color_match")
    names = ["red", "green", "blue", "yellow", "white", "black"]
    imgs = torch.stack([(torch.tensor(COLORS[n]) * 255).round().to(torch.uint8)[:, None, None].expand(3, 16, 16)
                        for n in names])
    for i, name in enumerate(names):
        scores = torch.stack([reward.score(imgs[i:i + 1], [f"a {other} teapot"]) for other in names]).squeeze(1)
        assert names[int(scores.argmax())] == name
        assert scores.max().item() == pytest.approx(1.0, abs=1e-6)
    # Closer colour, higher score: an orange image matches "orange" better than "red", "red" better than "blue".
    orange = torch.tensor([255, 128, 0], dtype=torch.uint8)[:, None, None].expand(1, 3, 8, 8)
    s = {c: reward.score(orange, [f"{c} fox"]).item() for c in ("orange", "red", "blue")}
    assert s["orange"] > s["red"] > s["blue"]
    with pytest.raises(ValueError, match=r"colour word.*'a fox' has none.*Known colours: \['black'"):
        reward.score(orange, ["a fox"])


def test_custom_reward_from_file(tmp_path):
    path = tmp_path / "my_reward.py"
    path.write_text(textwrap.dedent("""
        import torch

        def compute_score(data_source, solution_image, ground_truth, extra_info):
            assert solution_image.dtype == torch.uint8 and solution_image.shape[-3] == 3
            bonus = 1.0 if data_source == "bright" else 0.0
            return {"score": float(solution_image.float().mean()) / 255 + bonus + ground_truth + extra_info["k"],
                    "note": "ignored"}

        async def compute_async(data_source, solution_image, ground_truth, extra_info):
            return 0.25

        def helper():
            return 0
    """))
    imgs = _smooth_and_noisy()
    extra = [{"data_source": "bright", "reward_model": {"ground_truth": 10.0}, "extra_info": {"k": 100.0}},
             {"data_source": "dark", "ground_truth": 20.0, "extra_info": {"k": 200.0}}]
    reward = build_reward(RewardConfig(custom_reward_function_path=str(path)))
    got = reward.score(imgs, ["a", "b"], extra)
    mean = imgs.float().mean(dim=(1, 2, 3)) / 255
    torch.testing.assert_close(got, torch.stack([mean[0] + 111.0, mean[1] + 220.0]))
    both = build_reward(RewardConfig({"custom": 2.0, "brightness": 1.0}, custom_reward_function_path=str(path),
                                     custom_reward_function_name="compute_async"))
    torch.testing.assert_close(both.score(imgs, ["a", "b"]), 0.5 + mean)
    with pytest.raises(ValueError, match=r"reward\.custom_reward_function\.name='nope'.*\['compute_async', "
                                         r"'compute_score', 'helper'\]"):
        build_reward(RewardConfig(custom_reward_function_path=str(path), custom_reward_function_name="nope"))
    with pytest.raises(ValueError, match=r"reward\.custom_reward_function\.path=.*not a file"):
        build_reward(RewardConfig(custom_reward_function_path=str(tmp_path / "missing.py")))


def test_weighted_sum_and_config_validation():
    imgs = _smooth_and_noisy()
    reward = build_reward(RewardConfig({"brightness": 2.0, "jpeg_compressibility": 1.0}))
    parts = reward.score_components(imgs, ["a", "b"])
    torch.testing.assert_close(reward.score(imgs, ["a", "b"]), 2 * parts["brightness"] + parts["jpeg_compressibility"])
    with pytest.raises(ValueError, match=r"reward\.aggregation"):
        RewardConfig({"brightness": 1.0}, aggregation="mean")
    with pytest.raises(ValueError, match=r"reward\.custom_reward_function\.path"):
        RewardConfig({"custom": 1.0})
    with pytest.raises(ValueError, match="no reward"):
        RewardConfig({})
    with pytest.raises(ValueError, match="valid names"):
        build_reward(RewardConfig({"pickscore": 1.0}))
    assert isinstance(reward, Reward)


def test_ocr_text_score_by_hand():
    assert levenshtein("kitten", "sitting") == 3
    assert levenshtein("", "abc") == 3
    assert ocr_text_score("Hello World", "helloworld") == 1.0
    assert ocr_text_score("HELL0", "hello") == pytest.approx(0.8)
    assert ocr_text_score("", "hello") == 0.0
    assert ocr_text_score("a much longer unrelated text", "hi") == 0.0  # distance capped at len(target)


def test_ocr_missing_dependency_message(monkeypatch):
    monkeypatch.setitem(sys.modules, "rapidocr_onnxruntime", None)  # makes the import fail
    with pytest.raises(ImportError, match=r"pip install digenrl-verl\[ocr\]"):
        get_reward("ocr")
    assert "digenrl-verl[ocr]" in INSTALL_HINT


def test_ocr_reads_rendered_text():
    pytest.importorskip("rapidocr_onnxruntime", reason="OCR extra not installed (pip install digenrl-verl[ocr])")
    from PIL import Image, ImageDraw, ImageFont

    img = Image.new("RGB", (200, 64), "white")
    ImageDraw.Draw(img).text((10, 12), "HELLO 2049", fill="black", font=ImageFont.load_default(size=32))
    text_img = torch.from_numpy(np.array(img)).permute(2, 0, 1)
    noise = _smooth_and_noisy()[1:]
    reward = get_reward("ocr")
    good = reward.score(text_img[None], ['a sign that says "HELLO 2049"'])
    wrong = reward.score(text_img[None], ["a sign"], [{"ground_truth": "GOODBYE 1999"}])
    on_noise = reward.score(noise, ['"HELLO 2049"'])
    assert good.item() >= 0.9 and wrong.item() < 0.5 and on_noise.item() < 0.5
