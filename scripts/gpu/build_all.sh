#!/usr/bin/env bash
# Everything a GPU run needs that the GPU machine lacks, built on the CPU machine (PyPI reachable) in one command,
# then laid out as the folders the device tool carries, one a call (docs/staging.md).
#
#   bash scripts/gpu/build_all.sh            # build the archives that are missing or older than their inputs, lay out
#   bash scripts/gpu/build_all.sh --list     # what it would build and carry; builds and writes nothing
#   bash scripts/gpu/build_all.sh --layout   # lay out the carry folders from the archives already built; builds nothing
#   bash scripts/gpu/build_all.sh --force    # rebuild every archive
#   ONLY="site megatron" bash scripts/gpu/build_all.sh     # some archives only (default: site megatron vllm, and
#                                                           # sglang once its archive is in .gpu-packages)
#   ONLY="site megatron vllm sglang" bash scripts/gpu/build_all.sh   # build SGLang's too (then the default has it)
#
# The archives, in .gpu-packages/ (PACK_OUT; git-ignored), each from its own script (xz -1: minutes on 2 cores):
#   site      scripts/gpu/pack.sh           Ray, verl 0.9.1 and what verl's trainer imports (every GPU run)
#   vllm      scripts/gpu/pack_vllm.sh      vLLM 0.24.0 and its pure-Python needs, in parts (rollout=vllm)
#   megatron  scripts/gpu/pack_megatron.sh  megatron-core 0.16.1, mbridge 0.15.1, einops (strategy=megatron)
#   sglang    scripts/gpu/pack_sglang.sh    SGLang 0.5.13.post1 and what it needs beyond the site, in parts
#                                           (rollout=sglang only: built when ONLY names it, laid out last)
# The carry folders, .gpu-stage0 .. .gpu-stageN at the checkout's top (STAGE_ROOT; git-ignored): hard links to the
# archives, each folder at most 64 MiB less the working tree the same call carries (STAGE_MB overrides), with
# STAGING.txt (every file, its size, sha256 and folder) in .gpu-stage0. On the GPU machine, one call per folder:
#   run(command="bash scripts/gpu/stage_parts.sh", carry=[".gpu-stageK"])
# back to back (what is under /tmp there stays while the next call comes within 30 s of the last).
set -euo pipefail
cd "$(dirname "$0")/../.."
OUT=${PACK_OUT:-.gpu-packages}
ROOT_OUT=${STAGE_ROOT:-.}
# sglang (7 more folders a staging carries, for rollout=sglang alone) is built only where ONLY names it; once built,
# the default lays it out too, after vLLM's parts
if [ -z "${ONLY:-}" ]; then ONLY="site megatron vllm"; [ -f "$OUT/sglang.tar.xz.part-00" ] && ONLY="$ONLY sglang"; fi
MODE=build
case "${1:-}" in
  --list) MODE=list ;;
  --layout) MODE=layout ;;
  --force) MODE=force ;;
  "") ;;
  *) echo "build_all: unknown argument $1 (--list, --layout, --force)" >&2; exit 2 ;;
esac

SCRIPTS=${PACK_SCRIPTS:-scripts/gpu}  # the pack scripts' folder (tests put stand-ins there)
script_of() { case $1 in site) echo "$SCRIPTS/pack.sh" ;; vllm) echo "$SCRIPTS/pack_vllm.sh" ;;
  megatron) echo "$SCRIPTS/pack_megatron.sh" ;; sglang) echo "$SCRIPTS/pack_sglang.sh" ;; *) return 1 ;; esac; }
inputs_of() { case $1 in site) echo "$SCRIPTS/pack.sh requirements/cpu.lock" ;;
  vllm) echo "$SCRIPTS/pack_vllm.sh scripts/gpu/vllm_needs.txt" ;; megatron) echo "$SCRIPTS/pack_megatron.sh requirements/megatron-site.txt" ;;
  sglang) echo "$SCRIPTS/pack_sglang.sh scripts/gpu/sglang_needs.txt" ;; esac; }
# the files an archive is, in carry order (its manifest first)
files_of() {
  case $1 in
    site) echo "$OUT/MANIFEST.txt $OUT/site.tar.xz" ;;
    vllm) echo "$OUT/vllm.MANIFEST.txt"; ls "$OUT"/vllm.tar.xz.part-* 2>/dev/null || true ;;
    megatron) echo "$OUT/megatron.MANIFEST.txt $OUT/megatron.tar.xz" ;;
    sglang) echo "$OUT/sglang.MANIFEST.txt"; ls "$OUT"/sglang.tar.xz.part-* 2>/dev/null || true ;;
  esac
}
primary_of() { case $1 in site) echo site.tar.xz ;; vllm) echo vllm.tar.xz.part-00 ;; megatron) echo megatron.tar.xz ;;
  sglang) echo sglang.tar.xz.part-00 ;; esac; }
# built: every file there, from the inputs its script has now (their sha256, recorded in $OUT/BUILT.txt by the last
# build here); an archive built by its script alone (no record) counts as built: --force rebuilds it
inputs_hash() { cat $(inputs_of "$1") | sha256sum | cut -c1-16; }
state_of() {
  local name=$1 f recorded
  [ -f "$OUT/$(primary_of "$name")" ] || { echo missing; return; }
  for f in $(files_of "$name"); do [ -f "$f" ] || { echo missing; return; }; done
  recorded=$(awk -v n="$name" '$1 == n {print $2}' "$OUT/BUILT.txt" 2>/dev/null | tail -1)
  if [ -n "$recorded" ] && [ "$recorded" != "$(inputs_hash "$name")" ]; then echo stale; else echo built; fi
}
mib() { echo $(( ($1 + 1048575) / 1048576 )); }

for name in $ONLY; do script_of "$name" >/dev/null || { echo "build_all: unknown archive $name (site vllm megatron sglang)" >&2; exit 2; }; done
for name in $ONLY; do
  state=$(state_of "$name")
  if [ "$MODE" = list ]; then
    if [ "$state" = built ]; then
      bytes=0; n=0; for f in $(files_of "$name"); do bytes=$((bytes + $(stat -c %s "$f"))); n=$((n + 1)); done
      echo "build_all: $name: built ($n files, $(mib $bytes) MiB in $OUT) by $(script_of "$name")"
    else
      echo "build_all: $name: $state: would run bash $(script_of "$name")"
    fi
  elif [ "$MODE" = force ] || { [ "$MODE" = build ] && [ "$state" != built ]; }; then
    echo "build_all: $name: $state: bash $(script_of "$name")"
    start=$(date +%s)
    # built aside and moved in: a new file under each name, so the hard links of an earlier layout (a staging in
    # progress) keep the bytes STAGING.txt names
    rm -rf "$OUT/.building-$name" && mkdir -p "$OUT/.building-$name"
    PACK_OUT=$OUT/.building-$name bash "$(script_of "$name")"
    # an archive in parts: the old parts go, so that a rebuild in fewer parts leaves none behind
    case $name in vllm|sglang) rm -f "$OUT/$name".tar.xz.part-* ;; esac
    mv -f "$OUT/.building-$name"/* "$OUT/" && rmdir "$OUT/.building-$name"
    echo "$name $(inputs_hash "$name") $(date -u +%Y-%m-%dT%H:%M:%SZ)" >>"$OUT/BUILT.txt"
    echo "build_all: $name: built in $(( $(date +%s) - start )) s"
  elif [ "$state" != built ]; then
    echo "build_all: $name: $state (--layout builds nothing): run bash scripts/gpu/build_all.sh first" >&2; exit 1
  fi
done

# the carry plan: files in order, a new folder whenever the next file would pass the limit
tree=$(git ls-files -co --exclude-standard -z 2>/dev/null | du -cb --files0-from=- 2>/dev/null | tail -1 | cut -f1)
limit=$(( ${STAGE_MB:-0} > 0 ? ${STAGE_MB:-0} * 1048576 : 64 * 1048576 - ${tree:-0} - 1048576 ))
plan=(); folder=0; used=0
for name in $ONLY; do
  for f in $(files_of "$name"); do
    [ -f "$f" ] || { [ "$MODE" = list ] && continue; echo "build_all: $f is missing" >&2; exit 1; }
    size=$(stat -c %s "$f")
    [ "$size" -le "$limit" ] || { echo "build_all: $f is $(mib "$size") MiB, over the $(mib "$limit") MiB a call" \
      "carries beside the working tree; rebuild it in smaller parts (PART_MB)" >&2; exit 1; }
    if [ $((used + size)) -gt "$limit" ]; then folder=$((folder + 1)); used=0; fi
    used=$((used + size)); plan+=("$folder $size $f")
  done
done
[ ${#plan[@]} -gt 0 ] || { echo "build_all: nothing built yet to carry (bash scripts/gpu/build_all.sh builds it)"; exit 0; }
folders=$((folder + 1))
echo "build_all: carry $folders folders, one a call (the working tree adds $(mib "${tree:-0}") MiB; at most" \
  "$(mib "$limit") MiB a folder):"
for k in $(seq 0 $((folders - 1))); do
  names=""; bytes=0
  for entry in "${plan[@]}"; do
    read -r fk size f <<<"$entry"
    [ "$fk" = "$k" ] && { names="$names $(basename "$f")"; bytes=$((bytes + size)); }
  done
  echo "  .gpu-stage$k  $(mib $bytes) MiB:$names"
done
[ "$MODE" = list ] && exit 0

rm -rf "$ROOT_OUT"/.gpu-stage[0-9]*
for k in $(seq 0 $((folders - 1))); do mkdir -p "$ROOT_OUT/.gpu-stage$k"; done
staging=$ROOT_OUT/.gpu-stage0/STAGING.txt
echo "# scripts/gpu/build_all.sh, $(date -u +%Y-%m-%dT%H:%M:%SZ): sha256 bytes file folder" >"$staging"
for entry in "${plan[@]}"; do
  read -r fk size f <<<"$entry"
  ln -f "$f" "$ROOT_OUT/.gpu-stage$fk/" 2>/dev/null || cp -f "$f" "$ROOT_OUT/.gpu-stage$fk/"
  echo "$(sha256sum "$f" | cut -d' ' -f1) $size $(basename "$f") .gpu-stage$fk" >>"$staging"
done
cp -f "$staging" "$OUT/STAGING.txt"
echo "build_all: laid out in $ROOT_OUT/.gpu-stage0 .. .gpu-stage$((folders - 1)). On the GPU machine, back to back:"
echo "  run(command=\"bash scripts/gpu/stage_parts.sh\", carry=[\".gpu-stageK\"])   for K = 0 .. $((folders - 1))"
