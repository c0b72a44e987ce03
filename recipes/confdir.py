"""Where the conf/ tree is: beside the packages in a checkout or editable install, inside recipes/ in a wheel."""

from __future__ import annotations

from pathlib import Path


def conf_dir() -> Path:
    here = Path(__file__).resolve().parent
    for candidate in (here.parent / "conf", here / "conf"):
        if (candidate / "grpo.yaml").is_file():
            return candidate
    raise FileNotFoundError(f"the pack's conf/ tree is missing: looked in {here.parent / 'conf'} and {here / 'conf'}")


def group_options(group: str) -> list[str]:
    """The options of a config group of the pack, e.g. group_options('parallel') -> ['cpu', 'tp1', ...]."""
    folder = conf_dir() / group
    return sorted(p.stem for p in folder.glob("*.yaml"))


def pack_groups() -> list[str]:
    return sorted(p.name for p in conf_dir().iterdir() if p.is_dir() and not p.name.startswith("_"))
