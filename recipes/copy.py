"""Copy a recipe into a team repository: ``python -m recipes.copy kl_ppo DEST [--only-used] [group=option ...]``.

DEST gets ``kl_ppo.py`` (the entry point), ``conf/kl_ppo.yaml`` (the primary config) and ``conf/<group>/*.yaml``: every
option of every group (so ``kl=adaptive`` keeps working there), or with ``--only-used`` just the options the primary
config and the embedded CPU default choose. ``group=option`` arguments become the copy's defaults (its defaults list
is rewritten in place, comments kept). The copy needs the pack installed (``pip install klppo-recipes``) and nothing
else: ``python DEST/kl_ppo.py action=validate`` composes and validates from DEST's own conf/, and edits there win.
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import sys
from datetime import datetime, timezone
from importlib import metadata
from pathlib import Path

from omegaconf import OmegaConf

from recipes.compose import RECIPES
from recipes.confdir import CONF_DIR_ENV, conf_dir, group_options, pack_groups
from recipes.defaults import EMBEDDED_DEFAULTS
from recipes.gitstate import git_state

MARKER = ".klppo-copy.json"
# groups whose options refer to other groups' options (override /parallel: ...): copied whole or not at all
_COMPOUND = ("experiment",)

ENTRY_POINT = '''"""{title}: a copy of klppo-recipes' `{recipe}` recipe ({origin}).

    python {recipe}.py [group=option ...] [verl.key=value ...] [action=validate|plan|train]
    python {recipe}.py -m kl=fixed,adaptive action=validate

Runs the pack's launch flow (compose, validate, plan, train with verl) on the config tree beside this file: edit
conf/{recipe}.yaml and conf/<group>/<option>.yaml here. Needs the pack installed: pip install klppo-recipes.
"""

import os
from pathlib import Path

os.environ["{env}"] = str(Path(__file__).resolve().parent / "conf")

from recipes.launch import run_recipe  # noqa: E402

if __name__ == "__main__":
    run_recipe("{recipe}")
'''


def _defaults(primary: Path) -> dict[str, str | None]:
    """group -> option of the primary config's defaults list (verl's own entries and _self_ left out)."""
    raw = OmegaConf.to_container(OmegaConf.load(primary)).get("defaults", [])
    chosen = {}
    for entry in raw:
        if isinstance(entry, dict):
            for group, option in entry.items():
                chosen[str(group)] = None if option is None else str(option)
    return chosen


def _rewrite_defaults(text: str, choices: dict[str, str]) -> str:
    """The primary config's text with `- group: option` lines of the defaults list replaced (comments stay)."""
    for group, option in choices.items():
        value = f'"{option}"' if option in ("off", "on", "yes", "no", "null", "true", "false") else option
        pattern = re.compile(rf"^(\s*-\s*){re.escape(group)}:\s*\S.*$", re.MULTILINE)
        text, count = pattern.subn(lambda m, g=group, v=value: f"{m.group(1)}{g}: {v}", text, count=1)
        if not count:
            raise ValueError(f"{group}: not in the primary config's defaults list")
    return text


def _source_origin() -> tuple[str, str | None]:
    try:
        version = metadata.version("klppo-recipes")
    except metadata.PackageNotFoundError:
        version = "unknown"
    state = git_state(Path(__file__).resolve().parent)
    return version, (state or {}).get("sha")


def copy_recipe(recipe: str, dest: str | Path, *, only_used: bool = False, choices: dict[str, str] | None = None,
                force: bool = False) -> Path:
    """Write the self-contained copy of `recipe` into `dest`; return the entry point's path."""
    if recipe not in RECIPES:
        raise ValueError(f"recipe: unknown recipe {recipe!r}; choose from {', '.join(RECIPES)}")
    source = conf_dir()
    dest = Path(dest).resolve()
    choices = dict(choices or {})
    groups = pack_groups()
    for group, option in choices.items():
        if group not in groups:
            raise ValueError(f"{group}={option}: not a group of the pack; choose from {', '.join(groups)}")
        if option not in group_options(group):
            raise ValueError(f"{group}={option}: no such option; choose from {', '.join(group_options(group))}")
    target_conf = dest / "conf"
    if target_conf.exists() and any(target_conf.iterdir()) and not force:
        raise FileExistsError(f"{target_conf} exists and is not empty (pass --force to overwrite)")
    target_conf.mkdir(parents=True, exist_ok=True)

    primary_text = _rewrite_defaults((source / f"{recipe}.yaml").read_text(), choices)
    (target_conf / f"{recipe}.yaml").write_text(primary_text)
    used = {g: o for g, o in _defaults(target_conf / f"{recipe}.yaml").items() if o is not None}
    used.update(choices)
    copied: dict[str, list[str]] = {}
    for group in groups:
        if only_used:
            wanted = {used.get(group), EMBEDDED_DEFAULTS.get(group)} - {None}
            if group == "launcher":
                wanted = set(group_options(group))  # both ways to launch stay available
            if group in _COMPOUND and group not in choices:
                wanted = set()
        else:
            wanted = set(group_options(group))
        if not wanted:
            continue
        (target_conf / group).mkdir(exist_ok=True)
        for option in sorted(wanted):
            shutil.copy2(source / group / f"{option}.yaml", target_conf / group / f"{option}.yaml")
        copied[group] = sorted(wanted)
    for extra in ("__init__.py",):
        if (source / extra).is_file():
            shutil.copy2(source / extra, target_conf / extra)

    version, sha = _source_origin()
    origin = f"klppo-recipes {version}" + (f", git {sha[:12]}" if sha else "")
    title = {"grpo": "GRPO on verl", "kl_ppo": "KL-PPO on verl"}.get(recipe, recipe)
    entry = dest / f"{recipe}.py"
    entry.write_text(ENTRY_POINT.format(title=title, recipe=recipe, origin=origin, env=CONF_DIR_ENV))
    (dest / MARKER).write_text(json.dumps({
        "recipe": recipe, "pack_version": version, "pack_git_sha": sha,
        "copied": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "only_used": only_used, "choices": choices, "groups": copied,
    }, indent=2) + "\n")
    return entry


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m recipes.copy",
        description="Write a self-contained copy of a recipe (entry point, primary config, group options) into DEST.",
    )
    parser.add_argument("recipe", help="grpo or kl_ppo")
    parser.add_argument("dest", help="the folder to write (e.g. a team repository's rl/ folder)")
    parser.add_argument("choices", nargs="*", metavar="group=option",
                        help="defaults for the copy, e.g. parallel=tp8 strategy=megatron nccl=ib")
    parser.add_argument("--only-used", action="store_true",
                        help="copy only the options the recipe uses (and the embedded CPU default's), not every option")
    parser.add_argument("--force", action="store_true", help="overwrite files in an existing DEST/conf")
    args = parser.parse_intermixed_args(argv)
    choices = {}
    for item in args.choices:
        group, sep, option = item.partition("=")
        if not sep or "." in group or group.startswith(("+", "~")):
            print(f"copy: {item!r}: give group=option pairs (set other keys in the copy's conf/{args.recipe}.yaml)",
                  file=sys.stderr)
            return 2
        choices[group] = option
    try:
        entry = copy_recipe(args.recipe, args.dest, only_used=args.only_used, choices=choices, force=args.force)
    except (ValueError, FileExistsError) as error:
        print(f"copy: {error}", file=sys.stderr)
        return 2
    print(f"copied {args.recipe} to {entry.parent}: run it with  python {entry} action=validate")
    return 0


if __name__ == "__main__":
    sys.exit(main())
