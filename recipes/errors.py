"""One error type for everything a user can get wrong in a config, printed as one line per problem."""

from __future__ import annotations

import sys


class ConfigError(Exception):
    """Every problem found in a config; each names its full key and shows the arithmetic."""

    def __init__(self, problems: list[str] | str):
        self.problems = [problems] if isinstance(problems, str) else list(problems)
        super().__init__("\n".join(self.problems))


def exit_with(error: ConfigError, code: int = 2) -> None:
    """Print the problems (one line each) to stderr and leave with `code`: no traceback, nothing started."""
    report(error)
    sys.exit(code)


def report(error: ConfigError) -> None:
    """Print the problems to stderr: one line, or a count and one line each."""
    count = len(error.problems)
    head = "config error" if count == 1 else f"{count} config errors"
    if count == 1:
        print(f"{head}: {error.problems[0]}", file=sys.stderr)
    else:
        print(f"{head}:", file=sys.stderr)
        for problem in error.problems:
            print(f"  - {problem}", file=sys.stderr)
    sys.stderr.flush()
