"""Replay verl-omni's FlowGRPO / DanceGRPO example scripts through digenrl_verl's entry point, with the one flag.

Run with the verl-omni venv's python (scripts/verl_omni_venv.sh builds it):

    source scripts/verl_omni_venv.sh && $VERL_OMNI_PY scripts/replay_verl_omni_recipes.py [--markdown] [--only NAME]

For every `examples/{flowgrpo,dancegrpo}_trainer/**.sh` of the verl-omni source archive (../shared/upstream/, the
commit the project targets; 29 scripts):

1. the script runs under bash with `python3`/`python` (and `nvidia-smi`, `nsys`, which some scripts check for) shimmed
   on PATH: a call of `-m verl_omni.trainer.main*` records
   its argument list instead of starting verl-omni (so shell variables, `$((...))` and scripts that call other scripts
   expand exactly as they do for a user); any other python call runs the real interpreter;
2. its override list is composed by verl-omni's own Hydra config (the package's `verl_omni/trainer/config`, as its
   entry point does), to tell a script that is broken upstream from one we break;
3. the list, with the model path pointing at a local stand-in (a tiny model of the same architecture when the
   project has one; a directory whose model_index.json names the architecture otherwise; an empty directory for a
   model that is not a diffusers pipeline), a VLM judge (`reward.reward_model.model_path`, Qwen2.5-VL / Qwen3-VL) at
   a tiny random judge of its family, the data files at a local prompt file, and
   `trainer.digenrl.mode=disaggregated trainer.digenrl.dry_run=true` appended, goes to `python -m digenrl_verl.main`.

For an accepted script, the plan's `plan.json` (every key the run uses, with the value it uses) is compared with
verl-omni's composed config key by key (the keys both have): `differs` lists each key whose value is not verl-omni's,
but the stand-ins (model, judge, data files), seeds verl-omni leaves null (the plan draws one and prints it) and the
keys of `config.verl_omni.SAME_MEANING` (the same meaning in another form).

Each `python -m ...` of the replay (the dry run, the tiny stand-in builds) runs in a process forked from this one
after it imported `digenrl_verl.main` once, as `python -m` would run it (the module as `__main__`, argv, the working
directory first on sys.path, stdout and stderr apart): the 29 dry runs no longer pay the import of torch, Ray and
verl 29 times. `--jobs N` runs N of them at once (default: 2, at most the CPU count); the rows keep the scripts'
order.

Result per script: `accepted` (the dry run validates), `rejected: <key>` (our message names the key or model),
`hydra error` (composition failed) or `traceback` (anything else). Exit status 1 if any hydra error or traceback.

`--drop-unsupported` shows what stands behind those blockers: every override that sets a feature digenrl_verl rejects
as unsupported (`config.verl_omni.unsupported_on`, read in-process from the composed list) is dropped, the recipe's
device is taken as verl-omni's default GPU (`trainer.device=cuda`, so its GPU layout sizes the pools as on its
cluster); the script is then accepted or rejected for its model (architecture, not a diffusers pipeline) or what else
is left. The table lists what was dropped. (`rollout.name=vllm_omni` stays: a dry run plans for the cluster and
prints that this machine cannot run vLLM-Omni.)
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import re
import runpy
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
import traceback
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
UPSTREAM = Path(os.environ.get("DIGENRL_UPSTREAM_DIR") or ROOT.parent / "shared" / "upstream")  # as the venv script
ARCHIVE = UPSTREAM / "verl-omni-a1139baf.tar.gz"
TRAINERS = ("flowgrpo_trainer", "dancegrpo_trainer")
FLAG = ("trainer.digenrl.mode=disaggregated", "trainer.digenrl.dry_run=true")
A = "actor_rollout_ref"
# model path substring -> (diffusers _class_name of that model, whether digenrl_verl.models.tiny builds it); None:
# not a diffusers pipeline (BAGEL ships no model_index.json)
MODELS = (
    ("Qwen-Image-Edit", ("QwenImageEditPlusPipeline", False)),
    ("Qwen-Image", ("QwenImagePipeline", True)),
    ("stable-diffusion-3", ("StableDiffusion3Pipeline", True)),
    ("Wan2.2", ("WanPipeline", True)),
    ("LTX-2", ("LTX2Pipeline", False)),
    ("BAGEL", (None, False)),
)
#: the environment every `python -m` of the replay runs under (set in this process before the import it forks from)
ENV = {"HF_HUB_OFFLINE": "1", "TORCH_COMPILE_DISABLE": "1", "RAY_USAGE_STATS_ENABLED": "0"}
RECORD = 'import json, os, sys; open(os.environ["REPLAY_CAPTURE"], "a").write(json.dumps(sys.argv[1:]) + "\\n")'
SHIM = """#!/bin/sh
if [ "$1" = "-m" ] && case "$2" in verl_omni.trainer.main*) true;; *) false;; esac; then
  exec "{python}" -c "$REPLAY_RECORD" "$@"
fi
exec "{python}" "$@"
"""


@dataclass
class Replay:
    script: str
    architecture: str
    entry: str = ""
    upstream: str = ""  # verl-omni's own composition: ok / the error
    result: str = ""
    detail: str = ""
    dropped: str = ""  # --drop-unsupported: the overrides dropped or switched
    differs: str = ""  # accepted: the plan's keys whose value is not verl-omni's (`compare`), "; "-separated


def extract(archive: Path, into: Path) -> Path:
    with tarfile.open(archive) as tar:
        tar.extractall(into, filter="data")
    (root,) = [p for p in into.iterdir() if p.is_dir()]
    return root


def _module_child(module: str, argv: list[str], cwd: str, out: str, err: str, env: dict | None = None) -> None:
    """`python -m module argv` in `cwd`, in this forked process: stdout to `out`, stderr to `err`, the environment
    `env` when given; exits with the module's status."""
    if "torch" in sys.modules:
        # GNU OpenMP's thread pool does not survive fork: a parent that ran a parallel torch op (a test computing
        # in the pytest process) leaves the child's next one waiting on threads that are gone. One thread: no pool.
        sys.modules["torch"].set_num_threads(1)
    if env is not None:
        os.environ.clear()
        os.environ.update(env)
    os.chdir(cwd)
    sys.path[0] = cwd  # python -m puts the working directory first
    for fd, path in ((1, out), (2, err)):
        f = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        os.dup2(f, fd)
        os.close(f)
    sys.stdout = open(1, "w", buffering=1, closefd=False)
    sys.stderr = open(2, "w", buffering=1, closefd=False)
    try:
        sys.argv = [module, *argv]
        runpy.run_module(module, run_name="__main__", alter_sys=True)  # what `python -m module` runs
        code = 0
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
        if e.code is not None and not isinstance(e.code, int):
            print(e.code, file=sys.stderr)  # what the interpreter prints for sys.exit("message")
    except BaseException:  # noqa: BLE001 - reported as the interpreter would
        traceback.print_exc()
        code = 1
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


class Forked:
    """A `python -m module argv` running in a forked child (see _module_child); `result()` waits for it."""

    def __init__(self, module: str, argv: list[str], cwd: Path, logs: Path, timeout: float = 600,
                 env: dict | None = None) -> None:
        self.args = [sys.executable, "-m", module, *argv]
        self.out, self.err = logs.with_name(logs.name + ".out"), logs.with_name(logs.name + ".err")
        self.deadline = time.monotonic() + timeout
        self.proc = multiprocessing.get_context("fork").Process(
            target=_module_child, args=(module, list(argv), str(cwd), str(self.out), str(self.err), env))
        self.proc.start()

    def done(self) -> bool:
        return not self.proc.is_alive()

    def result(self) -> subprocess.CompletedProcess:
        self.proc.join(max(0.0, self.deadline - time.monotonic()))
        if self.proc.is_alive():
            self.proc.kill()
            self.proc.join()
        return subprocess.CompletedProcess(self.args, self.proc.exitcode, stdout=self.out.read_text(),
                                           stderr=self.err.read_text())


def run_module(module: str, argv: list[str], cwd: Path, logs: Path, timeout: float = 600) \
        -> subprocess.CompletedProcess:
    """`python -m module argv` in `cwd` (in a forked child): exit status, stdout, stderr."""
    return Forked(module, argv, cwd, logs, timeout).result()


def capture(script: Path, repo: Path, work: Path) -> list[list[str]]:
    shim = work / "shim"
    shim.mkdir(exist_ok=True)
    for name in ("python3", "python"):
        (shim / name).write_text(SHIM.format(python=sys.executable))
        (shim / name).chmod(0o755)
    for name in ("nvidia-smi", "nsys"):  # the scripts check for a GPU / Nsight before they call verl-omni
        (shim / name).write_text("#!/bin/sh\nexit 0\n")
        (shim / name).chmod(0o755)
    ascend = work / "ascend" / "latest"
    (ascend.parent / "nnal" / "atb").mkdir(parents=True, exist_ok=True)
    ascend.mkdir(parents=True, exist_ok=True)
    for f in (ascend / "set_env.sh", ascend.parent / "nnal" / "atb" / "set_env.sh"):
        f.write_text("")
    out = work / f"capture-{script.stem}.jsonl"
    out.unlink(missing_ok=True)
    home = work / "home"
    home.mkdir(exist_ok=True)
    env = {**os.environ, "PATH": f"{shim}:{os.environ['PATH']}", "HOME": str(home), "REPLAY_CAPTURE": str(out),
           "REPLAY_RECORD": RECORD,
           "ASCEND_HOME_PATH": str(ascend), "WANDB_MODE": "offline"}
    subprocess.run(["bash", str(script)], cwd=repo, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                   timeout=120, check=False)
    return [json.loads(line) for line in out.read_text().splitlines()] if out.exists() else []


def model_of(overrides: list[str]) -> tuple[str | None, bool, str]:
    path = next((o.split("=", 1)[1] for o in overrides if o.lstrip("+").startswith(f"{A}.model.path=")), "")
    for needle, (arch, tiny) in MODELS:
        if needle in path:
            return arch, tiny, path
    return None, False, path


def _check(proc: subprocess.CompletedProcess) -> None:
    if proc.returncode != 0:
        raise subprocess.CalledProcessError(proc.returncode, proc.args, proc.stdout, proc.stderr)


def stand_in_model(arch: str | None, tiny: bool, models: Path) -> Path:
    d = models / (arch or "not_diffusers")
    if d.exists():
        return d
    if tiny:
        _check(run_module("digenrl_verl.models.tiny", [arch, str(d)], Path.cwd(), models.parent / f"tiny-{arch}"))
    else:
        d.mkdir(parents=True)
        if arch:
            (d / "model_index.json").write_text(json.dumps({"_class_name": arch}))
    return d


# reward.reward_model.model_path substring -> the tiny random judge family of the same architecture
JUDGES = (("Qwen3-VL", "qwen3_vl"), ("Qwen2.5-VL", "qwen2_5_vl"))
JUDGE_KEY = "reward.reward_model.model_path"


def stand_in_judge(path: str, models: Path) -> Path | None:
    """A tiny random judge of the recipe's judge family (digenrl_verl.rewards.tiny_judge), or None (unknown family:
    the path stays as the script has it, and our entry point names it)."""
    family = next((fam for needle, fam in JUDGES if needle in path), None)
    if family is None:
        return None
    d = models / f"judge_{family}"
    if not d.exists():
        _check(run_module("digenrl_verl.rewards.tiny_judge", [str(d), "--family", family], Path.cwd(),
                          models.parent / f"judge-{family}"))
    return d


def localise(overrides: list[str], model_path: str, model_dir: Path, prompts: Path) -> list[str]:
    """The override list with the model (and a VLM judge) at local stand-ins of the same architecture, the data files
    at `prompts`, and the flag appended."""
    out = []
    for o in overrides:
        key, eq, value = o.partition("=")
        judge = stand_in_judge(value, model_dir.parent) if eq and key.lstrip("+") == JUDGE_KEY else None
        if eq and value == model_path:
            o = f"{key}={model_dir}"
        elif judge is not None:
            o = f"{key}={judge}"
        elif key.lstrip("+") in ("data.train_files", "data.val_files"):
            o = f"{key}={prompts}"
        out.append(o)
    return [*out, *FLAG]


# an UNSUPPORTED key set by a config-group override rather than a key=value
GROUP_OVERRIDES = {"model_engine": "diffusion/model_engine"}
HERE = ("trainer.device=cuda",)  # --drop-unsupported: the recipes' device (verl-omni's default)


def drop_unsupported(overrides: list[str]) -> tuple[list[str], list[str]]:
    """The override list without the overrides that switch on an unsupported feature (and set the device as the
    recipe's cluster has it), and what was dropped or switched."""
    import warnings

    from digenrl_verl.config.verl_omni import RecipeKeys, unsupported_on
    from digenrl_verl.main import compose

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            found = unsupported_on(RecipeKeys(compose(overrides)))
        except Exception as e:  # noqa: BLE001 - the replay itself then reports the composition error
            return overrides, [f"(not composed: {str(e).splitlines()[0][:120]})"]
    keys = {GROUP_OVERRIDES.get(key, key) for key, _, _ in found}

    def blocked(override: str) -> bool:
        key = override.partition("=")[0].lstrip("+~")
        return any(key == k or key.startswith(k + ".") for k in keys)

    kept = [o for o in overrides if not blocked(o) and not o.lstrip("+").startswith("trainer.device=")]
    notes = [f"{key}={value!r}" for key, value, _ in found]
    return [*kept, *HERE], notes


def upstream_compose(overrides: list[str], config_dir: Path) -> tuple[str, object]:
    """(ok / the error, verl-omni's composed config or None)."""
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    GlobalHydra.instance().clear()
    try:
        with initialize_config_dir(config_dir=str(config_dir), version_base=None):
            return "ok", compose(config_name="diffusion_trainer", overrides=overrides)
    except Exception as e:  # noqa: BLE001 - reported, not handled
        return str(e).splitlines()[0][:160], None
    finally:
        GlobalHydra.instance().clear()


#: keys the replay points at local stand-ins (model, judge, prompt files): their values differ by construction
STAND_INS = (f"{A}.model.path", "reward.reward_model.model_path", "data.train_files", "data.val_files")
#: seeds verl-omni leaves null (unseeded); the plan draws one and prints it
NULL_SEEDS = (f"{A}.rollout.seed", "data.seed")
_ABSENT = object()


def compare(plan: dict, theirs) -> list[str]:
    """`key: ours (verl-omni: theirs)` for each key of plan.json's `config` that verl-omni's composed config has with
    another value, but the stand-ins and drawn seeds."""
    from omegaconf import DictConfig, ListConfig, OmegaConf

    from digenrl_verl.config.verl_omni import SAME_MEANING

    out = []
    for key, ours in sorted(plan["config"].items()):
        value = OmegaConf.select(theirs, key, default=_ABSENT, throw_on_resolution_failure=False)
        if isinstance(value, (DictConfig, ListConfig)):
            value = OmegaConf.to_container(value, resolve=True)
        if value is _ABSENT or key in STAND_INS or (key in NULL_SEEDS and value is None):
            continue
        same = _same_number(ours, value) or _same_list_text(ours, value) or SAME_MEANING.get(key) == (ours, value)
        if ours != value and not same:
            out.append(f"{key}: {ours!r} (verl-omni: {value!r})")
    return out


def _same_number(a, b) -> bool:
    return isinstance(a, (int, float)) and isinstance(b, (int, float)) and not isinstance(a, bool) \
        and not isinstance(b, bool) and float(a) == float(b)


def _same_list_text(a, b) -> bool:
    """verl-omni's scripts quote some lists (`sde_window_range="[0,5]"`): the text and the list mean the same."""
    texts = [x for x in (a, b) if isinstance(x, str)]
    lists = [x for x in (a, b) if isinstance(x, list)]
    if len(texts) != 1 or len(lists) != 1:
        return False
    try:
        return json.loads(texts[0]) == lists[0]
    except json.JSONDecodeError:
        return False


def classify(proc: subprocess.CompletedProcess) -> tuple[str, str]:
    text = proc.stdout + proc.stderr
    if "Traceback (most recent call last)" in text:
        return "traceback", text.strip().splitlines()[-1][:200]
    if proc.returncode == 0 and "dry run: config valid" in text:
        return "accepted", ""
    lines = text.splitlines()
    start = next((i for i, line in enumerate(lines) if line.startswith("digenrl: invalid config:")), None)
    msg = "" if start is None else "\n".join([lines[start].removeprefix("digenrl: invalid config: "),
                                              *lines[start + 1:]]).strip()
    if re.search(r"Could not (override|append)|use \+|To append", text) or msg.startswith(("unknown key", "bad value")):
        return "hydra error", (msg or text.strip().splitlines()[-1])[:200]
    if proc.returncode == 2 and msg:
        return "rejected", msg
    return "traceback", (text.strip().splitlines() or ["(no output)"])[-1][:200]


def named_keys(detail: str) -> str:
    """The keys our rejection names, one per line of the message."""
    names = []
    for line in detail.splitlines():
        m = re.match(r"([A-Za-z_][\w./]*=.*?) is not supported", line) or re.match(r"([A-Za-z_][\w./]*=\S*)", line)
        names.append(m.group(1) if m else line[:90])
    return ", ".join(f"`{n}`" for n in names)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--archive", type=Path, default=ARCHIVE)
    ap.add_argument("--only", default=None, help="replay the scripts whose path contains this")
    ap.add_argument("--markdown", action="store_true", help="print the table as Markdown")
    ap.add_argument("--json", type=Path, default=None, help="also write the results here")
    ap.add_argument("--drop-unsupported", action="store_true",
                    help="drop the overrides of unsupported features (and take the recipes' GPU device) to show what "
                         "each script is then accepted or rejected for")
    ap.add_argument("--jobs", type=int, default=min(2, os.cpu_count() or 1),
                    help="dry runs at once (each in a process forked from this one)")
    args = ap.parse_args(argv)
    os.environ.update(ENV)
    import digenrl_verl.main  # noqa: F401 - imported once here; every dry run forks from this process

    work = Path(tempfile.mkdtemp(prefix="replay-verl-omni-"))
    try:
        repo = extract(args.archive, work / "src")
        config_dir = repo / "verl_omni" / "trainer" / "config"
        prompts = work / "prompts.txt"
        # 1024 prompts: verl-omni's dataloader drops a partial batch, so an epoch needs a batch's worth
        prompts.write_text("".join(f'a photo of the word "hello {i}"\n' for i in range(1024)))
        scripts = sorted(p for t in TRAINERS for p in (repo / "examples" / t).rglob("*.sh"))
        if args.only:
            scripts = [s for s in scripts if args.only in str(s)]
        rows: list[Replay] = []
        running: list[tuple[Replay, Forked, Path, object]] = []

        def finish(row: Replay, run: Forked, out_dir: Path, theirs) -> None:
            row.result, row.detail = classify(run.result())
            row.detail = row.detail.replace(str(work), "<work>")  # the replay's temporary directory
            if row.result == "accepted" and theirs is not None:
                row.differs = "; ".join(compare(json.loads((out_dir / "plan.json").read_text()), theirs))
            print(f"{row.result:12s} {row.script}: {row.detail.splitlines()[0][:120] if row.detail else ''}",
                  file=sys.stderr, flush=True)

        for script in scripts:
            rel = str(script.relative_to(repo / "examples"))
            calls = capture(script, repo, work)
            if len(calls) != 1:
                rows.append(Replay(rel, "?", result="traceback", detail=f"{len(calls)} verl-omni calls captured"))
                continue
            entry, overrides = calls[0][1], calls[0][2:]
            arch, tiny, model_path = model_of(overrides)
            row = Replay(rel, arch or "(not diffusers)", entry=entry.rsplit(".", 1)[-1])
            row.upstream, theirs = upstream_compose(overrides, config_dir)
            model_dir = stand_in_model(arch, tiny, work / "models")
            out_dir = work / "out" / str(len(rows))
            ours = [*localise(overrides, model_path, model_dir, prompts), f"trainer.digenrl.output_dir={out_dir}"]
            if args.drop_unsupported:
                ours, notes = drop_unsupported(ours)
                row.dropped = "; ".join(notes)
            while len(running) >= max(1, args.jobs):  # the oldest first: the rows keep the scripts' order
                finish(*running.pop(0))
            running.append((row, Forked("digenrl_verl.main", ours, repo, work / f"main-{len(rows)}"), out_dir,
                            theirs))
            rows.append(row)
        while running:
            finish(*running.pop(0))
        if args.json:
            args.json.write_text(json.dumps([r.__dict__ for r in rows], indent=1))
        print_table(rows, args.markdown, dropped=args.drop_unsupported)
        bad = [r for r in rows if r.result in ("hydra error", "traceback")]
        return 1 if bad else 0
    finally:
        shutil.rmtree(work, ignore_errors=True)


def print_table(rows: list[Replay], markdown: bool, dropped: bool = False) -> None:
    counts = {k: sum(r.result == k for r in rows) for k in ("accepted", "rejected", "hydra error", "traceback")}
    if markdown:
        extra = " dropped / switched |" if dropped else ""
        print(f"| script | entry | architecture | verl-omni composes |{extra} result |")
        print("|---|---|---|---|---|" + ("---|" if dropped else ""))
        for r in rows:
            res = f"rejected: {named_keys(r.detail)}" if r.result == "rejected" else r.result
            if r.result == "rejected" and dropped:  # what is left: the message says more than its key
                res = f"rejected: {r.detail.splitlines()[0][:150].replace('|', '/')}"
            if r.result in ("hydra error", "traceback"):
                res += f": {r.detail}"
            if r.result == "accepted":
                res += f"; differs from verl-omni: {r.differs.replace('|', '/')}" if r.differs else "; plan = verl-omni"
            up = "yes" if r.upstream == "ok" else f"no: {r.upstream}"
            cell = f" {', '.join(f'`{n}`' for n in r.dropped.split('; ') if n)} |" if dropped else ""
            print(f"| `{r.script}` | {r.entry} | {r.architecture} | {up} |{cell} {res} |")
    else:
        for r in rows:
            what = named_keys(r.detail) if r.result == "rejected" else r.detail[:150]
            print(f"{r.script:70s} {r.architecture:28s} {r.result:12s} {what}"
                  + (f"\n{'':70s} dropped: {r.dropped}" if dropped and r.dropped else "")
                  + (f"\n{'':70s} differs: {r.differs}" if r.differs else ""))
    print(f"\n{len(rows)} scripts: " + ", ".join(f"{v} {k}" for k, v in counts.items()))


if __name__ == "__main__":
    sys.exit(main())
