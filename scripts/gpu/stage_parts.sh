#!/usr/bin/env bash
# Stage, on a GPU machine that takes at most 64 MiB a call, the archives scripts/gpu/build_all.sh built on the CPU
# machine and laid out as .gpu-stage0 .. .gpu-stageN: one folder carried a call, in back-to-back calls (what is under
# STAGE_DIR, /tmp, stays while the machine is warm: the next call within 30 s of the last). Each call copies what it
# carried into STAGE_DIR, checks every file against STAGING.txt's sha256, and unpacks each archive as soon as all of
# its files are there:
#   site.tar.xz (pack.sh)                  -> $E2E_WORK/site           Ray, verl: every GPU run
#   megatron.tar.xz (pack_megatron.sh)     -> $E2E_WORK/megatron_site  strategy=megatron
#   vllm.tar.xz.part-* (pack_vllm.sh)      -> $E2E_WORK/vllm_site      rollout=vllm (joined, checked, unpacked)
#   sglang.tar.xz.part-* (pack_sglang.sh)  -> $E2E_WORK/sglang_site    rollout=sglang (joined, checked, unpacked)
# run_h200_e2e.sh and vs_verl.sh put site and vllm_site on PYTHONPATH; megatron_site goes there by hand
# (PYTHONPATH=$E2E_WORK/megatron_site), and sglang_site too, ahead of vllm_site (docs/staging.md).
#
#   bash scripts/gpu/stage_parts.sh                 # whatever this call carried (.gpu-stage*/, .gpu-packages/)
#   STAGE_FROM=".gpu-stage2" bash scripts/gpu/stage_parts.sh        # these folders only
#   bash scripts/gpu/stage_parts.sh --need site,vllm                # then exit 1 unless these are unpacked
#   bash scripts/gpu/stage_parts.sh --need                          # ... every archive STAGING.txt names
#
# Prints what is unpacked, what is still missing and which folder carries it, and which runs can start:
#   stage_parts: site unpacked; megatron unpacked; vllm missing vllm.tar.xz.part-02 (.gpu-stage3) ...; ready: ...
set -u -o pipefail
cd "$(dirname "$0")/../.."
STAGE=${STAGE_DIR:-/tmp/klppo_parts}
WORK=${E2E_WORK:-/tmp/klppo_e2e}
NEED=; NEED_GIVEN=
if [ "${1:-}" = --need ]; then NEED_GIVEN=1; NEED=$(echo "${2:-}" | tr ',' ' '); fi
mkdir -p "$STAGE" "$WORK"

sources=${STAGE_FROM:-$(ls -d .gpu-stage[0-9]* .gpu-packages 2>/dev/null | tr '\n' ' ')}
for folder in $sources; do
  for f in "$folder"/*; do [ -f "$f" ] && cp -f "$f" "$STAGE/"; done
done
plan=$STAGE/STAGING.txt
# a file that arrived damaged is dropped (and named below as missing), never unpacked
if [ -f "$plan" ]; then
  while read -r sum _ name _; do
    [ -f "$STAGE/$name" ] && [ ! -f "$STAGE/.ok.$name" ] || continue
    if [ "$(sha256sum "$STAGE/$name" | cut -d' ' -f1)" = "$sum" ]; then touch "$STAGE/.ok.$name"
    else echo "stage_parts: $name: sha256 differs from STAGING.txt: dropped, carry it again" >&2; rm -f "$STAGE/$name"; fi
  done < <(grep -v '^#' "$plan")
fi
where() { awk -v n="$1" '$3 == n {print " (" $4 ")"}' "$plan" 2>/dev/null; }

unpack_one() {  # name archive-file folder-under-WORK
  local name=$1 file=$2 dest=$3
  [ -d "$WORK/$dest" ] && return 0
  [ -f "$STAGE/$file" ] || return 1
  rm -rf "$WORK/$dest.tmp" && mkdir -p "$WORK/$dest.tmp"
  xz -dc -T0 "$STAGE/$file" | tar -xf - -C "$WORK/$dest.tmp" && mv "$WORK/$dest.tmp/site" "$WORK/$dest" &&
    rm -rf "$WORK/$dest.tmp"
}
unpack_parts() {  # name (vllm, sglang): NAME.tar.xz.part-* checked against NAME.MANIFEST.txt, joined -> NAME_site
  local name=$1 manifest=$STAGE/$1.MANIFEST.txt dest=$WORK/$1_site missing="" p want got
  [ -d "$dest" ] && return 0
  [ -f "$manifest" ] || { echo "$name.MANIFEST.txt$(where "$name.MANIFEST.txt")"; return 1; }
  for p in $(awk -v n=" $name.tar.xz.part-" 'index($0, n) {print $2}' "$manifest"); do
    [ -f "$STAGE/$p" ] || missing="$missing $p$(where "$p")"
  done
  [ -z "$missing" ] || { echo "${missing# }"; return 1; }
  want=$(awk -v n="$name.tar.xz (joined)" 'index($0, n) {print $1}' "$manifest")
  got=$(cat "$STAGE/$name".tar.xz.part-* | sha256sum | cut -d' ' -f1)
  [ "$want" = "$got" ] || { echo "the joined parts (sha256 $got; $name.MANIFEST.txt says $want): carry them again"; return 1; }
  rm -rf "$dest.tmp" && mkdir -p "$dest.tmp"
  cat "$STAGE/$name".tar.xz.part-* | xz -dc -T0 | tar -xf - -C "$dest.tmp" && mv "$dest.tmp/site" "$dest" &&
    rm -rf "$dest.tmp"
}

# the archives this staging is for: those STAGING.txt names; without one (parts laid out by hand, before
# build_all.sh), pack.sh's and pack_vllm.sh's, and megatron's and sglang's where their archive or manifest came
if [ -f "$plan" ]; then
  archives=$(grep -v '^#' "$plan" | awk '{print $3}' | sed -n 's/^site.tar.xz$/site/p; s/^megatron.tar.xz$/megatron/p;
    s/^vllm.MANIFEST.txt$/vllm/p; s/^sglang.MANIFEST.txt$/sglang/p' | tr '\n' ' ')
else
  archives="site vllm"
  { [ -f "$STAGE/megatron.tar.xz" ] || [ -d "$WORK/megatron_site" ]; } && archives="site megatron vllm"
  { [ -f "$STAGE/sglang.MANIFEST.txt" ] || [ -d "$WORK/sglang_site" ]; } && archives="$archives sglang"
fi
report=(); unpacked=" "
for name in $archives; do
  case $name in
    site) dest=site; file=site.tar.xz ;;
    megatron) dest=megatron_site; file=megatron.tar.xz ;;
  esac
  if [ "$name" = vllm ] || [ "$name" = sglang ]; then
    if out=$(unpack_parts "$name"); then unpacked="$unpacked$name "; report+=("$name unpacked")
    else report+=("$name missing $out"); fi
  elif unpack_one "$name" "$file" "$dest"; then
    unpacked="$unpacked$name "; report+=("$name unpacked")
  else
    report+=("$name missing $file$(where "$file")")
  fi
done
ready=()
case $unpacked in *" site "*)
  ready+=("rollout=hf")
  case $unpacked in *" vllm "*) ready+=("rollout=vllm") ;; esac
  case $unpacked in *" sglang "*) ready+=("rollout=sglang (PYTHONPATH=$WORK/sglang_site first)") ;; esac
  case $unpacked in *" megatron "*) ready+=("strategy=megatron (PYTHONPATH=$WORK/megatron_site)") ;; esac ;;
esac
line=$(printf '%s; ' "${report[@]}")
echo "stage_parts: ${line}ready: ${ready[*]:-nothing yet}"
[ -n "$NEED_GIVEN" ] || exit 0
for name in ${NEED:-$archives}; do
  case $unpacked in *" $name "*) ;; *) exit 1 ;; esac
done
exit 0
