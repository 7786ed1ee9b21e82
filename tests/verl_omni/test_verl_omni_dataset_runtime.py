"""At run time, verl-omni's own dataset code reads the prompts where it is installed (issue 21, part 3): a parquet
file of a verl-omni recipe goes through `verl_omni.utils.dataset.rl_dataset.create_rl_dataset` (each row's
`raw_prompt` chat and `data_source`) and its `create_rl_sampler` orders the epochs; the step batches the runner takes
(a `PromptStream` per step at the step's cursor, as `DigenRLTrainer.step_batch` builds it) are verl-omni's
dataloader's (its dataset + sampler + collate function in a StatefulDataLoader with drop_last=True, as its trainers
build it, the dataset given a tokenizer as its TaskRunner gives one). The code path is checked by counting the calls
of verl-omni's functions (mutation: forcing our fall-back rules fails those assertions only).
"""

from __future__ import annotations

import pytest

try:
    import verl_omni  # noqa: F401  (imports vLLM-Omni eagerly)
except ImportError as e:
    pytest.skip(f"verl_omni is not importable here ({e}); run bash scripts/test_verl_omni.sh", allow_module_level=True)

import pandas as pd  # noqa: E402
from omegaconf import OmegaConf  # noqa: E402

import digenrl_verl.trainer.data as data  # noqa: E402
from digenrl_verl.config.verl_omni import RecipeKeys, build_data  # noqa: E402
from digenrl_verl.models._tiny_tokenizers import qwen2_tokenizer  # noqa: E402
from digenrl_verl.trainer.data import PromptStream, chat_text, load_prompts  # noqa: E402

from digenrl_verl.models._tiny_tokenizers import QWEN_IMAGE_SYSTEM as SYSTEM  # noqa: E402
N, BATCH = 13, 4  # 3 full batches an epoch, one prompt dropped


def _recipe_parquet(path, n: int = N, sources=("flow_grpo/ocr", "jpeg_compressibility"), with_source=True):
    """A verl-omni recipe's parquet (its data_process scripts' layout): system + user chat, data_source,
    reward_model.ground_truth, extra_info."""
    texts = [f'A sign that reads "{i:02d}"' for i in range(n)]
    frame = {"prompt": [[{"role": "system", "content": SYSTEM}, {"role": "user", "content": t}] for t in texts],
             "reward_model": [{"style": "rule", "ground_truth": f"{i:02d}"} for i in range(n)],
             "extra_info": [{"split": "train", "index": i} for i in range(n)]}
    if with_source:
        frame["data_source"] = [sources[i % len(sources)] for i in range(n)]
    pd.DataFrame(frame).to_parquet(path)
    return str(path)


@pytest.fixture
def calls(monkeypatch):
    """Counts the calls of verl-omni's create_rl_dataset / create_rl_sampler (they still run)."""
    import verl_omni.utils.dataset.rl_dataset as rl

    counts = {"dataset": 0, "sampler": 0}

    def counted(name, fn):
        def wrapper(*args, **kwargs):
            counts[name] += 1
            return fn(*args, **kwargs)
        return wrapper

    monkeypatch.setattr(rl, "create_rl_dataset", counted("dataset", rl.create_rl_dataset))
    monkeypatch.setattr(rl, "create_rl_sampler", counted("sampler", rl.create_rl_sampler))
    return counts


def _verl_loader(dataset, config, workers: int = 0):
    """verl-omni's training dataloader as its trainers build it: its dataset, sampler and collate function in a
    StatefulDataLoader with drop_last=True and `workers` worker processes (forked, as its trainer's are: verl's
    dataset does not pickle its rows)."""
    from torchdata.stateful_dataloader import StatefulDataLoader
    from verl_omni.utils.dataset.rl_dataset import create_rl_sampler, get_collate_fn

    return StatefulDataLoader(dataset=dataset, batch_size=BATCH, num_workers=workers, drop_last=True,
                              collate_fn=get_collate_fn(config), sampler=create_rl_sampler(config, dataset))


def _verl_omni_steps(path: str, seed: int, shuffle: bool, epochs: int):
    """verl-omni's training batches: (user texts, data sources, ground truths) per step."""
    from verl_omni.utils.dataset.rl_dataset import create_rl_dataset

    config = OmegaConf.create({"prompt_key": "prompt", "max_prompt_length": 512, "filter_overlong_prompts": False,
                               "shuffle": shuffle, "seed": seed, "reward_fn_key": "data_source"})
    dataset = create_rl_dataset([path], config, qwen2_tokenizer(), None, is_train=True)
    loader = _verl_loader(dataset, config)
    return [([chat_text(m) for m in b["raw_prompt"]], list(b["data_source"]),
             [r["ground_truth"] for r in b["reward_model"]]) for _ in range(epochs) for b in loader]


def _runner_steps(prompts, sources, extras, seed: int, shuffle: bool, steps: int):
    """The runner's step batches: a PromptStream per step at the step's cursor (`DigenRLTrainer.step_batch`)."""
    out = []
    for step in range(steps):
        picked = PromptStream(prompts, sources, BATCH, seed=seed, shuffle=shuffle, cursor=step * BATCH).next_indices()
        out.append(([prompts[j] for _, j in picked], [sources[j] for _, j in picked],
                    [extras[j]["reward_model"]["ground_truth"] for _, j in picked]))
    return out


@pytest.mark.parametrize("seed,shuffle", [(42, True), (7, True), (0, False)])
def test_the_runs_steps_are_verl_omnis_dataset_and_sampler(tmp_path, calls, seed, shuffle):
    path = _recipe_parquet(tmp_path / "train.parquet")
    prompts, sources, extras = load_prompts(path, "prompt", with_extras=True, source_key="data_source")
    assert calls == {"dataset": 1, "sampler": 0}  # verl-omni's dataset code read the file
    theirs = _verl_omni_steps(path, seed, shuffle, epochs=4)  # 12 steps over 4 epochs
    calls.update(dataset=0, sampler=0)
    assert _runner_steps(prompts, sources, extras, seed, shuffle, len(theirs)) == theirs
    assert calls == {"dataset": 0, "sampler": 1}  # one verl-omni sampler ordered every epoch of the run
    assert PromptStream(prompts, sources, BATCH, seed=seed, shuffle=shuffle).reader == "verl-omni"
    assert prompts[:2] == ['A sign that reads "00"', 'A sign that reads "01"']  # the user text, no system turn
    # a resumed run (a fresh read of the file, the stream at step 9's cursor) continues the same sequence
    again = load_prompts(path, "prompt", with_extras=True, source_key="data_source")
    assert _runner_steps(*again, seed, shuffle, 10)[9] == theirs[9]


def test_the_fall_back_rules_give_the_same_rows(tmp_path, calls, monkeypatch):
    """Our rules (forced here) read the same prompts, data sources and extras, and the path-taken checks tell the
    two apart: nothing of verl-omni's is called and the stream's reader is ours."""
    path = _recipe_parquet(tmp_path / "train.parquet")
    ours = load_prompts(path, "prompt", with_extras=True)
    monkeypatch.setattr(data, "verl_omni_dataset_reason", lambda files: "forced")
    calls.update(dataset=0, sampler=0)
    fallback = load_prompts(path, "prompt", with_extras=True)
    assert calls["dataset"] == 0 and PromptStream(*fallback[:2], BATCH).reader == "digenrl"
    assert [list(x) for x in fallback] == [list(x) for x in ours]
    assert _runner_steps(*fallback, 3, True, 9) == _runner_steps(*ours, 3, True, 9)


def test_files_without_a_data_source_column_name_their_rows(tmp_path, calls):
    """Two files through verl-omni's dataset (concatenated in order): a file without the column names its rows."""
    first = _recipe_parquet(tmp_path / "a.parquet", n=3)
    second = _recipe_parquet(tmp_path / "b.parquet", n=2, with_source=False)
    prompts, sources = load_prompts([first, second], "prompt")
    assert calls["dataset"] == 1 and len(prompts) == 5
    assert sources == ["flow_grpo/ocr", "jpeg_compressibility", "flow_grpo/ocr", "b.parquet", "b.parquet"]


def test_the_plan_names_verl_omnis_dataset_code(tmp_path):
    path = _recipe_parquet(tmp_path / "train.parquet")
    (tmp_path / "t.txt").write_text("a\nb\n")
    lines = {}
    for name, files in (("parquet", path), ("text", str(tmp_path / "t.txt"))):
        keys = RecipeKeys(OmegaConf.create({"data": {"train_files": files, "prompt_key": "prompt", "seed": 1,
                                                     "shuffle": True, "val_files": None, "val_max_samples": -1,
                                                     "reward_fn_key": "data_source"}}))
        build_data(keys)
        [lines[name]] = [d for d in keys.decisions if d.startswith("data.train_files: ")]
    assert "read by verl-omni's own dataset code (create_rl_dataset" in lines["parquet"]
    assert "this package's rules" in lines["text"] and "t.txt is not parquet" in lines["text"]


def _resumed_texts(dataset, config, workers: int, state: dict, count: int) -> list[list[str]]:
    """The user texts of the next `count` batches of verl-omni's training dataloader (`_verl_loader`) resumed from
    `state`, as verl's loop takes them."""
    loader = _verl_loader(dataset, config, workers)
    loader.load_state_dict(state)
    out: list[list[str]] = []
    while len(out) < count:  # the rest of this epoch, then new epochs
        out += [[chat_text(m) for m in b["raw_prompt"]] for b in loader][: count - len(out)]
    return out


def _loader_state_after(dataset, config, workers: int, steps: int) -> dict:
    """verl-omni's own dataloader's `state_dict()` after `steps` batches (what its trainer writes as data.pt)."""
    loader = _verl_loader(dataset, config, workers)
    taken = 0
    while True:
        for _ in loader:
            taken += 1
            if taken == steps:
                return loader.state_dict()


@pytest.mark.parametrize("workers", [0, 2])
def test_the_checkpoints_loader_state_resumes_verl_omnis_dataloader_as_its_own(tmp_path, workers):
    """`verl_loader_state` (a checkpoint's `data.pt`, issue 30 cross-resume): verl-omni's own training dataloader
    (its dataset with a tokenizer, its sampler, `data.dataloader_num_workers` workers) resumed from it yields what it
    yields resumed from its own state after the same steps, across epoch ends (k = 3 ends the first epoch). Without
    workers that is the run's next steps. With workers it is not, for verl-omni's own state either (torchdata's
    multi-process resume with this sampler; measured: after 2 of an epoch's 3 batches it repeats prompts of the
    epoch's first two): the checkpoint resumes verl-omni's trainer as its own checkpoint would."""
    from verl_omni.utils.dataset.rl_dataset import create_rl_dataset

    path = _recipe_parquet(tmp_path / "train.parquet")
    prompts, sources, extras = load_prompts(path, "prompt", with_extras=True, source_key="data_source")
    runner = _runner_steps(prompts, sources, extras, 42, True, 8)
    config = OmegaConf.create({"prompt_key": "prompt", "max_prompt_length": 512, "filter_overlong_prompts": False,
                               "shuffle": True, "seed": 42, "reward_fn_key": "data_source"})
    dataset = create_rl_dataset([path], config, qwen2_tokenizer(), None, is_train=True)
    for k in (2, 3, 5):
        ours = _resumed_texts(dataset, config, workers, data.verl_loader_state(prompts, BATCH, 42, True, workers, k),
                              8 - k)
        theirs = _resumed_texts(dataset, config, workers, _loader_state_after(dataset, config, workers, k), 8 - k)
        assert ours == theirs, (workers, k)
        if workers == 0:
            assert ours == [texts for texts, _, _ in runner[k:]], k
    assert data.verl_loader_state(prompts, BATCH, 42, True, workers, 0) is None  # nothing taken, nothing to resume
    assert data.verl_loader_state(list(prompts), BATCH, 42, True, workers, 1) is None  # not verl-omni's dataset
