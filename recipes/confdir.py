"""Where the conf/ tree is: beside the packages in a checkout or editable install, inside recipes/ in a wheel,
or a copied recipe's own conf/ ($KLPPO_CONF_DIR, set by its entry point)."""

from __future__ import annotations

import os
from pathlib import Path

# a copied recipe (python -m recipes.copy) points this at its own conf/ folder
CONF_DIR_ENV = "KLPPO_CONF_DIR"


def conf_dir() -> Path:
    override = os.environ.get(CONF_DIR_ENV)
    if override:
        path = Path(override).expanduser().resolve()
        if not path.is_dir():
            raise FileNotFoundError(f"{CONF_DIR_ENV}={override}: no such folder")
        return path
    here = Path(__file__).resolve().parent
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


def group_options(group: str) -> list[str]:
    """The options of a config group of the pack, e.g. group_options('parallel') -> ['cpu', 'tp1', ...]."""
    folder = conf_dir() / group
    return sorted(p.stem for p in folder.glob("*.yaml"))


def pack_groups() -> list[str]:
    return sorted(p.name for p in conf_dir().iterdir() if p.is_dir() and not p.name.startswith("_"))
