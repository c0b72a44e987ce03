#!/usr/bin/env bash
# Stage, on a GPU machine that takes at most ~60 MiB a transfer, the parts built by scripts/gpu/pack_vllm.sh (and
# pack.sh's site.tar.xz), one or two per call, in back-to-back calls: what is under STAGE_DIR (/tmp) stays while the
# machine is warm. Once every part the manifest names is there, the parts are joined, checked against the manifest's
# sha256 and unpacked to $E2E_WORK/vllm_site (and site.tar.xz to $E2E_WORK/site), where run_h200_e2e.sh finds them.
#
#   bash scripts/gpu/stage_parts.sh            # copies .gpu-packages/* into STAGE_DIR; unpacks when complete
#   STAGE_FROM=.gpu-stage bash scripts/gpu/stage_parts.sh   # the folder a call carried (one part a call: each call
#                                              # carries the working tree too, ~12 MB, under the 64 MiB a call takes)
#   bash scripts/gpu/stage_parts.sh --need     # the same, then exit 1 unless the packages are unpacked
#
# Prints one line: the parts held, the parts still missing, or "unpacked".
set -u -o pipefail
cd "$(dirname "$0")/../.."
STAGE=${STAGE_DIR:-/tmp/klppo_parts}
WORK=${E2E_WORK:-/tmp/klppo_e2e}
mkdir -p "$STAGE" "$WORK"
for f in "${STAGE_FROM:-.gpu-packages}"/*; do
  [ -f "$f" ] && cp -f "$f" "$STAGE/"
done
manifest=$STAGE/vllm.MANIFEST.txt
# Ray, verl and the rest (pack.sh) as soon as they are here: the models and data can be built meanwhile
if [ -f "$STAGE/site.tar.xz" ] && [ ! -d "$WORK/site/verl" ]; then
  xz -dc -T0 "$STAGE/site.tar.xz" | tar -xf - -C "$WORK" && echo "stage_parts: $WORK/site unpacked"
fi
if [ -d "$WORK/vllm_site/vllm" ] && [ -d "$WORK/site/verl" ]; then echo "stage_parts: unpacked"; exit 0; fi
[ -f "$manifest" ] || { echo "stage_parts: no vllm.MANIFEST.txt yet (held: $(ls "$STAGE" | tr '\n' ' '))"; exit 1; }
missing=$(awk '/ vllm.tar.xz.part-/ {print $2}' "$manifest" | while read -r p; do [ -f "$STAGE/$p" ] || echo "$p"; done)
[ -f "$STAGE/site.tar.xz" ] || missing="$missing site.tar.xz"
if [ -n "$(echo "$missing" | tr -d ' \n')" ]; then
  echo "stage_parts: held $(ls "$STAGE" | tr '\n' ' '); missing $(echo $missing)"
  [ "${1:-}" = --need ] && exit 1 || exit 0
fi
want=$(awk '/vllm.tar.xz \(joined\)/ {print $1}' "$manifest")
got=$(cat "$STAGE"/vllm.tar.xz.part-* | sha256sum | cut -d' ' -f1)
[ "$want" = "$got" ] || { echo "stage_parts: joined parts sha256 $got, manifest says $want" >&2; exit 1; }
start=$(date +%s)
rm -rf "$WORK/vllm_tmp" "$WORK/vllm_site" && mkdir -p "$WORK/vllm_tmp"
cat "$STAGE"/vllm.tar.xz.part-* | xz -dc -T0 | tar -xf - -C "$WORK/vllm_tmp" && mv "$WORK/vllm_tmp/site" "$WORK/vllm_site"
echo "stage_parts: unpacked in $(( $(date +%s) - start )) s: $WORK/vllm_site ($(du -sm "$WORK/vllm_site" | cut -f1) MiB)," \
  "$WORK/site ($(du -sm "$WORK/site" | cut -f1) MiB)"
