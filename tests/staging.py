"""What the staging tests share (tests/scripts/test_staging.py, tests/gpu/test_stage_sglang.py): the two scripts
under test and small archives in the layout the pack scripts write (docs/staging.md)."""

from __future__ import annotations

import io
import tarfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
BUILD_ALL = REPO / "scripts" / "gpu" / "build_all.sh"
STAGE_PARTS = REPO / "scripts" / "gpu" / "stage_parts.sh"
MIB = 1024 * 1024


def site_xz(files: dict[str, bytes]) -> bytes:
    """An xz tarball of a ``site/`` folder, as the pack scripts write them."""
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w:xz") as tar:
        for name, data in files.items():
            info = tarfile.TarInfo(f"site/{name}")
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return raw.getvalue()
