"""tests/readme.py's update mode: it rewrites a README block, except under CI=true, where it fails the test."""

from __future__ import annotations

import pytest

from tests import readme

START, END = "<!-- sample: test -->", "<!-- end of sample -->"
TEXT = f"# title\n{START}\n```\n$ cmd\nold line\n```\n{END}\nafter\n"


@pytest.fixture
def sample(tmp_path, monkeypatch):
    path = tmp_path / "README.md"
    path.write_text(TEXT)
    monkeypatch.setattr(readme, "README", path)
    monkeypatch.setenv("KLPPO_UPDATE_README", "1")
    return path


@pytest.mark.parametrize("ci", ["true", "TRUE"])
def test_update_mode_is_refused_under_ci(sample, monkeypatch, ci):
    monkeypatch.setenv("CI", ci)
    with pytest.raises(pytest.fail.Exception, match="refused under CI=true"):
        readme.check_block(START, END, ["$ cmd"], ["new line"])
    assert sample.read_text() == TEXT


def test_update_mode_rewrites_the_block_outside_ci(sample, monkeypatch):
    monkeypatch.delenv("CI", raising=False)
    readme.check_block(START, END, ["$ cmd"], ["new line"])
    assert sample.read_text() == TEXT.replace("old line", "new line")


def test_compare_mode_under_ci_still_compares(sample, monkeypatch):
    monkeypatch.setenv("CI", "true")
    monkeypatch.delenv("KLPPO_UPDATE_README")
    readme.check_block(START, END, ["$ cmd"], ["old line"])
    with pytest.raises(AssertionError, match="differs from what the command prints"):
        readme.check_block(START, END, ["$ cmd"], ["new line"])


def test_a_docs_page_block_is_compared_and_rewritten_the_same_way(tmp_path, monkeypatch):
    (tmp_path / "page.md").write_text(TEXT)
    monkeypatch.setattr(readme, "DOCS", tmp_path)
    monkeypatch.delenv("KLPPO_UPDATE_README", raising=False)
    readme.check_block(START, END, ["$ cmd"], ["old line"], page="page.md")
    with pytest.raises(AssertionError, match="page.md's block .* differs from what the command prints"):
        readme.check_block(START, END, ["$ cmd"], ["new line"], page="page.md")
    monkeypatch.delenv("CI", raising=False)
    monkeypatch.setenv("KLPPO_UPDATE_README", "1")
    readme.check_block(START, END, ["$ cmd"], ["new line"], page="page.md")
    assert (tmp_path / "page.md").read_text() == TEXT.replace("old line", "new line")
