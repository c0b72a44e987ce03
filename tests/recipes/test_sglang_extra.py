"""The ``[sglang]`` extra against verl 0.9.1's own requirements (issue 50, item 1), read from what is installed here
(verl's metadata) and from pyproject.toml, compared with ``packaging.specifiers``; the SGLang releases the pack calls
drivable (recipes/check/needs.py) against the same requirement; and the pack's SGLang glue importing without SGLang."""

from __future__ import annotations

import importlib.metadata
from pathlib import Path

import pytest
import tomllib
from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet

from recipes.check.needs import (
    NEEDS,
    SGLANG_DRIVEN,
    SGLANG_PIN,
    SGLANG_TRANSFORMERS,
    importable,
    installed_version,
    missing_packages,
)

ROOT = Path(__file__).resolve().parents[2]


def pack_requirements(extra: str | None = None) -> dict[str, Requirement]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    lines = project["optional-dependencies"][extra] if extra else project["dependencies"]
    return {(req := Requirement(line)).name.lower(): req for line in lines}


def verl_requirements(extra: str | None = None) -> dict[str, Requirement]:
    """verl's requirements as installed here: its base ones (no extra marker), or those of one extra."""
    found = {}
    for line in importlib.metadata.requires("verl") or []:
        req = Requirement(line)
        marker = str(req.marker or "")
        if (extra is None and "extra" not in marker) or (extra is not None and f'extra == "{extra}"' in marker):
            found[req.name.lower()] = req
    return found


def test_verl_here_is_the_release_the_pack_pins():
    assert importlib.metadata.version("verl") == "0.9.1"
    assert str(pack_requirements()["verl"].specifier) == "==0.9.1"


def test_the_extra_pins_a_transformers_that_verl_and_the_pack_accept():
    extra = {name: str(req.specifier) for name, req in pack_requirements("sglang").items()}
    assert extra == {"sglang": "==0.5.13.post1", "transformers": "==5.8.1"}
    verl_transformers = verl_requirements()["transformers"].specifier
    assert verl_transformers == SpecifierSet(">=5.5.3,<5.11,!=5.6.0")
    assert verl_transformers.contains("5.8.1")
    assert pack_requirements()["transformers"].specifier.contains("5.8.1")
    # every pin of the extra agrees with what verl 0.9.1 itself requires of the same package
    for name, req in pack_requirements("sglang").items():
        pinned = next(iter(req.specifier)).version
        if name in verl_requirements():
            assert verl_requirements()[name].specifier.contains(pinned), (name, pinned)


def test_verls_own_sglang_extra_pins_a_release_whose_transformers_verl_excludes():
    """Why the pack does not take verl[sglang]: its sglang==0.5.12 pins transformers==5.6.0, which verl's own base
    requirement excludes (uv: 'your requirements are unsatisfiable')."""
    verl_extra = {name: str(req.specifier) for name, req in verl_requirements("sglang").items()}
    assert verl_extra["sglang"] == "==0.5.12" and verl_extra["transformers"] == "==5.9.0"
    assert SGLANG_TRANSFORMERS["0.5.12"] == "5.6.0"
    assert not verl_requirements()["transformers"].specifier.contains("5.6.0")


def test_the_drivable_releases_are_those_whose_transformers_pin_verl_accepts():
    verl_transformers = verl_requirements()["transformers"].specifier
    driven = SpecifierSet(SGLANG_DRIVEN)
    agree = sorted(release for release, pin in SGLANG_TRANSFORMERS.items() if verl_transformers.contains(pin))
    assert agree == ["0.5.13", "0.5.13.post1", "0.5.14"]
    for release in SGLANG_TRANSFORMERS:
        assert driven.contains(release) == (release in agree), release
    # the extra's pins: a drivable release, and the transformers that release pins
    assert SGLANG_PIN == "0.5.13.post1" and driven.contains(SGLANG_PIN)
    assert str(pack_requirements("sglang")["sglang"].specifier) == f"=={SGLANG_PIN}"
    assert str(pack_requirements("sglang")["transformers"].specifier) == f"=={SGLANG_TRANSFORMERS[SGLANG_PIN]}"


@pytest.mark.parametrize(("found", "line"), [
    (None, None),  # no metadata to read: not refused on a guess
    ("0.5.13.post1", None),
    ("0.5.14", None),
    ("0.5.12", "actor_rollout_ref.rollout.name=sglang: sglang 0.5.12 is installed here; verl 0.9.1 drives "
               "sglang>=0.5.13,<0.5.15 (0.5.12 pins transformers==5.6.0; verl 0.9.1 takes "
               "transformers>=5.5.3,<5.11,!=5.6.0): pip install 'klppo-recipes[sglang]' (in a checkout: pip install "
               "-e '.[sglang]')"),
    ("0.5.20", "actor_rollout_ref.rollout.name=sglang: sglang 0.5.20 is installed here; verl 0.9.1 drives "
               "sglang>=0.5.13,<0.5.15 (verl 0.9.1 takes transformers>=5.5.3,<5.11,!=5.6.0): pip install "
               "'klppo-recipes[sglang]' (in a checkout: pip install -e '.[sglang]')"),
])
def test_an_installed_sglang_outside_the_drivable_releases_is_one_line(monkeypatch, found, line):
    from omegaconf import OmegaConf

    import recipes.check.needs as needs

    monkeypatch.setattr(needs, "importable", lambda module: True)
    monkeypatch.setattr(needs, "installed_version", lambda package: found if package == "sglang" else None)
    cfg = OmegaConf.create({"actor_rollout_ref": {"rollout": {"name": "sglang"}}})
    assert missing_packages(cfg) == ([line] if line else [])
    # vLLM's release is not checked here (its extra and verl agree on vllm==0.24.0)
    vllm = OmegaConf.create({"actor_rollout_ref": {"rollout": {"name": "vllm"}}})
    assert missing_packages(vllm) == []


def test_installed_version_reads_metadata_without_importing():
    assert installed_version("verl") == "0.9.1"
    assert installed_version("no-such-distribution-here") is None


@pytest.mark.slow  # the first composition of verl's tree in this process
def test_the_packs_sglang_glue_imports_and_composes_without_sglang(compose):
    """The glue: recipes/check/needs.py (the check above) and conf/rollout/sglang.yaml (verl's rollout.name and the
    engine's memory share); both load on a machine without SGLang."""
    assert [n.value for n in NEEDS if n.package == "sglang"] == ["sglang"]
    cfg = compose("grpo", ["rollout=sglang", "parallel=tp1"])
    assert cfg.actor_rollout_ref.rollout.name == "sglang" and cfg.rollout.name == "sglang"
    assert cfg.actor_rollout_ref.rollout.mode == "async"


@pytest.mark.skipif(not importable("sglang"), reason="SGLang is not installed here (the GPU machine's check)")
def test_verls_sglang_rollout_imports_with_the_installed_sglang():
    """Where SGLang is installed: at a drivable release, and verl 0.9.1's server and rollout modules import on it."""
    import importlib

    assert SpecifierSet(SGLANG_DRIVEN).contains(installed_version("sglang"), prereleases=True)
    importlib.import_module("verl.workers.rollout.sglang_rollout.async_sglang_server")
    importlib.import_module("verl.workers.rollout.sglang_rollout.sglang_rollout")
