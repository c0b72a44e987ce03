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


def with_overrides(argv: list[str], added: list[str]) -> list[str]:
    """``argv`` with ``added`` just before its first override (not a flag): Hydra's parser takes the overrides as one
    run of positional arguments, so ``strategy=fsdp --cfg job`` plus the embedded defaults appended after ``job`` was
    "unrecognized arguments"."""
    first = next((i for i, arg in enumerate(argv) if override_key(arg) is not None), len(argv))
    return argv[:first] + added + argv[first:]
