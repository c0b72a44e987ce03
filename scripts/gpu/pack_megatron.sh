#!/usr/bin/env bash
# Build, on a CPU machine with PyPI access, the `[megatron]` extra's packages for strategy=megatron on a GPU machine
# without internet: megatron-core 0.16.1 and mbridge 0.15.1 (the exact pins of pyproject.toml's `megatron` extra, which
# recipes/verl_ext/plugin/megatron_no_te.py patches) and einops (mbridge imports it), as requirements/megatron-site.txt
# pins them; no TransformerEngine, no apex.
# One xz tarball of a site folder, about 3 MB.
#
#   bash scripts/gpu/pack_megatron.sh   # -> .gpu-packages/megatron.tar.xz and megatron.MANIFEST.txt
#
# On the GPU machine scripts/gpu/stage_parts.sh unpacks it to $E2E_WORK/megatron_site (the same packages as
# `pip install --no-deps --target /tmp/msite <the three wheels>` of scripts/gpu/results/2026-12-04-h200-megatron/);
# put that folder on PYTHONPATH for strategy=megatron runs (docs/staging.md).
set -euo pipefail
cd "$(dirname "$0")/../.."
OUT=${PACK_OUT:-.gpu-packages}
WORK=${PACK_WORK:-build/gpu-megatron}
PY=${PYTHON:-python3}
. scripts/gpu/_wheels.sh  # unpack_wheels
# the pins the test suite runs megatron-core with (make install's build/megatron-site): one list for both
mapfile -t SPECS < <(grep -v -E '^\s*(#|$)' requirements/megatron-site.txt)
mkdir -p "$OUT" "$WORK/wheels"
rm -rf "$WORK/site" && mkdir -p "$WORK/site"

# megatron-core ships C++ helpers: the wheel for the GPU image's interpreter (CPython 3.12, x86-64 Linux)
"$PY" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_24_x86_64 --platform manylinux_2_17_x86_64 \
  --platform manylinux2014_x86_64 -d "$WORK/wheels" "${SPECS[@]}" 2>&1 | grep -v "^WARNING: Location" || true
unpack_wheels "$WORK/wheels" "$WORK/site" pack_megatron.sh "${SPECS[@]}"
find "$WORK/site" -name __pycache__ -type d -prune -exec rm -rf {} +
test -d "$WORK/site/megatron/core" && test -d "$WORK/site/mbridge"

{
  echo "# scripts/gpu/pack_megatron.sh, $(date -u +%Y-%m-%dT%H:%M:%SZ): CPython 3.12 manylinux x86-64 wheels, unpacked into site/"
  printf '%s\n' "${SPECS[@]}"
} >"$OUT/megatron.MANIFEST.txt"
tar -C "$WORK" -cf - site | xz -"${XZ_LEVEL:-1}" -T2 >"$OUT/megatron.tar.xz"
echo "pack_megatron.sh: $OUT/megatron.tar.xz $(( $(stat -c %s "$OUT/megatron.tar.xz") / 1024 )) KiB" \
  "($(du -sm "$WORK/site" | cut -f1) MiB unpacked), ${#SPECS[@]} packages"
