"""Staging for a GPU machine (docs/staging.md): scripts/gpu/build_all.sh's plan and carry folders, and
scripts/gpu/stage_parts.sh taking one folder a call, on small archives made here in the layout of the real ones
(pack.sh's site.tar.xz, pack_megatron.sh's megatron.tar.xz, pack_vllm.sh's parts and manifest). Nothing is
downloaded or built: --list and --layout only."""

from __future__ import annotations

import hashlib
import os
import subprocess
from pathlib import Path

import pytest

from tests.staging import BUILD_ALL, MIB, STAGE_PARTS, site_xz


@pytest.fixture
def packages(tmp_path) -> Path:
    """.gpu-packages as the three pack scripts leave it; vLLM's archive in two parts (2 MiB and the rest)."""
    out = tmp_path / "pkgs"
    out.mkdir()
    (out / "MANIFEST.txt").write_text("# pack.sh\nverl==0.9.1\n")
    (out / "site.tar.xz").write_bytes(site_xz({"verl/__init__.py": b"", "ray/__init__.py": b""}))
    (out / "megatron.MANIFEST.txt").write_text("# pack_megatron.sh\nmegatron-core==0.16.1\n")
    (out / "megatron.tar.xz").write_bytes(site_xz({"megatron/core/__init__.py": b"", "mbridge/__init__.py": b""}))
    joined = site_xz({"vllm/__init__.py": b"", "vllm/blob.bin": os.urandom(3 * MIB)})  # incompressible: ~3 MiB
    parts = [joined[:2 * MIB], joined[2 * MIB:]]
    lines = ["# pack_vllm.sh"]
    for k, part in enumerate(parts):
        (out / f"vllm.tar.xz.part-{k:02d}").write_bytes(part)
        lines.append(f"{hashlib.sha256(part).hexdigest()}  vllm.tar.xz.part-{k:02d}")
    lines.append(f"{hashlib.sha256(joined).hexdigest()}  vllm.tar.xz (joined)")
    (out / "vllm.MANIFEST.txt").write_text("\n".join(lines) + "\n")
    return out


def _bash(script: Path, *args: str, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", str(script), *args], capture_output=True, text=True, timeout=120,
                          env={**os.environ, **env})


def test_list_on_a_fresh_checkout_names_the_script_of_each_archive(tmp_path):
    proc = _bash(BUILD_ALL, "--list", PACK_OUT=str(tmp_path / "empty"), STAGE_ROOT=str(tmp_path))
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines() == [
        "build_all: site: missing: would run bash scripts/gpu/pack.sh",
        "build_all: megatron: missing: would run bash scripts/gpu/pack_megatron.sh",
        "build_all: vllm: missing: would run bash scripts/gpu/pack_vllm.sh",
        "build_all: nothing built yet to carry (bash scripts/gpu/build_all.sh builds it)",
    ]
    assert list(tmp_path.iterdir()) == []  # --list writes nothing


def test_list_and_layout_plan_one_folder_a_call_under_the_limit(tmp_path, packages):
    env = {"PACK_OUT": str(packages), "STAGE_ROOT": str(tmp_path / "tree"), "STAGE_MB": "3"}
    (tmp_path / "tree").mkdir()
    listed = _bash(BUILD_ALL, "--list", **env)
    assert listed.returncode == 0, listed.stderr
    lines = listed.stdout.splitlines()
    assert lines[:3] == [
        f"build_all: site: built (2 files, 1 MiB in {packages}) by scripts/gpu/pack.sh",
        f"build_all: megatron: built (2 files, 1 MiB in {packages}) by scripts/gpu/pack_megatron.sh",
        f"build_all: vllm: built (3 files, 4 MiB in {packages}) by scripts/gpu/pack_vllm.sh",
    ]
    assert lines[3].startswith("build_all: carry 2 folders, one a call")
    assert lines[3].endswith("at most 3 MiB a folder):")
    assert lines[4] == ("  .gpu-stage0  3 MiB: MANIFEST.txt site.tar.xz megatron.MANIFEST.txt megatron.tar.xz "
                        "vllm.MANIFEST.txt vllm.tar.xz.part-00")
    assert lines[5] == "  .gpu-stage1  2 MiB: vllm.tar.xz.part-01"
    assert list((tmp_path / "tree").iterdir()) == []

    laid = _bash(BUILD_ALL, "--layout", **env)
    assert laid.returncode == 0, laid.stderr
    assert laid.stdout.splitlines()[-1] == ('  run(command="bash scripts/gpu/stage_parts.sh", carry=[".gpu-stageK"])   '
                                            "for K = 0 .. 1")
    tree = tmp_path / "tree"
    assert sorted(p.name for p in (tree / ".gpu-stage0").iterdir()) == sorted(
        ["MANIFEST.txt", "site.tar.xz", "megatron.MANIFEST.txt", "megatron.tar.xz", "vllm.MANIFEST.txt",
         "vllm.tar.xz.part-00", "STAGING.txt"])
    assert [p.name for p in (tree / ".gpu-stage1").iterdir()] == ["vllm.tar.xz.part-01"]
    staging = [line.split() for line in (tree / ".gpu-stage0" / "STAGING.txt").read_text().splitlines()[1:]]
    part = (packages / "vllm.tar.xz.part-01").read_bytes()
    assert [hashlib.sha256(part).hexdigest(), str(len(part)), "vllm.tar.xz.part-01", ".gpu-stage1"] in staging
    assert len(staging) == 7


def test_stage_parts_unpacks_each_archive_as_its_folders_arrive_and_says_what_is_missing(tmp_path, packages):
    tree = tmp_path / "tree"
    tree.mkdir()
    assert _bash(BUILD_ALL, "--layout", PACK_OUT=str(packages), STAGE_ROOT=str(tree), STAGE_MB="3").returncode == 0
    work, stage = tmp_path / "work", tmp_path / "stage"
    env = {"STAGE_DIR": str(stage), "E2E_WORK": str(work)}

    first = _bash(STAGE_PARTS, "--need", "site,vllm", STAGE_FROM=str(tree / ".gpu-stage0"), **env)
    assert first.returncode == 1  # vLLM still lacks a part
    assert first.stdout == ("stage_parts: site unpacked; megatron unpacked; vllm missing vllm.tar.xz.part-01 "
                            f"(.gpu-stage1); ready: rollout=hf strategy=megatron (PYTHONPATH={work}/megatron_site)\n")
    assert (work / "site" / "verl" / "__init__.py").is_file()
    assert (work / "megatron_site" / "megatron" / "core" / "__init__.py").is_file()
    assert not (work / "vllm_site").exists()

    # a part that arrives damaged is dropped, named again as missing, and nothing is unpacked from it
    damaged = tmp_path / "damaged"
    damaged.mkdir()
    (damaged / "vllm.tar.xz.part-01").write_bytes(b"not the part")
    again = _bash(STAGE_PARTS, STAGE_FROM=str(damaged), **env)
    assert again.returncode == 0
    assert "vllm.tar.xz.part-01: sha256 differs from STAGING.txt: dropped, carry it again" in again.stderr
    assert "vllm missing vllm.tar.xz.part-01 (.gpu-stage1)" in again.stdout

    last = _bash(STAGE_PARTS, "--need", STAGE_FROM=str(tree / ".gpu-stage1"), **env)
    assert last.returncode == 0, last.stdout + last.stderr
    assert last.stdout == ("stage_parts: site unpacked; megatron unpacked; vllm unpacked; ready: rollout=hf "
                           f"rollout=vllm strategy=megatron (PYTHONPATH={work}/megatron_site)\n")
    assert (work / "vllm_site" / "vllm" / "blob.bin").stat().st_size == 3 * MIB


def test_build_all_refuses_an_unknown_argument_or_archive(tmp_path):
    assert _bash(BUILD_ALL, "--dry").returncode == 2
    proc = _bash(BUILD_ALL, "--list", ONLY="site trtllm", PACK_OUT=str(tmp_path))
    assert proc.returncode == 2 and "build_all: unknown archive trtllm (site vllm megatron sglang)" in proc.stderr


STAND_IN = """#!/usr/bin/env bash
# a stand-in for scripts/gpu/{name}: writes its archive's files into PACK_OUT, as the real one does
set -euo pipefail
echo "{name}" >>"{calls}"
for f in {files}; do printf '%s' "{content}" >"$PACK_OUT/$f"; done
"""


def _stand_ins(folder: Path, calls: Path, content: str = "v1") -> None:
    folder.mkdir(exist_ok=True)
    files = {"pack.sh": "MANIFEST.txt site.tar.xz", "pack_megatron.sh": "megatron.MANIFEST.txt megatron.tar.xz",
             "pack_vllm.sh": "vllm.MANIFEST.txt vllm.tar.xz.part-00 vllm.tar.xz.part-01"}
    for name, outputs in files.items():
        (folder / name).write_text(STAND_IN.format(name=name, calls=calls, files=outputs, content=content))


def test_build_all_builds_what_is_missing_or_from_other_inputs_and_keeps_a_staging_in_progress(tmp_path):
    scripts, calls, out, tree = tmp_path / "scripts", tmp_path / "calls.txt", tmp_path / "pkgs", tmp_path / "tree"
    tree.mkdir()
    _stand_ins(scripts, calls)
    env = {"PACK_SCRIPTS": str(scripts), "PACK_OUT": str(out), "STAGE_ROOT": str(tree)}

    first = _bash(BUILD_ALL, **env)
    assert first.returncode == 0, first.stderr
    assert calls.read_text().split() == ["pack.sh", "pack_megatron.sh", "pack_vllm.sh"]
    assert [line.split()[0] for line in (out / "BUILT.txt").read_text().splitlines()] == ["site", "megatron", "vllm"]
    assert sorted(p.name for p in out.iterdir() if p.name not in ("BUILT.txt", "STAGING.txt")) == sorted(
        ["MANIFEST.txt", "site.tar.xz", "megatron.MANIFEST.txt", "megatron.tar.xz", "vllm.MANIFEST.txt",
         "vllm.tar.xz.part-00", "vllm.tar.xz.part-01"])
    assert (tree / ".gpu-stage0" / "vllm.tar.xz.part-01").read_text() == "v1"

    again = _bash(BUILD_ALL, **env)  # nothing changed: nothing built, the same layout
    assert again.returncode == 0 and calls.read_text().split() == ["pack.sh", "pack_megatron.sh", "pack_vllm.sh"]

    staged = tree / ".gpu-stage0" / "vllm.tar.xz.part-01"
    kept = tree / "kept_link"
    kept.hardlink_to(staged)  # a staging in progress holds the bytes it was planned with
    (scripts / "pack_vllm.sh").write_text(STAND_IN.format(
        name="pack_vllm.sh", calls=calls, files="vllm.MANIFEST.txt vllm.tar.xz.part-00 vllm.tar.xz.part-01",
        content="v2"))
    listed = _bash(BUILD_ALL, "--list", **env)
    assert f"build_all: vllm: stale: would run bash {scripts}/pack_vllm.sh" in listed.stdout.splitlines()
    rebuilt = _bash(BUILD_ALL, **env)
    assert rebuilt.returncode == 0, rebuilt.stderr
    assert calls.read_text().split() == ["pack.sh", "pack_megatron.sh", "pack_vllm.sh", "pack_vllm.sh"]
    assert (out / "vllm.tar.xz.part-01").read_text() == "v2" and kept.read_text() == "v1"
    assert (tree / ".gpu-stage0" / "vllm.tar.xz.part-01").read_text() == "v2"


def test_stage_parts_without_a_staging_plan_stages_the_site_and_vllm_as_before(tmp_path, packages):
    """Folders laid out by hand (no STAGING.txt, no megatron archive): the site and vLLM, and --need asks for both."""
    carried = tmp_path / "carried"
    carried.mkdir()
    for name in ("MANIFEST.txt", "site.tar.xz", "vllm.MANIFEST.txt", "vllm.tar.xz.part-00", "vllm.tar.xz.part-01"):
        (carried / name).write_bytes((packages / name).read_bytes())
    work = tmp_path / "work"
    proc = _bash(STAGE_PARTS, "--need", STAGE_FROM=str(carried), STAGE_DIR=str(tmp_path / "stage"), E2E_WORK=str(work))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout == "stage_parts: site unpacked; vllm unpacked; ready: rollout=hf rollout=vllm\n"
    assert not (work / "megatron_site").exists()
