"""Command-line overrides as Hydra reads them: ``[+|~|++]key=value``, and Hydra's own flags (``-m``, ``--cfg``)."""

from __future__ import annotations


def override_key(arg: str) -> str | None:
    """The dotted key of an override (``+a.b=1`` -> ``a.b``); None for a flag or a bare word."""
    if arg.startswith("-") or "=" not in arg:
        return None
    return arg.split("=", 1)[0].lstrip("+~")


def override_value(arg: str) -> str:
    """The text after the first ``=`` of an override."""
    return arg.split("=", 1)[1] if "=" in arg else ""


def chosen_keys(argv: list[str]) -> set[str]:
    """Every key the command line sets or deletes."""
    return {key for key in map(override_key, argv) if key is not None}


def has_hydra_flags(argv: list[str]) -> bool:
    """True when Hydra itself must read the command line (``-m``, ``--cfg job``, ``--help``, ``-sc ...``)."""
    return any(arg.startswith("-") for arg in argv)
