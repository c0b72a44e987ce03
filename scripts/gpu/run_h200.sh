#!/usr/bin/env bash
# The three GPU benchmarks in one go, as run for docs/performance.md ("On one H200").
#
#   bash scripts/gpu/run_h200.sh OUTDIR        # default OUTDIR: $OUT if set, else runs/gpu
#   PARTS="dynamic" bash scripts/gpu/run_h200.sh OUTDIR   # only some of: handoff dynamic (default both)
#
# Needs one CUDA GPU with ~70 GB free, torch, transformers; verl 0.9.1 (+ Ray importable) for the dynamic-batch
# benchmark. On a machine without them, put the packages in .whl/ (ignored by git):
#   .whl/*.tar.xz      verl 0.9.1 and what it imports that the machine lacks (ray 2.60 without jars/,
#                      dashboard/client/, rllib/, llm/ and its gcs/raylet binaries: import only, no cluster;
#                      pydantic, fastapi, uvicorn, ...), unpacked into /tmp/site and put first on PYTHONPATH;
#   .whl/tf/*.whl      transformers 5.10.4 + tokenizers 0.22.2 (the versions the pack is tested with), used only
#                      if the dynamic-batch run fails with the machine's own transformers.
set -u -o pipefail
OUTDIR=${1:-${OUT:-runs/gpu}}
mkdir -p "$OUTDIR"
export PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
PY=${PYTHON:-python3}
PARTS=${PARTS:-handoff dynamic}
if ls .whl/*.tar.xz >/dev/null 2>&1; then
  mkdir -p /tmp/site && for t in .whl/*.tar.xz; do tar xJf "$t" -C /tmp/site; done
  export PYTHONPATH=/tmp/site:$PWD${PYTHONPATH:+:$PYTHONPATH}
else
  export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
fi
{
  date -u
  nvidia-smi --query-gpu=name,memory.total,memory.used,clocks.sm,clocks.mem,driver_version --format=csv
  $PY -c "import torch, transformers; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'transformers', transformers.__version__)"
  $PY -c "import verl, ray; print('verl', verl.__version__, 'ray', ray.__version__)" 2>&1 | tail -1
} 2>&1 | tee "$OUTDIR/env.txt"

case " $PARTS " in *" handoff "*)
  for model in qwen2_7b llama3_1_8b; do
    $PY scripts/gpu/bench_handoff.py --model "$model" --json "$OUTDIR/handoff_$model.json" 2>&1 | tee -a "$OUTDIR/handoff.log"
  done ;;
esac

dynamic() { $PY scripts/gpu/bench_dynamic_batch.py --json "$OUTDIR/dynamic_batch.json" "$@" 2>&1 | tee -a "$OUTDIR/dynamic.log"; }
case " $PARTS " in *" dynamic "*) ;; *) dynamic() { true; } ;; esac
if ! dynamic; then
  echo "=== dynamic batch failed with the machine's transformers; again with transformers 5.10.4 ===" | tee -a "$OUTDIR/dynamic.log"
  if ls .whl/tf/*.whl >/dev/null 2>&1; then
    $PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site_tf .whl/tf/*.whl
    PYTHONPATH=/tmp/site_tf:$PYTHONPATH dynamic || dynamic --no-torch-compile
  else
    dynamic --no-torch-compile
  fi
fi

$PY scripts/gpu/plan_accuracy.py --handoff "$OUTDIR"/handoff_*.json --dynamic "$OUTDIR/dynamic_batch.json" \
  --json "$OUTDIR/plan_accuracy.json"
