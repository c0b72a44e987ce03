"""``python -m recipes.<recipe> --help`` as a user runs it: the actions, every group of conf/ with its options (the
default and the embedded CPU default marked, each option's line from its file's header comment), example commands that
validate, ``--help <group>``; and the console scripts, whose bash completion script bash accepts."""

from __future__ import annotations

import math
import re
import shlex
import shutil
import subprocess

import pytest
import yaml

from recipes.compose.confdir import conf_dir, group_options, pack_groups, recipe_defaults
from recipes.compose.defaults import EMBEDDED_DEFAULTS
from recipes.launch import ACTIONS
from tests.conftest import checkout_env

RECIPES = ("grpo", "kl_ppo")
GROUP_LINE = re.compile(r"^  (?P<group>[a-z_]+)(?:: .*)?$")
OPTION_LINE = re.compile(r"^    (?P<mark>[* ]) (?P<option>\S+) +(?P<line>.*?)(?P<cpu> \[no GPU\])?$")


def file_header(path) -> str:
    """The file's leading comment block as the help documents it: no ``# @package``, its first paragraph (ended by a
    blank comment line or an example command, ``python ...``; a command before it is skipped) joined into one line."""
    words = []
    for raw in path.read_text().splitlines():
        if not raw.startswith("#"):
            break
        text = raw[1:].strip()
        if text.startswith("@package"):
            continue
        if not text or text.startswith("python "):
            if words:
                break
            continue
        words.append(text)
    return " ".join(words)


def assert_first_sentence(line: str, header: str, what: str) -> None:
    """``line`` is the header's first sentence: the whole header, or a prefix of it that ends a sentence."""
    assert line, f"{what} has no header comment"
    assert header.startswith(line) and line.endswith("."), (what, line, header)
    assert line == header or header[len(line)] == " ", (what, line, header)


def sections(stdout: str) -> dict[str, list[str]]:
    """The help's sections by their heading (a line that starts in column 0 and ends with ':' or '):')."""
    found: dict[str, list[str]] = {}
    current = None
    for line in stdout.splitlines():
        if line and not line.startswith(" ") and line.endswith(":"):
            current = line.split(" ", 1)[0].rstrip(":")
            found[current] = []
        elif current is not None and line.strip():
            found[current].append(line)
    return found


def parse_groups(lines: list[str]) -> dict[str, list[dict]]:
    groups: dict[str, list[dict]] = {}
    group = None
    for line in lines:
        option = OPTION_LINE.match(line)
        if option and group is not None:
            groups[group].append(option.groupdict())
            continue
        heading = GROUP_LINE.match(line)
        assert heading, f"neither a group nor an option line: {line!r}"
        group = heading["group"]
        groups[group] = []
    return groups


@pytest.fixture(scope="module")
def helps(tmp_path_factory):
    from tests.conftest import run_recipe_cli, run_recipe_main

    # --help in a real child process per recipe, as a user types it; -h (the same answer) in-process
    cwd = tmp_path_factory.mktemp("help")
    return {(recipe, flag): (run_recipe_cli if flag == "--help" else run_recipe_main)(recipe, flag, cwd=cwd)
            for recipe in RECIPES for flag in ("--help", "-h")}


@pytest.mark.parametrize("flag", ["--help", "-h"])
@pytest.mark.parametrize("recipe", RECIPES)
def test_help_names_every_group_and_option_with_its_header_line(helps, recipe, flag):
    proc = helps[recipe, flag]
    assert proc.returncode == 0, proc.stderr
    assert "Hydra" not in proc.stdout.split("more:")[0]  # the pack's help, not Hydra's
    text = sections(proc.stdout)
    groups = parse_groups(text["config"])
    assert list(groups) == pack_groups()
    defaults = recipe_defaults(recipe)
    for group, rows in groups.items():
        assert [row["option"] for row in rows] == group_options(group), group
        marked = [row["option"] for row in rows if row["mark"] == "*"]
        assert marked == ([defaults[group]] if defaults.get(group) else []), group
        cpu = [row["option"] for row in rows if row["cpu"]]
        assert cpu == ([EMBEDDED_DEFAULTS[group]] if group in EMBEDDED_DEFAULTS else []), group
        for row in rows:
            path = conf_dir() / group / f"{row['option']}.yaml"
            assert_first_sentence(row["line"], file_header(path), f"{group}/{row['option']}.yaml")


@pytest.mark.parametrize("recipe", RECIPES)
def test_help_lists_the_actions_with_the_default_marked(helps, recipe):
    proc = helps[recipe, "--help"]
    name, _, first = proc.stdout.splitlines()[0].partition(": ")
    assert name == recipe
    assert_first_sentence(first, file_header(conf_dir() / f"{recipe}.yaml"), f"{recipe}.yaml")
    rows = [re.match(r"^  ([* ]) action=(\w+) +\S", line) for line in sections(proc.stdout)["actions"]]
    assert all(rows), sections(proc.stdout)["actions"]
    assert [row[2] for row in rows] == list(ACTIONS)
    base = yaml.safe_load((conf_dir() / "_base.yaml").read_text())
    assert [row[2] for row in rows if row[1] == "*"] == [base["action"]]


@pytest.mark.parametrize("recipe", RECIPES)
def test_help_points_to_the_full_config_and_hydras_help(helps, recipe):
    more = "\n".join(sections(helps[recipe, "--help"].stdout)["more"])
    assert f"python -m recipes.{recipe} --cfg job" in more
    assert f"python -m recipes.{recipe} --hydra-help" in more
    assert f"python -m recipes.{recipe} --help models | experiments" in more


def examples(stdout: str, recipe: str) -> list[list[str]]:
    """The help's example commands as argument lists after ``python -m recipes.<recipe>``."""
    commands = []
    for line in sections(stdout)["examples"]:
        words = shlex.split(line.split("    # ")[0])
        assert words[:3] == ["python", "-m", f"recipes.{recipe}"], line
        commands.append(words[3:])
    return commands


def as_validation(args: list[str]) -> list[str]:
    return [arg for arg in args if not arg.startswith("action=")] + ["action=validate"]


@pytest.mark.parametrize("index", range(5))
@pytest.mark.parametrize("recipe", RECIPES)
def test_each_example_command_validates(helps, recipe, index, tmp_path, recipe_main):
    commands = examples(helps[recipe, "--help"].stdout, recipe)
    assert len(commands) == 5
    args = as_validation(commands[index])
    proc = recipe_main(recipe, *args, cwd=tmp_path, timeout=300)
    assert proc.returncode == 0, f"{shlex.join(args)}:\n{proc.stderr[-3000:]}"
    jobs = math.prod(len(arg.split("=", 1)[1].split(",")) for arg in args if "=" in arg) if "-m" in args else 1
    assert proc.stdout.count("config OK:") == jobs, proc.stdout
    assert len(list(tmp_path.glob("runs/**/resolved_config.yaml"))) == jobs


@pytest.mark.parametrize(("topic", "group"), [("models", "model"), ("experiments", "experiment"), ("nccl", "nccl")])
def test_help_topic_lists_one_group_with_whole_headers(topic, group, tmp_path, recipe_main):
    proc = recipe_main("grpo", "--help", topic, cwd=tmp_path, timeout=120)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[0].split(":")[0].split(" ")[0] == group
    rows = [OPTION_LINE.match(line) for line in lines[1:]]
    assert all(rows), lines
    assert [row["option"] for row in rows] == group_options(group)
    for row in rows:
        assert row["line"] == file_header(conf_dir() / group / f"{row['option']}.yaml"), row["option"]
    default = recipe_defaults("grpo").get(group)
    assert [row["option"] for row in rows if row["mark"] == "*"] == ([default] if default else [])
    assert not (tmp_path / "runs").exists()  # help starts no run


def test_help_unknown_topic_is_one_error_line(tmp_path, recipe_main):
    proc = recipe_main("grpo", "--help", "modles", cwd=tmp_path, timeout=120)
    assert proc.returncode == 2
    assert proc.stdout == ""
    assert len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    assert "--help" in proc.stderr and "'modles'" in proc.stderr and "models" in proc.stderr
    assert "Traceback" not in proc.stderr


def console_script(name: str) -> str:
    path = shutil.which(name)
    assert path, f"{name} is not installed: pip install --no-deps -e . (pyproject.toml [project.scripts])"
    return path


@pytest.mark.parametrize(("script", "recipe"), [("klppo-grpo", "grpo"), ("klppo-kl-ppo", "kl_ppo")])
def test_console_script_runs_the_recipe(script, recipe, tmp_path):
    console_script(script)
    proc = subprocess.run([script, "--help"], cwd=tmp_path, env=checkout_env(), capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines()[0].startswith(f"{recipe}: ")
    assert f"usage: {script} " in proc.stdout
    assert sections(proc.stdout)["examples"][0].split()[0] == script


def test_bash_accepts_the_completion_script_and_it_completes(tmp_path):
    console_script("klppo-grpo")
    bash = shutil.which("bash")
    assert bash
    script = ('eval "$(klppo-grpo -sc install=bash)" || exit 3\n'
              'complete -p klppo-grpo || exit 4\n'
              'COMP_LINE="klppo-grpo parallel=tp8"; COMP_POINT=${#COMP_LINE}\n'
              'COMP_WORDS=(klppo-grpo parallel=tp8); COMP_CWORD=1\n'
              'hydra_bash_completion\n'
              'printf "reply:%s\\n" "${COMPREPLY[@]}"\n')
    proc = subprocess.run([bash, "-c", script], cwd=tmp_path, env=checkout_env(), capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert "-F hydra_bash_completion klppo-grpo" in proc.stdout
    replies = {line[len("reply:"):] for line in proc.stdout.splitlines() if line.startswith("reply:")}
    assert replies == {f"parallel={option}" for option in group_options("parallel") if option.startswith("tp8")}
    assert proc.stderr == ""  # nothing lands in the user's prompt while completing


def test_hydra_help_still_answers(tmp_path, recipe_main):
    # Hydra composes its own help without the recipe: the embedded CPU default's group overrides must not reach it
    proc = recipe_main("grpo", "--hydra-help", "parallel=tp4", cwd=tmp_path, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.startswith("Hydra (")
    assert "--shell-completion" in proc.stdout


@pytest.mark.parametrize(("recipe", "args"), [("grpo", ()), ("kl_ppo", ("kl=adaptive", "kl.target=0.2"))])
def test_help_kl_ends_with_the_numbers_the_command_line_runs_with(recipe, args, tmp_path, recipe_main):
    """The numbers are the composed config's (the embedded tiny task's on this GPU-less machine), not kl/'s own."""
    from omegaconf import OmegaConf

    from recipes.compose.compose import compose_recipe

    proc = recipe_main(recipe, "--help", "kl", *args, cwd=tmp_path, timeout=120)
    assert proc.returncode == 0, proc.stderr
    chosen = {arg.split("=", 1)[0] for arg in args}
    embedded = [f"{group}={option}" for group, option in EMBEDDED_DEFAULTS.items() if group not in chosen]
    cfg = compose_recipe(recipe, [*args, *embedded])
    tail = proc.stdout.split("\n\n", 1)[1]
    assert tail.startswith(f"with this command line (no GPU here: the embedded CPU default): kl={cfg.kl.mode}")
    if cfg.kl.mode == "ramp":
        assert f"  target {cfg.kl.ramp.start:g} -> {cfg.kl.ramp.end:g} over {cfg.kl.ramp.steps} steps" in tail
    else:
        assert f"  target {cfg.kl.target:g}\n" in tail and cfg.kl.target == 0.2
    assert f"loss-side coefficient {cfg.actor_rollout_ref.actor.kl_loss_coef:g} at step 0" in tail
    assert f"in-reward coefficient {cfg.algorithm.kl_ctrl.kl_coef:g} at step 0" in tail
    used = "algorithm.use_kl_in_reward" if recipe == "kl_ppo" else "actor_rollout_ref.actor.use_kl_loss"
    assert f"(used: {used}=true)" in tail
    c = OmegaConf.to_container(cfg.kl.controller)
    assert f"rule pi: kp {c['kp']:g}, ki {c['ki']:g}, max_step {c['max_step']:g}, lookahead {c['lookahead']:g}" in tail
    assert cfg.actor_rollout_ref.actor.kl_loss_coef != 0.001  # the tiny task's, not kl/fixed's header number
    assert not (tmp_path / "runs").exists()
