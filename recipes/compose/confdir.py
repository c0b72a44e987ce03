"""Where the conf/ tree is: beside the packages in a checkout or editable install, inside recipes/ in a wheel,
or a copied recipe's own conf/ ($KLPPO_CONF_DIR, set by its entry point); and what is in it: the groups, their
options (names starting with `_` are shared parts, not options), the files a config includes, a recipe's defaults."""

from __future__ import annotations

import os
from pathlib import Path

import yaml

from recipes.envvars import CONF_DIR

_Loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)

# a copied recipe (python -m recipes.copy) points this at its own conf/ folder
CONF_DIR_ENV = CONF_DIR


def conf_dir() -> Path:
    override = os.environ.get(CONF_DIR_ENV)
    if override:
        path = Path(override).expanduser().resolve()
        if not path.is_dir():
            raise FileNotFoundError(f"{CONF_DIR_ENV}={override}: no such folder")
        return path
    here = Path(__file__).resolve().parents[1]  # the recipes package (this module is in recipes/compose/)
    for candidate in (here.parent / "conf", here / "conf"):
        if (candidate / "grpo.yaml").is_file():
            return candidate
    raise FileNotFoundError(f"the pack's conf/ tree is missing: looked in {here.parent / 'conf'} and {here / 'conf'}")


def entry_command(recipe: str, python: str = "python") -> list[str]:
    """How to start `recipe` here: ``python -m recipes.<recipe>``, or a copy's own entry point when one is in use."""
    if os.environ.get(CONF_DIR_ENV):
        script = conf_dir().parent / f"{recipe}.py"
        if script.is_file():
            try:
                shown = script.relative_to(Path.cwd())
            except ValueError:
                shown = script
            return [python, str(shown)]
    return [python, "-m", f"recipes.{recipe}"]


def _private(name: str) -> bool:
    """A name starting with `_` is a shared part (conf/_base.yaml, cluster/_node.yaml), not a group or an option."""
    return name.startswith("_")


def group_options(group: str) -> list[str]:
    """The options of a config group of the pack, e.g. group_options('parallel') -> ['cpu', 'tp1', ...]."""
    folder = conf_dir() / group
    return sorted(p.stem for p in folder.glob("*.yaml") if not _private(p.stem))


def pack_groups() -> list[str]:
    return sorted(p.name for p in conf_dir().iterdir() if p.is_dir() and not _private(p.name))


def shared_folders() -> list[Path]:
    """The folders of conf/ that options include by name and that are no group (conf/_schedule/)."""
    return sorted(p for p in conf_dir().iterdir() if p.is_dir() and _private(p.name) and p.name != "__pycache__")


def config_defaults(path: Path) -> list:
    """The raw defaults list of one config file (empty when it has none)."""
    loaded = yaml.load(path.read_text(), Loader=_Loader)  # plain YAML: a defaults list holds no interpolations
    return list((loaded or {}).get("defaults") or [])


def included_files(path: Path) -> list[Path]:
    """The files of the same folder that `path`'s defaults list includes by name (``- _base``, ``- fsdp2``),
    recursively, in defaults order; verl's configs (``- ppo_trainer``) and ``_self_`` are not files here."""
    found: list[Path] = []
    for entry in config_defaults(path):
        if isinstance(entry, str) and entry != "_self_":
            candidate = path.parent / f"{entry}.yaml"
            if candidate.is_file() and candidate not in found:
                found.extend(p for p in [*included_files(candidate), candidate] if p not in found)
    return found


def recipe_defaults(recipe: str, folder: Path | None = None) -> dict[str, str | None]:
    """group -> option of a recipe's defaults (the primary config and the files it includes, e.g. conf/_groups.yaml);
    verl's own entries and ``_self_`` left out. In defaults order."""
    folder = folder or conf_dir()
    chosen: dict[str, str | None] = {}
    for path in [*included_files(folder / f"{recipe}.yaml"), folder / f"{recipe}.yaml"]:
        for entry in config_defaults(path):
            if isinstance(entry, dict):
                for group, option in entry.items():
                    chosen[str(group)] = None if option is None else str(option)
    return chosen
