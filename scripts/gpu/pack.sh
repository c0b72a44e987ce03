#!/usr/bin/env bash
# Build, on a CPU machine with PyPI access, the Python packages that a GPU machine without internet lacks for the
# end-to-end recipe runs (scripts/gpu/run_h200_e2e.sh): one xz tarball of a site folder, under 64 MiB.
#
#   bash scripts/gpu/pack.sh            # -> .gpu-packages/site.tar.xz and .gpu-packages/MANIFEST.txt (.gpu-packages/ is git-ignored)
#   PACK_OUT=dir bash scripts/gpu/pack.sh
#
# What goes in (wheels for CPython 3.12 / manylinux x86-64, the GPU image's Python, at the versions of
# requirements/cpu.lock):
#   - Ray 2.60 with its raylet and gcs_server binaries (a real local cluster), without jars/, the dashboard's web
#     client, rllib, serve, tune, train, data, llm; with the dashboard's Python dependencies (as ray[default]
#     installs them, so Ray starts its dashboard agent as on the CPU machines) except py-spy and virtualenv;
#   - verl 0.9.1 and what its trainer imports that the GPU image lacks (hydra-core, omegaconf, antlr4, tensordict,
#     codetiming, datasets, TransferQueue, pyzmq, msgspec, fastapi/uvicorn/pydantic, ...);
#   - the pack's own package metadata (klppo_recipes.dist-info with verl's `verl.plugins` entry point): the pack's
#     code itself travels with the checkout and is put on PYTHONPATH by the runner.
# Not carried: torch, transformers, tokenizers, numpy, pandas, pyarrow, accelerate, peft and the rest of the GPU
# image's own packages, used as they are there (docs/gpu_e2e.md lists the versions that differ from cpu.lock).
set -euo pipefail
cd "$(dirname "$0")/../.."
OUT=${PACK_OUT:-.gpu-packages}
WORK=${PACK_WORK:-build/gpu-packages}
PY=${PYTHON:-python3}
. scripts/gpu/_wheels.sh  # unpack_wheels
LOCK=requirements/cpu.lock
mkdir -p "$OUT" "$WORK/wheels"
rm -rf "$WORK/site" && mkdir -p "$WORK/site"

# name (as in cpu.lock) of every package carried; the version comes from the lock
PACKAGES="
ray verl
hydra-core omegaconf antlr4-python3-runtime
tensordict pyvers orjson importlib-metadata lazy-importer
codetiming datasets dill multiprocess torchdata pylatexenc
transferqueue pyzmq msgspec cachetools
fastapi starlette uvicorn pydantic pydantic-core annotated-types typing-inspection sniffio
jsonschema jsonschema-specifications referencing rpds-py
aiohttp-cors colorful smart-open
opencensus opencensus-context proto-plus google-api-core google-auth googleapis-common-protos
pyasn1 pyasn1-modules cryptography cffi pycparser
opentelemetry-api opentelemetry-sdk opentelemetry-proto opentelemetry-semantic-conventions
opentelemetry-exporter-prometheus opentelemetry-exporter-otlp-proto-common opentelemetry-exporter-otlp-proto-http
opentelemetry-exporter-http-transport opentelemetry-exporter-otlp-common
"
specs=()
for name in $PACKAGES; do
  version=$(grep -i "^${name}==" "$LOCK" | head -1 | cut -d= -f3)
  [ -n "$version" ] || { echo "pack.sh: $name is not in $LOCK" >&2; exit 1; }
  specs+=("$name==$version")
done

# antlr4-python3-runtime 4.9.3 (hydra-core's pin) is published as source only: a pure-Python wheel built here
antlr=$(printf '%s\n' "${specs[@]}" | grep '^antlr4-python3-runtime==')
ls "$WORK"/wheels/antlr4_python3_runtime-"${antlr##*==}"-*.whl >/dev/null 2>&1 ||
  "$PY" -m pip wheel -q --no-deps --no-build-isolation -w "$WORK/wheels" "$antlr"
others=(); for spec in "${specs[@]}"; do [ "$spec" = "$antlr" ] || others+=("$spec"); done
# wheels for the GPU image's interpreter (CPython 3.12, x86-64 Linux); cached in $WORK/wheels
"$PY" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_24_x86_64 \
  --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 --platform manylinux1_x86_64 \
  -d "$WORK/wheels" "${others[@]}" 2>&1 | grep -v "^WARNING: Location" || true

unpack_wheels "$WORK/wheels" "$WORK/site" pack.sh "${specs[@]}"

# Ray: a real local cluster needs _raylet.so, core/src/ray/{raylet,gcs}; none of these parts
( cd "$WORK/site/ray" && rm -rf jars dashboard/client rllib serve tune train data llm )
# the dashboard's head refuses to start without its web client's build folder, and ray.init then waits 60 s for it:
# an empty build (a placeholder page, an empty static/) keeps the dashboard and its API up without the web UI
mkdir -p "$WORK/site/ray/dashboard/client/build/static"
echo '<!doctype html><title>Ray</title><p>The dashboard web client is not installed (scripts/gpu/pack.sh).</p>' \
  >"$WORK/site/ray/dashboard/client/build/index.html"
find "$WORK/site" -name __pycache__ -type d -prune -exec rm -rf {} +
test -x "$WORK/site/ray/core/src/ray/raylet/raylet" && test -x "$WORK/site/ray/core/src/ray/gcs/gcs_server"

# the pack's metadata: verl finds its plugin through the `verl.plugins` entry point of an installed distribution
pack_version=$(sed -n 's/^version = "\(.*\)"/\1/p' pyproject.toml | head -1)
info="$WORK/site/klppo_recipes-${pack_version}.dist-info"
mkdir -p "$info"
printf 'Metadata-Version: 2.1\nName: klppo-recipes\nVersion: %s\n' "$pack_version" >"$info/METADATA"
printf '[verl.plugins]\nklppo = recipes.verl_ext.plugin\n' >"$info/entry_points.txt"
: >"$info/RECORD"

{
  echo "# scripts/gpu/pack.sh, $(date -u +%Y-%m-%dT%H:%M:%SZ): CPython 3.12 manylinux x86-64 wheels, unpacked into site/"
  printf '%s\n' "${specs[@]}"
  echo "klppo-recipes==$pack_version (metadata only; the code travels with the checkout)"
} >"$OUT/MANIFEST.txt"
tar -C "$WORK" -cf - site | xz -"${XZ_LEVEL:-1}" -T2 >"$OUT/site.tar.xz"
size=$(stat -c %s "$OUT/site.tar.xz")
echo "pack.sh: $OUT/site.tar.xz $((size / 1024 / 1024)) MiB ($(du -sm "$WORK/site" | cut -f1) MiB unpacked), ${#specs[@]} packages"
[ "$size" -lt $((60 * 1024 * 1024)) ] || { echo "pack.sh: over 60 MiB" >&2; exit 1; }
