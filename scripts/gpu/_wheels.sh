# Sourced by pack.sh, pack_vllm.sh and pack_megatron.sh: unpack downloaded wheels into one site-packages folder.
#
#   unpack_wheels WHEELS SITE WHO SPEC...   # each NAME==VERSION's wheel from WHEELS, unzipped into SITE
#
# A wheel is a zip of its site-packages entries: unzip keeps the executable bits (Ray's raylet, gcs_server). Its
# *.data/purelib|platlib entries belong to site-packages itself and are moved there. A spec without its wheel in
# WHEELS stops the caller: "WHO: no wheel for SPEC in WHEELS", exit 1.
unpack_wheels() {
  local wheels=$1 site=$2 who=$3 spec name version stem wheel data lib
  shift 3
  for spec in "$@"; do
    name=${spec%%==*}; version=${spec##*==}
    # a wheel's file name writes the project's - as _, and . as _ or . (older wheels: zope.interface-7.2-...)
    stem=$(echo "$name" | tr 'A-Z' 'a-z' | sed 's/[-_.]/[-_.]/g')
    # awk reads the whole listing (no early exit): under pipefail an early exit can kill ls with SIGPIPE
    wheel=$(ls "$wheels" | awk -v s="$stem" -v v="$version" '!found && tolower($0) ~ "^"s"-"v"-" {print; found = 1}')
    [ -n "$wheel" ] || { echo "$who: no wheel for $spec in $wheels" >&2; exit 1; }
    unzip -q -o "$wheels/$wheel" -d "$site"
  done
  for data in "$site"/*.data; do
    [ -d "$data" ] || continue
    for lib in purelib platlib; do [ -d "$data/$lib" ] && cp -a "$data/$lib/." "$site/"; done
    rm -rf "$data"
  done
}
