"""The README is a front page: at most 300 lines, install, demo, porting and validation in its first 120, and every
page under docs/ reached from it (directly or through a page it links); every relative link of the README and the
docs/ pages names a file that exists and, with ``#anchor``, a heading of that file."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
LINK = re.compile(r"\]\(([^)\s]+)\)")


def _slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower().replace("`", ""))
    return text.replace(" ", "-")


def _anchors(page: Path) -> set[str]:
    text = re.sub(r"```.*?```", "", page.read_text(), flags=re.S)
    return {_slug(m[1]) for m in re.finditer(r"^#+ (.+)$", text, re.M)}


def _links(page: Path) -> list[tuple[Path, str]]:
    text = re.sub(r"```.*?```", "", page.read_text(), flags=re.S)
    out = []
    for target in LINK.findall(text):
        if re.match(r"[a-z]+://", target):
            continue
        path, _, anchor = target.partition("#")
        out.append(((page.parent / path).resolve() if path else page, anchor))
    return out


def test_the_readme_is_a_front_page():
    lines = (ROOT / "README.md").read_text().splitlines()
    assert len(lines) <= 300, len(lines)
    first_screen = "\n".join(lines[:120])
    for heading in ("## Install", "## Demo", "## Port your verl script", "## Check and plan a run"):
        assert f"\n{heading}\n" in first_screen, heading
    assert "<!-- end of demo output -->" in first_screen


def test_every_docs_page_is_reached_from_the_readme():
    seen, todo = set(), [ROOT / "README.md"]
    while todo:
        page = todo.pop()
        for path, _ in _links(page):
            if path.suffix == ".md" and path.parent == DOCS and path not in seen and path.exists():
                seen.add(path)
                todo.append(path)
    assert sorted(p.name for p in DOCS.glob("*.md") if p not in seen) == []


@pytest.mark.parametrize("page", [ROOT / "README.md", *sorted(DOCS.glob("*.md"))], ids=lambda p: p.name)
def test_every_relative_link_resolves(page):
    for path, anchor in _links(page):
        assert path.exists(), f"{page.name}: {path} does not exist"
        if anchor and path.suffix == ".md":
            assert anchor in _anchors(path), f"{page.name}: no heading #{anchor} in {path.name}"


PLAN = ["parallel=tp8pp4", "strategy=megatron", "cluster.nnodes=4", "action=plan"]


@pytest.mark.slow  # composes, validates and plans a 32-GPU run in-process: about 4.5 s on 2 cores, more when busy
def test_docs_checking_shows_what_action_plan_prints(recipe_main, tmp_path):
    """docs/checking.md's action=plan sample is what the command prints; the notes about this machine (an engine not
    importable here, a data file not on it) differ from machine to machine and are not compared."""
    from tests.readme import check_block

    proc = recipe_main("kl_ppo", *PLAN, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-2000:]
    check_block("<!-- plan output: tests/test_docs.py -->", "<!-- end of plan output -->",
                [f"$ python -m recipes.kl_ppo {' '.join(PLAN)}"], proc.stdout.rstrip("\n").splitlines(),
                ignored=lambda line: line.startswith("  - note:"), page="checking.md")


OVER = ["model=qwen2_5_32b", "strategy=megatron", "parallel=tp4pp2", "action=validate"]


@pytest.mark.slow  # validates and re-plans each suggestion in-process: several seconds on 2 cores
def test_docs_checking_shows_what_a_run_that_does_not_fit_prints(recipe_main, tmp_path):
    """docs/checking.md's memory error is what the command prints: exit 2, the error and the changes that fit."""
    from tests.readme import check_block

    proc = recipe_main("grpo", *OVER, cwd=tmp_path)
    assert proc.returncode == 2 and proc.stdout == "", proc.stderr[-2000:]
    check_block("<!-- memory error: tests/test_docs.py -->", "<!-- end of memory error -->",
                [f"$ python -m recipes.grpo {' '.join(OVER)}   # action=plan: the table, then exit 2"],
                proc.stderr.rstrip("\n").splitlines(), page="checking.md")


BUDGETS = ["model=qwen2_5_0_5b", "cluster=h200_141g", "cluster.gpus_per_node=1", "parallel=tp1", "action=plan"]


@pytest.mark.slow  # composes, validates and plans in-process: several seconds on 2 cores
def test_docs_gpus_shows_the_plans_budgets_and_share(recipe_main, tmp_path):
    """docs/gpus.md's action=plan sample: the plan's last lines, from the rollout's share to the token budgets."""
    from tests.readme import check_block

    proc = recipe_main("grpo", *BUDGETS, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-2000:]
    lines = proc.stdout.rstrip("\n").splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("  share "))
    shown = [line for line in lines[start:] if line.startswith(("  share ", "  phases ", "  peak ", "token budgets:"))]
    check_block("<!-- plan budgets: tests/test_docs.py -->", "<!-- end of plan budgets -->",
                [f"$ python -m recipes.grpo {' '.join(BUDGETS)}", "..."], shown, page="gpus.md")
