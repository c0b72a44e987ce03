"""verl's own example overrides are accepted unchanged by the recipes and land on the same values.

The examples: ``tests/data/verl_examples.json``, written by ``scripts/extract_verl_examples.py`` from verl's
``examples/**/*.sh`` (each entry names its script and verl commit; the extractor's docstring says how the shell is
evaluated). Every entry not marked ``skipped`` must validate with its own recipe (``grpo``, or ``kl_ppo`` where verl
would use a critic), and every override must land, value for value, in the resolved config: in-process for all of
them, through ``python -m recipes.<recipe> action=validate`` and its ``resolved_config.yaml`` for one per examples/
sub-folder.
"""

from __future__ import annotations

import functools
import importlib.util
import inspect
import json
import re
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
from hydra import compose, initialize_config_module
from hydra.core.global_hydra import GlobalHydra
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.core.override_parser.types import OverrideType
from omegaconf import DictConfig, ListConfig, OmegaConf

from recipes.check.validate import validate
from recipes.compose.compose import compose_recipe
from recipes.compose.overrides import override_value
from recipes.errors import ConfigError
from recipes.launch import run_recipe

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES_FILE = ROOT / "tests" / "data" / "verl_examples.json"
EXAMPLES = json.loads(EXAMPLES_FILE.read_text())
TAKEN = [e for e in EXAMPLES if not e["skipped"]]
_ABSENT = object()


def _one_per_folder(examples: list[dict]) -> list[dict]:
    """The first example (by source) of each ``examples/<folder>/``: the CLI subset."""
    seen: dict[str, dict] = {}
    for example in examples:
        seen.setdefault(example["source"].split("/")[1], example)
    return list(seen.values())


CLI_SUBSET = _one_per_folder(TAKEN)

# Examples the pack does not take yet, each with its cause (work of the issue "the verl contract"). Strict: a fixed
# cause makes its test pass and then this entry must go.
KNOWN_GAPS: dict[str, str] = {}

# Examples whose planned peak memory per GPU exceeds their GPUs (recipes.check.fit), each with the plan's arithmetic.
# verl runs them on these GPUs, so an entry here means the memory model is off for it; they validate with
# run.allow_overcommit=true, the expert's way on. Strict: each must still be refused without it.
# None left: examples/grpo_trainer/run_qwen3_30b_a3b_fsdp.sh was planned at 105.57 GiB with fp32 logits and their
# gradient (37.09 GiB); verl's FSDP engine materialises bf16 logits and flash-attn's cross-entropy writes their
# gradient in place (measured on an H200, scripts/gpu/results/2026-12-01-h200-memory): 77.29 GiB of 80 now.
OVERCOMMITTED: dict[str, str] = {}

# through the CLI on a machine without GPUs only (none left: verl's layout keys now mean a GPU run)
CLI_GAPS: dict[str, str] = {}


def _params(examples: list[dict], gaps: dict[str, str]) -> list:
    return [pytest.param(e, id=_id(e), marks=pytest.mark.xfail(strict=True, reason=gaps[e["source"]]))
            if e["source"] in gaps else pytest.param(e, id=_id(e)) for e in examples]


def _plain(value):
    return OmegaConf.to_container(value, resolve=True) if isinstance(value, (DictConfig, ListConfig)) else value


def _same(typed, saved) -> bool:
    """Whether the saved value is the typed one: equal scalars (a bool only equals a bool, a string only a string;
    1 and 1.0 are the same number), equal lists, and a typed dict's keys merged in with their values (Hydra merges a
    dict into the node it overrides)."""
    if isinstance(typed, dict):
        return isinstance(saved, dict) and all(k in saved and _same(v, saved[k]) for k, v in typed.items())
    if isinstance(typed, list):
        return isinstance(saved, list) and len(typed) == len(saved) and all(map(_same, typed, saved))
    if isinstance(typed, bool) or isinstance(saved, bool):
        return type(typed) is type(saved) and typed == saved
    if isinstance(typed, (int, float)) and isinstance(saved, (int, float)):
        return typed == saved
    return type(typed) is type(saved) and typed == saved


def drift(overrides: list[str], resolved) -> list[str]:
    """One line per override whose key does not hold the typed value in ``resolved`` (parsed as Hydra parses
    the command line: ``key=value``, ``+key=value``, ``++key=value``, ``~key``)."""
    problems = []
    overrides = [o for o in overrides if not o.startswith("-")]  # a flag (--config-name) is not a key's value
    for override in OverridesParser.create().parse_overrides(overrides):
        text, key = override.input_line, override.key_or_group
        saved = _plain(OmegaConf.select(resolved, key, default=_ABSENT))
        if override.is_sweep_override():
            problems.append(f"{text}: a sweep, not one value")
        elif override.type == OverrideType.DEL:
            if saved is not _ABSENT and saved is not None:
                problems.append(f"{text}: still there as {saved!r}")
        elif saved is _ABSENT:
            problems.append(f"{text}: {key} is not in the saved config")
        elif not _same(override.value(), saved):
            problems.append(f"{text}: typed {override.value()!r}, saved {saved!r}")
    return problems


def _id(example: dict) -> str:
    return example["source"].removeprefix("examples/")

# verl examples/grpo_trainer/run_qwen2-7b_seq_balance.sh: its dotted overrides after the shell expands them
# ($HOME, rollout_name=sglang, rollout_mode=async, return_raw_chat=True, quotes removed)
HOME = str(Path.home())
VERL_GRPO_SEQ_BALANCE_QWEN2_7B = [
    "algorithm.adv_estimator=grpo",
    f"data.train_files={HOME}/data/gsm8k/train.parquet",
    f"data.val_files={HOME}/data/gsm8k/test.parquet",
    "data.return_raw_chat=True",
    "data.train_batch_size=1024",
    "data.max_prompt_length=512",
    "data.max_response_length=1024",
    "data.filter_overlong_prompts=True",
    "data.truncation=error",
    "actor_rollout_ref.model.path=Qwen/Qwen2-7B-Instruct",
    "actor_rollout_ref.actor.optim.lr=1e-6",
    "actor_rollout_ref.model.use_remove_padding=True",
    "actor_rollout_ref.actor.ppo_mini_batch_size=256",
    "actor_rollout_ref.actor.use_dynamic_bsz=True",
    "actor_rollout_ref.actor.ppo_max_token_len_per_gpu=24000",
    "actor_rollout_ref.actor.use_kl_loss=True",
    "actor_rollout_ref.actor.kl_loss_coef=0.001",
    "actor_rollout_ref.actor.kl_loss_type=low_var_kl",
    "actor_rollout_ref.actor.entropy_coeff=0",
    "actor_rollout_ref.model.enable_gradient_checkpointing=True",
    "actor_rollout_ref.actor.fsdp_config.param_offload=False",
    "actor_rollout_ref.actor.fsdp_config.optimizer_offload=False",
    "actor_rollout_ref.rollout.tensor_model_parallel_size=2",
    "actor_rollout_ref.rollout.name=sglang",
    "actor_rollout_ref.rollout.mode=async",
    "actor_rollout_ref.rollout.multi_turn.format=hermes",
    "actor_rollout_ref.rollout.gpu_memory_utilization=0.6",
    "actor_rollout_ref.rollout.n=5",
    "actor_rollout_ref.ref.fsdp_config.param_offload=True",
    "algorithm.use_kl_in_reward=False",
    "trainer.critic_warmup=0",
    "trainer.logger=[console,wandb]",
    "trainer.project_name=verl_grpo_example_gsm8k",
    "trainer.experiment_name=qwen2_7b_function_rm_kl1e-3",
    "trainer.val_before_train=False",
    "trainer.n_gpus_per_node=8",
    "trainer.nnodes=1",
    "trainer.save_freq=20",
    "trainer.test_freq=5",
    "trainer.total_epochs=15",
]


def test_verl_grpo_example_overrides_are_accepted_and_land():
    # unchanged: the script's overrides alone, on the recipe's GPU defaults
    cfg = compose_recipe("grpo", VERL_GRPO_SEQ_BALANCE_QWEN2_7B)
    checked = validate(cfg)
    resolved = checked.cfg
    assert resolved.actor_rollout_ref.actor.ppo_max_token_len_per_gpu == 24000
    assert resolved.actor_rollout_ref.rollout.tensor_model_parallel_size == 2
    assert resolved.layout.infer.tp == 2  # adopted into the pack's layout: no drift
    assert resolved.actor_rollout_ref.model.path == "Qwen/Qwen2-7B-Instruct"
    assert resolved.actor_rollout_ref.rollout.name == "sglang" and resolved.rollout.name == "sglang"
    assert resolved.actor_rollout_ref.rollout.multi_turn.format == "hermes"
    assert resolved.data.train_files == f"{HOME}/data/gsm8k/train.parquet"
    assert resolved.actor_rollout_ref.ref.fsdp_config.param_offload is True
    assert resolved.actor_rollout_ref.actor.kl_loss_type == "low_var_kl"
    assert list(resolved.trainer.logger) == ["console", "wandb"]
    assert resolved.trainer.project_name == "verl_grpo_example_gsm8k"
    assert (resolved.trainer.nnodes, resolved.trainer.n_gpus_per_node, resolved.trainer.total_epochs) == (1, 8, 15)
    assert resolved.data.truncation == "error" and resolved.data.filter_overlong_prompts is True
    assert resolved.algorithm.adv_estimator == "grpo"


# -- every extracted example, in-process ---------------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize("example", _params(TAKEN, KNOWN_GAPS))
def test_verl_example_validates_and_every_override_lands(example):
    overrides = list(example["overrides"])
    if example["source"] in OVERCOMMITTED:
        with pytest.raises(ConfigError, match=r"^memory: planned peak .* > cluster.gpu.memory_gib"):
            validate(compose_recipe(example["recipe"], overrides))
        overrides.append("run.allow_overcommit=true")
    try:
        checked = validate(compose_recipe(example["recipe"], overrides))
    except ConfigError as error:
        pytest.fail(f"{example['source']} ({example['recipe']}): config error: {error}")
    problems = drift(example["overrides"], checked.cfg)
    assert not problems, f"{example['source']}: the saved config is not what was typed:\n" + "\n".join(problems)


_ONE_INTERPOLATION = re.compile(r"\$\{[^${}]*\}")  # a value that is one interpolation, nothing else

def _leaves(node, prefix=""):
    if isinstance(node, dict):
        for key, value in node.items():
            yield from _leaves(value, f"{prefix}.{key}" if prefix else str(key))
    else:
        yield prefix, node


def _verl_composition(overrides: list[str]) -> tuple[dict, dict]:
    """verl 0.9.1's own trainer config for these overrides (its ppo_trainer, as main_ppo composes it): resolved, and
    as written (interpolations kept)."""
    GlobalHydra.instance().clear()
    try:
        with initialize_config_module(config_module="verl.trainer.config", version_base=None):
            cfg = compose(config_name="ppo_trainer", overrides=overrides)
            return OmegaConf.to_container(cfg, resolve=True), OmegaConf.to_container(cfg, resolve=False)
    finally:
        GlobalHydra.instance().clear()


def _differs_from_verl(overrides: list[str], saved) -> dict[str, tuple]:
    """Each verl key the overrides leave unset, and verl does not interpolate from another, whose saved value differs
    from verl's (the critic's keys only where verl starts a critic), as {key: (saved, verl's)}."""
    typed = {o.split("=", 1)[0].lstrip("+~") for o in overrides if "=" in o}
    ours = dict(_leaves(OmegaConf.to_container(saved, resolve=True)))
    use_critic = saved.critic.enable if saved.critic.enable is not None else saved.algorithm.adv_estimator == "gae"
    resolved, written = _verl_composition(overrides)
    # a key verl interpolates (actor.rollout_n: ${...rollout.n}) follows its source, which is compared itself
    follows = {key for key, raw in _leaves(written) if isinstance(raw, str) and _ONE_INTERPOLATION.fullmatch(raw)}
    out = {}
    for key, value in _leaves(resolved):
        if key in typed | follows or key not in ours or (key.startswith("critic.") and not use_critic):
            continue
        numbers = {type(ours[key]), type(value)} <= {int, float}
        if ours[key] != value or (type(ours[key]) is not type(value) and not numbers):
            out[key] = (ours[key], value)
    # a value verl's code fixes where its config has no key: the replay buffer's poll interval, its signature's default
    poll_key, poll = "trainer.v1.sampler.sampler_kwargs.poll_interval", _verl_poll_interval()
    if poll_key not in typed and poll_key in ours and ours[poll_key] != poll:
        out[poll_key] = (ours[poll_key], poll)
    return out


@functools.cache
def _verl_poll_interval() -> float:
    from verl.trainer.ppo.v1.replay_buffer import ReplayBuffer  # lazy: verl's trainer stack

    return inspect.signature(ReplayBuffer.__init__).parameters["poll_interval"].default


def _noted_keys(stderr: str) -> dict[str, tuple]:
    """The keys of the changed-defaults note (``  k1, k2: ours (verl: theirs)  ->  override``)."""
    lines = stderr.splitlines()
    heads = [i for i, line in enumerate(lines) if "of verl's defaults differ in this run" in line]
    if not heads:
        return {}
    out = {}
    for line in lines[heads[0] + 1:]:
        if not line.startswith("  ") or "  ->  " not in line:
            break
        keys, _, rest = line.strip().partition(": ")
        for key in keys.split(", "):
            out[key] = rest
    return out


# -- one example per examples/ sub-folder, through the CLI ----------------------------------------------------------


def _validate_in_process(example: dict, cwd: Path, capsys, monkeypatch) -> SimpleNamespace:
    """``main()`` of the recipe with the example's command line, as the CLI runs it: exit code, stdout, stderr."""
    monkeypatch.chdir(cwd)
    try:
        run_recipe(example["recipe"], ["action=validate", *example["overrides"]])
        code = 0
    except SystemExit as stop:
        code = stop.code or 0
    out, err = capsys.readouterr()
    return SimpleNamespace(returncode=code, stdout=out, stderr=err)


# the first example of the subset runs as a real process (python -m recipes.<recipe>); the others call main()
@pytest.mark.parametrize("example", _params(CLI_SUBSET, {**KNOWN_GAPS, **CLI_GAPS}))
def test_verl_example_through_the_cli(example, tmp_path, recipe_cli, capsys, monkeypatch):
    if example is CLI_SUBSET[0]:
        proc = recipe_cli(example["recipe"], "action=validate", *example["overrides"], cwd=tmp_path, timeout=300)
    else:
        proc = _validate_in_process(example, tmp_path, capsys, monkeypatch)
    assert proc.returncode == 0, f"{example['source']}: exit {proc.returncode}\n{proc.stderr[-3000:]}"
    assert "config OK" in proc.stdout, proc.stdout
    written = list((tmp_path / "runs" / example["recipe"]).glob("*/resolved_config.yaml"))
    assert len(written) == 1, written
    saved = OmegaConf.load(written[0])
    # the one documented addition: the pack adds verl's `file` logger, so metrics.jsonl lands in the run folder (a
    # single backend typed as a string, as verl's Tracking takes it, becomes the list [it, file])
    assert saved.trainer.logger[-1] == "file"
    typed = [override_value(o) for o in example["overrides"] if o.startswith("trainer.logger=")]
    if not (typed and "file" in typed[-1]):
        saved.trainer.logger = list(saved.trainer.logger)[:-1]
    if typed and not typed[-1].lstrip().startswith("["):
        assert len(saved.trainer.logger) == 1, saved.trainer.logger
        saved.trainer.logger = saved.trainer.logger[0]
    problems = drift(example["overrides"], saved)
    assert not problems, f"{example['source']}: resolved_config.yaml is not what was typed:\n" + "\n".join(problems)
    # what the script leaves unset differs from verl's own run only where the stderr note says so
    differ = set(_differs_from_verl(example["overrides"], OmegaConf.load(written[0])))
    noted = set(_noted_keys(proc.stderr))
    assert differ == noted, (f"{example['source']}: differ from verl, not noted: {sorted(set(differ) - set(noted))}; "
                             f"noted, not differing: {sorted(set(noted) - set(differ))}")


# -- the data itself --------------------------------------------------------------------------------------------


def test_the_examples_file_is_whole_and_readable():
    sources = [e["source"] for e in EXAMPLES]
    assert sources == sorted(sources) and len(set(sources)) == len(sources)
    assert len(TAKEN) >= 60, "most of verl's example scripts are taken"
    for example in EXAMPLES:
        assert set(example) == {"source", "commit", "recipe", "env", "overrides", "skipped"}, example["source"]
        assert example["recipe"] in ("grpo", "kl_ppo")
        assert example["skipped"] or example["overrides"], example["source"]
        assert all(isinstance(o, str) and ("=" in o or o.startswith("~")) for o in example["overrides"]), example

    folders = {e["source"].split("/")[1] for e in TAKEN}
    assert {e["source"].split("/")[1] for e in CLI_SUBSET} == folders
    assert {"kl_ppo", "grpo"} <= {e["recipe"] for e in CLI_SUBSET}


def test_the_drift_check_sees_a_changed_value():
    resolved = OmegaConf.create({"a": {"b": 2, "c": [1, 2], "d": "x", "e": True, "f": {"g": 1, "h": 2}}})
    assert drift(["a.b=2", "a.c=[1,2]", "a.d=x", "a.e=True", "a.f={g:1}", "+a.b=2.0"], resolved) == []
    assert len(drift(["a.b=3", "a.c=[1]", "a.d=y", "a.e=1", "a.f={g:2}", "a.z=1", "~a.b", "a.d='2'"], resolved)) == 8


@functools.cache
def _extractor():
    """``scripts/extract_verl_examples.py`` as a module (scripts/ is not a package)."""
    name = "extract_verl_examples"
    spec = importlib.util.spec_from_file_location(name, ROOT / "scripts" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # its dataclasses look their module up
    spec.loader.exec_module(module)
    return module


SCRIPT = r"""#!/usr/bin/env bash
set -xeuo pipefail
DEVICE=${DEVICE:-$(python3 -c 'import torch_npu' 2>/dev/null && echo npu || echo gpu)}
MODEL=${MODEL:-Qwen/Qwen3-8B}
n=$(((512 + 1536) * 2))
ARGS=(
    data.max_prompt_length=${n}   # a comment
    trainer.logger='["console","wandb"]'
    data.train_files="['$HOME/data/a.parquet', '$HOME/data/b.parquet']"
)
case "${DEVICE}" in
    gpu) ARGS+=(trainer.device=cuda) ;;
    *) exit 1 ;;
esac
if [ "${VERL_USE_UV:-1}" != 0 ] && { [ "$DEVICE" = npu ] || [ "$DEVICE" = gpu ]; }; then
    LAUNCH=(uv run --extra vllm python3)
fi
EXTRA="a.b=1 \
    c.d=$HOME/x"
NAME=run_${MODEL##*/}_$(date +%Y%m%d)
PYTHONUNBUFFERED=1 "${LAUNCH[@]}" -m verl.trainer.main_ppo \
    --config-path=config --config-name='ppo_trainer.yaml' \
    actor_rollout_ref.model.path="$MODEL" "${ARGS[@]}" $EXTRA trainer.experiment_name=$NAME "$@"
"""


def test_the_extractor_expands_a_script_as_bash_does():
    example = _extractor().extract(SCRIPT, "examples/x/run.sh", "c0ffee", "/home/user", "/home/user/verl")
    assert example.skipped is None and example.recipe == "kl_ppo"  # no adv_estimator: verl's default gae
    assert example.overrides == [
        "actor_rollout_ref.model.path=Qwen/Qwen3-8B",
        "data.max_prompt_length=4096",
        'trainer.logger=["console","wandb"]',
        "data.train_files=['/home/user/data/a.parquet', '/home/user/data/b.parquet']",
        "trainer.device=cuda",
        "a.b=1",
        "c.d=/home/user/x",
        "trainer.experiment_name=run_Qwen3-8B_20260101",
    ]


def test_the_extractor_sets_what_a_script_demands_and_skips_other_trainers():
    extractor = _extractor()
    demanding = "set -u\nP=${ROOT}/m\npython -m verl.trainer.main_ppo actor_rollout_ref.model.path=$P\n"
    example = extractor.extract(demanding, "examples/x/a.sh", "c0ffee", "/home/user", "/home/user/verl")
    assert example.env == {"ROOT": "/path/to/ROOT"}
    assert example.overrides == ["actor_rollout_ref.model.path=/path/to/ROOT/m"]
    other = "python3 -m verl.trainer.main_ppo --config-path=config --config-name=my_trainer a.b=1\n"
    example = extractor.extract(other, "examples/x/b.sh", "c0ffee", "/home/user", "/home/user/verl")
    assert example.skipped.startswith("--config-name=my_trainer") and example.overrides == ["a.b=1"]
    # verl's ppo_megatron_trainer is taken (model_engine=megatron): the flag is kept as typed
    megatron = "python3 -m verl.trainer.main_ppo --config-path=config --config-name=ppo_megatron_trainer a.b=1\n"
    example = extractor.extract(megatron, "examples/x/c.sh", "c0ffee", "/home/user", "/home/user/verl")
    assert example.overrides == ["--config-name=ppo_megatron_trainer", "a.b=1"]


@pytest.mark.parametrize("source,strategy", [("examples/ppo_trainer/run_qwen3_8b_megatron.sh", "megatron"),
                                             ("examples/grpo_trainer/run_qwen3_30b_veomni.sh", "veomni"),
                                             # --config-name=ppo_megatron_trainer, verl's other primary config
                                             ("examples/grpo_trainer/run_qwen2-7b_math_megatron_fsdp.sh", "megatron")])
def test_verl_engine_switch_through_the_cli(source, strategy, tmp_path, recipe_main):
    """verl's ``model_engine=<engine>`` is the pack's strategy of that engine: said once on stderr, saved as verl's."""
    example = next(e for e in TAKEN if e["source"] == source)
    proc = recipe_main(example["recipe"], "action=validate", *example["overrides"], cwd=tmp_path, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert f"note: model_engine={strategy} (verl's engine switch) chooses strategy={strategy}" in proc.stderr
    assert proc.stdout.splitlines()[-2].startswith(f"config OK: {strategy} train ")
    saved = OmegaConf.load(next((tmp_path / "runs" / example["recipe"]).glob("*/resolved_config.yaml")))
    assert saved.model_engine == strategy and saved.actor_rollout_ref.actor.strategy == strategy
    assert saved.actor_rollout_ref.actor._target_ == {"megatron": "verl.workers.config.McoreActorConfig",
                                                       "veomni": "verl.workers.config.VeOmniActorConfig"}[strategy]
