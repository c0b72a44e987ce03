"""``python -m recipes.<recipe> --help``: what the recipe does, its actions, every config group of the pack with its
options (one line each, from each option file's header comment), example commands, and where to look further.

Pure and fast: it reads conf/ with plain file reads and PyYAML (no Hydra compose, no OmegaConf, no verl, no torch),
and ``run_recipe`` (recipes/launch.py) asks it first: ``--help`` answers before torch is imported (the GPU probe) and
without composing anything.

The header comment of a conf file is its leading comment block: the lines before the first line that is not a comment,
less Hydra's ``# @package`` directive. Its *description* is the first paragraph of that block (ended by a blank
comment line or an example command, ``python ...``; a command before it is skipped), joined into one line; an
option's *summary*, its line in ``--help``, is the description's first sentence. ``--help <group>`` (``--help models``,
``--help experiments``) lists one group with each option's whole description.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

import yaml

from recipes.compose.confdir import conf_dir, group_options, pack_groups, recipe_defaults
from recipes.errors import ConfigError

_Loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)

HELP_FLAGS = ("--help", "-h")

# the console scripts of pyproject.toml's [project.scripts]: the same entry as python -m recipes.<recipe>
SCRIPTS = {"grpo": "klppo-grpo", "kl_ppo": "klppo-kl-ppo"}

ACTIONS = {
    "validate": "check the whole run in the driver (layouts, batches, model, memory, verl's validator) and write its "
                "record (resolved_config.yaml); no GPU, no Ray",
    "plan": "validate, then plan the layouts: micro-DP groups, bytes each GPU receives at each switch, memory per GPU",
    "train": "validate, write the record, then run verl's trainer (in this process's Ray, or a Ray Job with "
             "launcher=ray)",
}

# plural spellings of `--help <group>`
TOPICS = {"models": "model", "experiments": "experiment"}

_SENTENCE_END = re.compile(r"\.(?=\s+\D|$)")
_ABBREVIATIONS = ("e.g", "i.e", "cf", "vs", "etc")


def header_lines(path: Path) -> list[str]:
    """The leading comment block of a conf file, ``#`` and one space taken off each line, ``# @package`` left out."""
    lines: list[str] = []
    with open(path, encoding="utf-8") as handle:
        for raw in handle:
            text = raw.strip()
            if not text.startswith("#"):
                break
            text = text[1:]
            text = text[1:] if text.startswith(" ") else text
            if text.strip().startswith("@package"):
                continue
            lines.append(text.rstrip())
    return lines


def _is_command(line: str) -> bool:
    return line.strip().startswith("python ")


def description(path: Path) -> str:
    """The first paragraph of the header comment, example commands left out, as one line ('' when there is none)."""
    words: list[str] = []
    for line in header_lines(path):
        if _is_command(line):
            if words:
                break
            continue
        if not line.strip():
            if words:
                break
            continue
        words.append(line.strip())
    return " ".join(words)


def first_sentence(text: str) -> str:
    """Up to and including the first full stop that ends a sentence: outside parentheses, followed by the end of the
    text or by a space (``e.g. x``, ``2505.22617`` and ``(... . ...)`` do not end one)."""
    depth = 0
    for index, char in enumerate(text):
        if char in "([":
            depth += 1
        elif char in ")]":
            depth = max(depth - 1, 0)
        elif char == "." and depth == 0 and _SENTENCE_END.match(text, index) and not _abbreviated(text, index):
            return text[: index + 1]
    return text


def _abbreviated(text: str, index: int) -> bool:
    word = text[:index].rsplit(" ", 1)[-1].lstrip("(").lower()
    return word in _ABBREVIATIONS


def summary(path: Path) -> str:
    """An option's one line in ``--help``: the first sentence of its header comment."""
    return first_sentence(description(path))


def examples(recipe: str, prog: str) -> list[tuple[str, str]]:
    """(command, what it does) for each example command of the recipe's primary config header
    (``#   python -m recipes.<recipe> ...  # comment``), shown with ``prog`` as the command that starts it."""
    found = []
    start = f"python -m recipes.{recipe}"
    for line in header_lines(conf_dir() / f"{recipe}.yaml"):
        text = line.strip()
        if not text.startswith(start):
            continue
        command, _, comment = text.partition(" # ")
        found.append((prog + command.strip()[len(start):], comment.strip()))
    return found


def group_descriptions() -> dict[str, str]:
    """group -> the comment above its line in conf/_groups.yaml, up to its list of options (``training backend``)."""
    found: dict[str, str] = {}
    pending: list[str] = []
    with open(conf_dir() / "_groups.yaml", encoding="utf-8") as handle:
        for raw in handle:
            text = raw.strip()
            if text.startswith("#"):
                pending.append(text.lstrip("#").strip())
                continue
            match = re.match(r"-\s*([A-Za-z_]\w*)\s*:", text)
            if match and pending:
                found[match.group(1)] = _topic(" ".join(pending))
            pending = []
    return found


def _topic(comment: str) -> str:
    """``training backend: fsdp | fsdp2 ...`` -> ``training backend``: the comment before its list of options (its
    first colon outside parentheses) or its first aside outside them (``, e.g.``, ``, after ...``)."""
    depth = 0
    for index, char in enumerate(comment):
        if char == "(":
            depth += 1
        elif char == ")":
            depth = max(depth - 1, 0)
        elif depth == 0 and (char == ":" or comment.startswith((", e.g.", ", after "), index)):
            return comment[:index].strip()
    return comment.strip()


def default_action() -> str | None:
    with open(conf_dir() / "_base.yaml", encoding="utf-8") as handle:
        loaded = yaml.load(handle, Loader=_Loader) or {}
    return loaded.get("action")


def _option_rows(group: str, default: str | None, embedded: dict[str, str], whole: bool) -> list[str]:
    options = group_options(group)
    width = max((len(option) for option in options), default=0)
    rows = []
    for option in options:
        path = conf_dir() / group / f"{option}.yaml"
        mark = "*" if option == default else " "
        cpu = " [no GPU]" if embedded.get(group) == option else ""
        line = description(path) if whole else summary(path)
        rows.append(f"    {mark} {option:<{width}}  {line}{cpu}")
    return rows


def render(recipe: str, prog: str, embedded: dict[str, str] | None = None) -> str:
    """The whole ``--help`` text of one recipe. ``embedded``: group -> option of the embedded CPU default."""
    embedded = embedded or {}
    defaults = recipe_defaults(recipe)
    topics = group_descriptions()
    head = description(conf_dir() / f"{recipe}.yaml")
    out = [f"{recipe}: {first_sentence(head)}", "",
           f"usage: {prog} [group=option ...] [verl.key=value ...] [action={'|'.join(ACTIONS)}]", "",
           "actions:"]
    chosen = default_action()
    for action, line in ACTIONS.items():
        mark = "*" if action == chosen else " "
        out.append(f"  {mark} action={action:<9} {line}")
    out += ["", "config groups (group=option; * = the default; [no GPU] = the embedded CPU default, used on a machine "
                "without a GPU when the command line chooses no parallel=, cluster= or experiment=):"]
    for group in pack_groups():
        default = defaults.get(group)
        topic = topics.get(group, "")
        suffix = " (none by default)" if group in defaults and default is None else ""
        out.append(f"  {group}" + (f": {topic}" if topic else "") + suffix)
        out += _option_rows(group, default, embedded, whole=False)
    out += ["", "examples:"]
    for command, comment in examples(recipe, prog):
        out.append(f"  {command}" + (f"    # {comment}" if comment else ""))
    out += ["", "more:",
            f"  {prog} --help models | experiments | <group>   one group, each option's whole description",
            f"  {prog} --cfg job [group=option ...]   the full composed config (every verl key, as verl gets it)",
            f"  {prog} --hydra-help   Hydra's own help (flags, multirun -m, shell completion -sc)",
            "  Every verl key keeps its dotted name: actor_rollout_ref.actor.optim.lr=5e-7."]
    return "\n".join(out) + "\n"


def render_group(recipe: str, topic: str, embedded: dict[str, str] | None = None) -> str:
    """``--help <group>``: one group's options with their whole descriptions (models: also the weights' path)."""
    group = TOPICS.get(topic, topic)
    if group not in pack_groups():
        raise KeyError(topic)
    defaults = recipe_defaults(recipe)
    default = defaults.get(group)
    head = group_descriptions().get(group, "")
    none = group in defaults and default is None
    out = [f"{group}" + (f": {head}" if head else "") + (" (none by default)" if none else "")]
    out += _option_rows(group, default, embedded or {}, whole=True)
    return "\n".join(out) + "\n"


def help_topic(argv: list[str]) -> tuple[bool, str | None]:
    """(asked for help, the topic after the flag or None): ``--help``, ``-h``, ``--help models``, ``--help=models``."""
    for index, arg in enumerate(argv):
        if arg in HELP_FLAGS:
            following = argv[index + 1] if index + 1 < len(argv) else None
            if following is not None and not following.startswith("-") and "=" not in following:
                return True, following
            return True, None
        if arg.startswith("--help="):
            return True, arg.split("=", 1)[1]
    return False, None


def without_help(argv: list[str]) -> list[str]:
    """``argv`` less the help flag and its topic (as ``help_topic`` reads them): the run's own overrides."""
    rest, index = [], 0
    while index < len(argv):
        arg = argv[index]
        index += 1
        if arg in HELP_FLAGS:
            following = argv[index] if index < len(argv) else None
            if following is not None and not following.startswith("-") and "=" not in following:
                index += 1
        elif not arg.startswith("--help="):
            rest.append(arg)
    return rest


def topics_list() -> str:
    return ", ".join([*TOPICS, *pack_groups()])


def print_help(recipe: str, prog: str, argv: list[str], embedded: dict[str, str] | None = None) -> int:
    """Print the help ``argv`` asks for to stdout; 0, or 2 with one error line on stderr for an unknown topic."""
    _, topic = help_topic(argv)
    if topic is None:
        sys.stdout.write(render(recipe, prog, embedded))
        return 0
    try:
        sys.stdout.write(render_group(recipe, topic, embedded))
    except KeyError:
        print(f"--help: unknown topic {topic!r}; choose from {topics_list()}", file=sys.stderr)
        return 2
    if TOPICS.get(topic, topic) == "kl":
        from recipes.cli.help_values import kl_lines  # lazy: composes the config (Hydra), for this topic only

        try:
            sys.stdout.write("\n" + "\n".join(kl_lines(recipe, without_help(argv))) + "\n")
        except ConfigError as error:
            print(f"--help kl: the command line does not compose: {error}", file=sys.stderr)
            return 2
    return 0
