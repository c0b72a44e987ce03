"""Sample outputs of the README and the docs/ pages that tests regenerate: a fenced block between two HTML comments,
the command first.

A test passes what the command printed; :func:`check_block` compares it with the page's block line by line,
numbers, times and run-folder stamps masked and column padding collapsed (``KLPPO_UPDATE_README=1`` writes this
output into the page instead; refused, the test failing, where ``CI=true``: CI never passes by rewriting).
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable
from pathlib import Path

import pytest

README = Path(__file__).resolve().parents[1] / "README.md"
DOCS = README.parent / "docs"
_NUMBER = re.compile(r"[-+]?\d+(\.\d+)?(e[-+]?\d+)?")
_HEADER = ("```", "...")


def shape(line: str) -> str:
    """A line with its numbers masked and its column padding collapsed."""
    return re.sub(r"\s+", " ", _NUMBER.sub("N", line)).strip()


def check_block(start: str, end: str, header: list[str], lines: list[str],
                ignored: Callable[[str], bool] = lambda line: False, page: str | None = None) -> None:
    """The README's block (or, with ``page``, the block of ``docs/<page>``) between ``start`` and ``end`` shows
    ``lines`` (``header``: the ``$ command`` line and any ``...`` written above them); lines for which ``ignored`` is
    true are not compared (run-to-run variation)."""
    path = README if page is None else DOCS / page
    head, rest = path.read_text().split(start, 1)
    shown, tail = rest.split(end, 1)
    if _update_requested():
        path.write_text(f"{head}{start}\n```\n" + "\n".join([*header, *lines]) + f"\n```\n{end}{tail}")
        return
    readme_lines = [line for line in shown.strip().splitlines()
                    if line.strip() not in _HEADER and not line.startswith("$ ")]
    assert [shape(x) for x in readme_lines if not ignored(x)] == [shape(x) for x in lines if not ignored(x)], (
        f"{path.name}'s block after {start} differs from what the command prints; rerun with KLPPO_UPDATE_README=1")


def _update_requested() -> bool:
    """Whether ``KLPPO_UPDATE_README=1`` asks to rewrite the README; under ``CI=true`` that fails the test instead."""
    if os.environ.get("KLPPO_UPDATE_README") != "1":
        return False
    if os.environ.get("CI", "").lower() == "true":
        pytest.fail("KLPPO_UPDATE_README=1 rewrites the README's sample output; refused under CI=true (a CI run must "
                    "compare the README with what the command prints, not rewrite it)")
    return True
