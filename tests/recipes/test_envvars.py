"""The pack's environment variables: KLPPO_ names, and the earlier names still read with a deprecation note."""

from __future__ import annotations

import logging

from recipes import envvars


def test_new_name_wins_and_old_name_is_read_with_a_note(monkeypatch, caplog):
    monkeypatch.delenv(envvars.DATA_DIR, raising=False)
    monkeypatch.setenv("PACK_DATA_DIR", "/old")
    monkeypatch.setattr(envvars, "_warned", set())
    with caplog.at_level(logging.WARNING, logger="recipes.envvars"):
        assert envvars.getenv(envvars.DATA_DIR) == "/old"
        assert envvars.getenv(envvars.DATA_DIR) == "/old"
    notes = [r.getMessage() for r in caplog.records]
    assert notes == ["PACK_DATA_DIR is deprecated: set KLPPO_DATA_DIR instead (read PACK_DATA_DIR=/old for now)"]
    monkeypatch.setenv(envvars.DATA_DIR, "/new")
    assert envvars.getenv(envvars.DATA_DIR) == "/new"


def test_the_demo_assets_follow_the_old_name_too(monkeypatch, tmp_path):
    from recipes.verl_ext.demo import default_root

    monkeypatch.delenv(envvars.DATA_DIR, raising=False)
    monkeypatch.setenv("PACK_DATA_DIR", str(tmp_path))
    assert default_root() == tmp_path
