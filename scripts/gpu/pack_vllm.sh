#!/usr/bin/env bash
# Build, on a CPU machine with PyPI access, vLLM 0.24.0 (verl 0.9.1's pin) and the pure-Python needs that the GPU
# image lacks, for rollout=vllm on a GPU machine without internet: one xz tarball of a site folder, split into parts
# small enough for one transfer each (PART_MB, default 58).
#
#   bash scripts/gpu/pack_vllm.sh     # -> .gpu-packages/vllm.tar.xz.part-00, -01, ... and vllm.MANIFEST.txt
#
# What goes in: the vllm wheel (cp38-abi3, built against torch 2.11.0, the GPU image's torch) without
# vllm/vllm_flash_attn/_vllm_fa2_C.abi3.so (Hopper runs FA3, which stays) and vllm/vllm-rs (the Rust front end the
# Python engine does not start), and each package of scripts/gpu/vllm_needs.txt. On the GPU machine,
# scripts/gpu/stage_parts.sh joins the parts and unpacks the site; it goes first on PYTHONPATH, before pack.sh's.
# Check what imports after a change on the CPU, with the unpacked site on PYTHONPATH (no GPU time):
#   python -c "from vllm import LLM; import vllm.entrypoints.openai.api_server, vllm.v1.engine.core"
set -euo pipefail
cd "$(dirname "$0")/../.."
OUT=${PACK_OUT:-.gpu-packages}
WORK=${PACK_WORK:-build/gpu-vllm}
PY=${PYTHON:-python3}
. scripts/gpu/_wheels.sh  # unpack_wheels
PART_MB=${PART_MB:-46}
mkdir -p "$OUT" "$WORK/wheels"
rm -rf "$WORK/site" && mkdir -p "$WORK/site"

mapfile -t specs < <(grep -v -E '^\s*(#|$)' scripts/gpu/vllm_needs.txt)
specs+=("vllm==0.24.0")
"$PY" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_35_x86_64 --platform manylinux_2_34_x86_64 --platform manylinux_2_31_x86_64 \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_24_x86_64 \
  --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 --platform manylinux1_x86_64 \
  -d "$WORK/wheels" "${specs[@]}" 2>&1 | grep -v "^WARNING: Location" || true

unpack_wheels "$WORK/wheels" "$WORK/site" pack_vllm.sh "${specs[@]}"
rm -f "$WORK/site/vllm/vllm_flash_attn/_vllm_fa2_C.abi3.so" "$WORK/site/vllm/vllm-rs"
find "$WORK/site" -name __pycache__ -type d -prune -exec rm -rf {} +

{
  echo "# scripts/gpu/pack_vllm.sh, $(date -u +%Y-%m-%dT%H:%M:%SZ): CPython 3.12 manylinux x86-64 wheels, unpacked into site/"
  printf '%s\n' "${specs[@]}"
  echo "removed: vllm/vllm_flash_attn/_vllm_fa2_C.abi3.so vllm/vllm-rs"
} >"$OUT/vllm.MANIFEST.txt"
rm -f "$OUT"/vllm.tar.xz.part-*
tar -C "$WORK" -cf - site | xz -"${XZ_LEVEL:-1}" -T2 | split -b "${PART_MB}M" -d -a 2 - "$OUT/vllm.tar.xz.part-"
( cd "$OUT" && sha256sum vllm.tar.xz.part-* >>vllm.MANIFEST.txt && cat vllm.tar.xz.part-* | sha256sum | \
  sed 's/-$/vllm.tar.xz (joined)/' >>vllm.MANIFEST.txt )
echo "pack_vllm.sh: $(ls "$OUT"/vllm.tar.xz.part-* | wc -l) parts of at most $PART_MB MiB in $OUT," \
  "$(du -cm "$OUT"/vllm.tar.xz.part-* | tail -1 | cut -f1) MiB ($(du -sm "$WORK/site" | cut -f1) MiB unpacked), ${#specs[@]} packages"
