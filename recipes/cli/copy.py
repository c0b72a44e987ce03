"""Copy a recipe into a team repository: ``python -m recipes.copy kl_ppo DEST [--only-used] [group=option ...]``.

DEST gets ``kl_ppo.py`` (the entry point), ``conf/kl_ppo.yaml`` (the primary config) with the files it includes
(``conf/_base.yaml``, the shared values; ``conf/_groups.yaml``, the groups' defaults) and ``conf/<group>/*.yaml``: every
option of every group (so ``kl=adaptive`` keeps working there), or with ``--only-used`` just the options the recipe's
defaults and the embedded CPU default choose, with the files those include (``cluster/_node.yaml``, ``strategy/fsdp2``
under ``fsdp``). ``group=option`` arguments become the copy's defaults (the ``- group: option`` lines of its defaults
list, in ``conf/_groups.yaml``, are rewritten in place, comments kept). The copy needs the pack installed
(``pip install klppo-recipes``) and nothing else: ``python DEST/kl_ppo.py action=validate`` composes and validates from
DEST's own conf/, and edits there win.
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

from recipes.compose.compose import RECIPES
from recipes.compose.confdir import (
    CONF_DIR_ENV,
    conf_dir,
    group_options,
    included_files,
    pack_groups,
    recipe_defaults,
    shared_folders,
)
from recipes.compose.defaults import EMBEDDED_DEFAULTS
from recipes.record.gitstate import git_state

MARKER = ".klppo-copy.json"
# groups whose options refer to other groups' options (override /parallel: ...): copied whole or not at all
_COMPOUND = ("experiment",)

ENTRY_POINT = '''"""{title}: a copy of klppo-recipes' `{recipe}` recipe ({origin}).

    python {recipe}.py [group=option ...] [verl.key=value ...] [action=validate|plan|train]
    python {recipe}.py -m kl=fixed,adaptive action=validate

Runs the pack's launch flow (compose, validate, plan, train with verl) on the config tree beside this file: edit
conf/{recipe}.yaml, conf/_base.yaml (values under it), conf/_groups.yaml (the defaults) and conf/<group>/<option>.yaml
here. Needs the pack installed: pip install klppo-recipes.
"""

import os
from pathlib import Path

os.environ["{env}"] = str(Path(__file__).resolve().parent / "conf")

from recipes.launch import run_recipe  # noqa: E402

if __name__ == "__main__":
    run_recipe("{recipe}")
'''


def _rewrite_defaults(texts: dict[str, str], choices: dict[str, str]) -> dict[str, str]:
    """The texts of the primary config and the files it includes (name -> text), with the `- group: option` line of
    each chosen group replaced in the file whose defaults list holds it (comments stay)."""
    texts = dict(texts)
    for group, option in choices.items():
        value = f'"{option}"' if option in ("off", "on", "yes", "no", "null", "true", "false") else option
        pattern = re.compile(rf"^(\s*-\s*){re.escape(group)}:\s*\S.*$", re.MULTILINE)
        for name, text in texts.items():
            text, count = pattern.subn(lambda m, g=group, v=value: f"{m.group(1)}{g}: {v}", text, count=1)
            if count:
                texts[name] = text
                break
        else:
            raise ValueError(f"{group}: not in the primary config's defaults list")
    return texts


def _source_origin() -> tuple[str, str | None]:
    try:
        version = metadata.version("klppo-recipes")
    except metadata.PackageNotFoundError:
        version = "unknown"
    state = git_state(Path(__file__).resolve().parents[1])
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

    # the primary config and the files of conf/ it includes (_base, _groups), with the choices written in
    primary = source / f"{recipe}.yaml"
    top = [primary, *included_files(primary)]
    texts = _rewrite_defaults({path.name: path.read_text() for path in top}, choices)
    for name, text in texts.items():
        (target_conf / name).write_text(text)
    used = {g: o for g, o in recipe_defaults(recipe, target_conf).items() if o is not None}
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
        files = []
        for option in sorted(wanted):
            path = source / group / f"{option}.yaml"
            # with the files of the group that it includes (cluster/_node.yaml; strategy/fsdp2.yaml under fsdp)
            files.extend(p for p in [*included_files(path), path] if p not in files)
        for path in files:
            shutil.copy2(path, target_conf / group / path.name)
        copied[group] = sorted(p.stem for p in files if p.stem in group_options(group))
    for extra in ("__init__.py",):
        if (source / extra).is_file():
            shutil.copy2(source / extra, target_conf / extra)
    # shared folders the groups include by name (conf/_schedule/: a model's schedule in each engine's keys), whole
    for folder in shared_folders():
        shutil.copytree(folder, target_conf / folder.name, dirs_exist_ok=True,
                        ignore=shutil.ignore_patterns("__pycache__"))

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
