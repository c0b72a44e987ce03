"""Command-line overrides as Hydra reads them: ``[+|~|++]key=value``, and Hydra's own flags (``-m``, ``--cfg``).

The launcher splits the command line once, into a :class:`CommandLine`: each override's key, value and whether it
deletes, beside Hydra's flags, in the order typed. The adopt and refuse rules (recipes/compose/compose.py), the
embedded default (recipes/compose/defaults.py) and the launcher read that object; none splits the strings again.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass


def override_key(arg: str) -> str | None:
    """The dotted key of an override (``+a.b=1`` -> ``a.b``); None for a flag or a bare word."""
    if arg.startswith("-") or "=" not in arg:
        return None
    return arg.split("=", 1)[0].lstrip("+~")


def override_value(arg: str) -> str:
    """The text after the first ``=`` of an override."""
    return arg.split("=", 1)[1] if "=" in arg else ""


@dataclass(frozen=True, slots=True)
class Override:
    """One ``[+|++|~]key=value`` of the command line."""

    text: str
    """as typed"""
    key: str
    """the dotted key, its ``+``/``~`` prefix stripped: ``a.b`` of ``++a.b=1``; a group's name for ``group=option``"""
    value: str
    """the text after the first ``=``, as typed (not stripped)"""

    @property
    def deletes(self) -> bool:
        """``~key`` / ``~key=value``: Hydra deletes the key."""
        return self.text.startswith("~")


@dataclass(frozen=True, slots=True)
class CommandLine:
    """A recipe's command line, split once: each argument as typed, with its override (key, value, deletion), or
    None for Hydra's flags and their words (``-m``, ``--cfg``, ``job``)."""

    items: tuple[tuple[str, Override | None], ...]

    @classmethod
    def parse(cls, argv: Iterable[str] | CommandLine) -> CommandLine:
        """``argv`` split once (a CommandLine is returned as it is)."""
        if isinstance(argv, CommandLine):
            return argv
        return cls(tuple((arg, None if (key := override_key(arg)) is None else Override(arg, key, override_value(arg)))
                         for arg in argv))

    @property
    def args(self) -> tuple[str, ...]:
        """The arguments as typed, flags included."""
        return tuple(arg for arg, _ in self.items)

    @property
    def overrides(self) -> tuple[Override, ...]:
        """The overrides, in the order typed."""
        return tuple(override for _, override in self.items if override is not None)

    def keys(self) -> set[str]:
        """Every key the command line sets or deletes."""
        return {o.key for o in self.overrides}

    def typed(self, key: str) -> list[Override]:
        """The overrides of ``key``, deletions included, in the order typed."""
        return [o for o in self.overrides if o.key == key]

    def last(self, key: str) -> str | None:
        """The last value typed for ``key`` (stripped, lower case; a deletion's value too), None when not typed."""
        values = self.typed(key)
        return values[-1].value.strip().lower() if values else None

    @property
    def has_hydra_flags(self) -> bool:
        """True when Hydra itself must read the command line (``-m``, ``--cfg job``, ``--help``, ``-sc ...``)."""
        return any(arg.startswith("-") for arg in self.args)

    def without(self, dropped: Iterable[str]) -> CommandLine:
        """The command line less every argument typed as one of ``dropped``."""
        drop = set(dropped)
        return CommandLine(tuple(item for item in self.items if item[0] not in drop))

    def plus(self, added: Iterable[str]) -> CommandLine:
        """The command line with ``added`` at its end."""
        return CommandLine(self.items + CommandLine.parse(added).items)

    def __contains__(self, arg: object) -> bool:
        return arg in self.args

    def __iter__(self):
        return iter(self.args)

    def __len__(self) -> int:
        return len(self.items)


def chosen_keys(argv: Iterable[str] | CommandLine) -> set[str]:
    """Every key the command line sets or deletes."""
    return CommandLine.parse(argv).keys()


def with_overrides(argv: Iterable[str] | CommandLine, added: list[str]) -> list[str]:
    """``argv`` with ``added`` just before its first override (not a flag): Hydra's parser takes the overrides as one
    run of positional arguments, so ``strategy=fsdp --cfg job`` plus the embedded defaults appended after ``job`` was
    "unrecognized arguments"."""
    command = CommandLine.parse(argv)
    first = next((i for i, (_, override) in enumerate(command.items) if override is not None), len(command.items))
    args = list(command.args)
    return args[:first] + added + args[first:]
