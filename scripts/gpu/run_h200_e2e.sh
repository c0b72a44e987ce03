#!/usr/bin/env bash
# Both recipes end to end on one CUDA GPU, as a user types them, with a resume from a checkpoint; figures per run.
#
#   bash scripts/gpu/run_h200_e2e.sh OUTDIR          # default OUTDIR: runs/gpu_e2e
#   PARTS="grpo grpo_resume kl_ppo kl_ppo_resume batching qwen05b" bash scripts/gpu/run_h200_e2e.sh OUTDIR
#   STEPS=20 SAVE=10 EXTRA="key=value ..." bash scripts/gpu/run_h200_e2e.sh OUTDIR   # EXTRA replaces the default
#   KL=ramp (the kl group of every run; default adaptive, so that a resume has a controller state to restore)
#   RUN_TIMEOUT=420 (s per run; measured 2026-12-01: ~55 s Ray + TaskRunner start, ~35 s first step, ~4 s a step)
#
# Each run is `python -m recipes.<recipe> cluster.gpus_per_node=1 parallel=tp1 rollout=hf model=tiny task=tiny
# kl=adaptive trainer.total_training_steps=STEPS trainer.save_freq=SAVE` (the card's cluster preset picked by the
# pack): verl 0.9.1's default
# (v1) trainer through the pack's stability trainer, Ray started by the recipe, FSDP2 over NCCL, the hf rollout fed
# through the hybrid_engine resharder. The resumed runs repeat the command with trainer.resume_mode=resume_path and
# trainer.resume_from_path=<first run>/checkpoints/global_step_SAVE: they continue at step SAVE+1 to STEPS with the
# KL controller's saved state. Parts:
#   grpo, grpo_resume, kl_ppo, kl_ppo_resume   the tiny model and task (default PARTS)
#   batching    GRPO with batching=fixed, then batching=dynamic, same everything else (BATCHING_MODEL=qwen2_5_0_5b:
#               that model instead of the tiny one); batching_fixed or batching_dynamic: that arm alone
#   qwen05b     GRPO with model=qwen2_5_0_5b (random weights of the shipped architecture) for speed
#   compare_vllm, compare_sglang, compare_hf   that GRPO run with one engine each (grpo_qwen05b_ENGINE); compare: vllm
#               and hf. Run compare_sglang with ROLLOUT=sglang and compare_vllm without it: each engine's site
#
# Needs one CUDA GPU, torch and transformers. Where Ray, verl and the rest are missing (a GPU machine without
# internet), scripts/gpu/pack.sh builds them on a CPU machine into .gpu-packages/site.tar.xz; copy it beside the checkout and
# this script unpacks it to $E2E_WORK/site and puts it first on PYTHONPATH.
#
# OUTDIR gets: env.txt (GPU, driver, Python and package versions), e2e.log (every run's output), summary.json
# (the figures of every run, scripts/gpu/e2e_figures.py; per resumed recipe, scripts/gpu/e2e_resume_check.py's
# verdict: step numbering, the KL controller's state read back, the first run's reward margin), runs.tar.gz (each run's metrics.jsonl,
# resolved_config.yaml, figures JSON, log, kl_control.json of its checkpoints).
set -u -o pipefail
OUTDIR=$(mkdir -p "${1:-runs/gpu_e2e}" && cd "${1:-runs/gpu_e2e}" && pwd)
cd "$(dirname "$0")/../.."
WORK=${E2E_WORK:-/tmp/klppo_e2e}
STEPS=${STEPS:-20}
SAVE=${SAVE:-10}
PARTS=${PARTS:-grpo grpo_resume kl_ppo kl_ppo_resume}
RUN_TIMEOUT=${RUN_TIMEOUT:-420}
PY=${PYTHON:-python3}
# What the H200 runs add to the user command (docs/gpu_e2e.md): one agent-loop, reward and data-loader worker each
# (verl's 8 + 8 each import verl: about a minute of start-up on 16 cores for a model that needs none of them).
# Where flash-attn is not installed the plugin runs the recipes' default remove-padding batches with pack_varlen
# (recipes/verl_ext/plugin/varlen_attention.py); ATTENTION=sdpa instead adds padded batches with sdpa (the first
# 2026-12-01 runs, before that fallback existed).
SMALL_WORKERS="reward.num_workers=1 actor_rollout_ref.rollout.agent.num_workers=1 data.dataloader_num_workers=0"
SDPA="actor_rollout_ref.model.use_remove_padding=false ++actor_rollout_ref.model.override_config.attn_implementation=sdpa \
critic.model.use_remove_padding=false ++critic.model.override_config.attn_implementation=sdpa"
if [ -z "${EXTRA+x}" ]; then
  EXTRA=$SMALL_WORKERS
  [ "${ATTENTION:-}" = sdpa ] && EXTRA="$EXTRA $SDPA"
fi
read -r -a EXTRA_ARGS <<<"$EXTRA"
mkdir -p "$WORK/runs" "$WORK/figures"
export PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false HYDRA_FULL_ERROR=1
export KLPPO_DATA_DIR=${KLPPO_DATA_DIR:-$WORK/data}
# vLLM's own lines (its KV-cache size, CUDA graphs, sleep and wake) at INFO: verl sets WARN for its workers only where
# the launching shell leaves VLLM_LOGGING_LEVEL unset (verl/trainer/constants_ppo.py), and the workers inherit this
VLLM_LOGGING_LEVEL=${VLLM_LOGGING_LEVEL:-INFO}; export VLLM_LOGGING_LEVEL
if ! $PY -c "import verl, ray, hydra" 2>/dev/null && [ -f .gpu-packages/site.tar.xz ]; then
  [ -d "$WORK/site/verl" ] || xz -dc -T0 .gpu-packages/site.tar.xz | tar -xf - -C "$WORK"
fi
[ -d "$WORK/site/verl" ] && export PYTHONPATH=$WORK/site${PYTHONPATH:+:$PYTHONPATH}
# vLLM and its needs (scripts/gpu/pack_vllm.sh, staged by scripts/gpu/stage_parts.sh), before pack.sh's site; for
# ROLLOUT=sglang SGLang's site instead (scripts/gpu/pack_sglang.sh): its pins (transformers 5.8.1, xgrammar, openai)
# are not vLLM's, so vLLM's site stays off the path
if [ "${ROLLOUT:-}" = sglang ]; then
  [ -d "$WORK/sglang_site/sglang" ] && export PYTHONPATH=$WORK/sglang_site:$PYTHONPATH
else
  [ -d "$WORK/vllm_site/vllm" ] && export PYTHONPATH=$WORK/vllm_site:$PYTHONPATH
fi
export PYTHONPATH=$PWD:$PYTHONPATH
LOG=$OUTDIR/e2e.log

{
  date -u +%Y-%m-%dT%H:%M:%SZ
  # a copied checkout may carry a stale .git: the code that ran is named by the hash of its files (the same command
  # on the machine the checkout came from gives the same hash); COMMIT=... names the commit where the caller knows it
  echo "commit ${COMMIT:-$(git rev-parse HEAD 2>/dev/null)} (as recorded)"
  echo "code $(find recipes hybrid_engine conf scripts -type f \( -name '*.py' -o -name '*.yaml' -o -name '*.sh' \) \
    | LC_ALL=C sort | xargs sha1sum | sha1sum | cut -c1-12) (sha1 of recipes/ hybrid_engine/ conf/ scripts/ files)"
  nvidia-smi --query-gpu=name,memory.total,memory.used,clocks.sm,clocks.mem,driver_version --format=csv
  $PY -c "import sys, torch, transformers, ray, verl; print(sys.version.split()[0], 'torch', torch.__version__, \
'cuda', torch.version.cuda, 'transformers', transformers.__version__, 'ray', ray.__version__, 'verl', verl.__version__)"
  $PY -c "import flash_attn" 2>&1 | tail -1
  $PY -c "import vllm; print('vllm', vllm.__version__)" 2>&1 | tail -1
  $PY -m pip list --format=freeze 2>/dev/null
} >"$OUTDIR/env.txt" 2>&1
head -6 "$OUTDIR/env.txt"

ROLLOUT=${ROLLOUT:-hf}
# no cluster=: on a GPU machine the pack takes the preset of the card it finds (recipes/compose/defaults.py,
# machine_cluster: "GPU found: ... cluster=h100_80g"); CLUSTER= names one
COMMON=(${CLUSTER:+cluster=$CLUSTER} cluster.gpus_per_node=1 parallel=tp1 rollout=$ROLLOUT model=tiny task=tiny
  kl=${KL:-adaptive})
# SGLang's own lines (its KV cache, CUDA graphs, weight loading) at info: verl 0.9.1 starts SGLang at log_level error
# (async_sglang_server.py) and lets engine_kwargs.sglang override it; the 2026-12-07 H100 runs had none of them
[ "$ROLLOUT" = sglang ] && COMMON+=(+actor_rollout_ref.rollout.engine_kwargs.sglang.log_level=info)

diagnose() {
  echo "##### $1 after ${DIAG_AFTER}s: ray status"; timeout 20 $PY -m ray.scripts.scripts status 2>&1 | tail -40
  echo "##### processes"; ps -eo pid,etimes,pcpu,rss,args --sort=-pcpu | cut -c1-200 | head -30
  echo "##### nvidia-smi"; nvidia-smi --query-gpu=memory.used,utilization.gpu --format=csv
  echo "##### verl.log"; tail -80 "$2/verl.log" 2>/dev/null | cut -c1-400
  for f in /tmp/ray/session_latest/logs/raylet.out /tmp/ray/session_latest/logs/gcs_server.out; do
    echo "##### $f"; grep -i -E "infeasible|pending|error|warn" "$f" 2>/dev/null | tail -15 | cut -c1-300
  done
  for f in $(ls -t /tmp/ray/session_latest/logs/*.err 2>/dev/null | head -12); do
    [ -s "$f" ] && { echo "##### $f"; tail -12 "$f" | cut -c1-300; }
  done
}

# run NAME RECIPE ARGS...: one recipe run in $WORK/runs/NAME, its figures in $WORK/figures/NAME.json
run() {
  local name=$1 recipe=$2; shift 2
  local dir=$WORK/runs/$name start end rc
  echo "=== $name: python -m recipes.$recipe $* ${EXTRA_ARGS[*]} hydra.run.dir=$dir ===" | tee -a "$LOG"
  start=$(date +%s.%N)
  if [ -n "${FAILED:-}" ] && [ -n "${FAIL_FAST:-}" ]; then echo "=== $name: skipped (FAIL_FAST after $FAILED) ===" | tee -a "$LOG"; return 1; fi
  mkdir -p "$dir"
  # the GPU's memory in use every 0.5 s while the run lasts (the whole device: the actor and vLLM share it)
  nvidia-smi --query-gpu=timestamp,memory.used --format=csv,noheader,nounits -lms 500 >"$WORK/$name.gpu_mem.csv" 2>/dev/null &
  local smi=$!
  timeout "$RUN_TIMEOUT" $PY -m recipes."$recipe" "$@" "${EXTRA_ARGS[@]}" hydra.run.dir="$dir" >"$WORK/$name.log" 2>&1 &
  local pid=$! waited=0
  # a run that outlasts DIAG_AFTER seconds: Ray's view of its resources and processes, once, into OUTDIR/debug.txt
  while kill -0 $pid 2>/dev/null; do
    sleep 2; waited=$((waited + 2))
    if [ "$waited" -eq "${DIAG_AFTER:-0}" ]; then diagnose "$name" "$dir" >>"$OUTDIR/debug.txt" 2>&1; fi
  done
  wait $pid
  rc=$?
  end=$(date +%s.%N)
  kill $smi 2>/dev/null; cp "$WORK/$name.gpu_mem.csv" "$dir/gpu_mem.csv" 2>/dev/null
  # what the rollout engine said of its memory, its compile and its weight loading (Ray's worker logs)
  grep -h -a -E "KV cache|KV Cache is allocated|max_total_num_tokens|Capture cuda graph end|Load weight end|Model loading took|model weights took|Memory profiling|memory profiling|CUDA graph|torch.compile|sleep mode|Sleep mode|woke up|gpu_memory_utilization|Available KV|maximum concurrency|Using .* backend|update_weights" \
    /tmp/ray/session_latest/logs/*.out /tmp/ray/session_latest/logs/*.err "$dir/verl.log" 2>/dev/null | cut -c1-400 | sort -u >"$dir/engine_lines.txt"
  [ "$rc" -eq 0 ] || FAILED=${FAILED:-$name}
  grep -v -E "^\s*$" "$WORK/$name.log" | tail -40 >>"$LOG"
  echo "=== $name: exit $rc, $(awk "BEGIN{print $end - $start}") s ===" | tee -a "$LOG"
  mkdir -p "$dir" && cp "$WORK/$name.log" "$dir/run.log"
  [ "$rc" -eq 0 ] || { echo "--- $name: verl.log, last lines"; tail -60 "$dir/verl.log" 2>/dev/null | cut -c1-400; } >>"$LOG"
  $PY scripts/gpu/e2e_figures.py "$dir" --name "$name" --json "$WORK/figures/$name.json" --log "$WORK/$name.log" \
    --wall-s "$(awk "BEGIN{print $end - $start}")" 2>&1 | tee -a "$LOG"
  return $rc
}
has() { case " $PARTS " in *" $1 "*) return 0 ;; esac; return 1; }
# model_args NAME: the model group and, for a shipped architecture other than tiny (built by the recipe itself), a
# local folder of it with random weights (scripts/gpu/random_model.py: no model hub here)
model_args() {
  if [ "$1" = tiny ]; then echo "model=tiny"; return; fi
  local dir
  dir=$($PY scripts/gpu/random_model.py "$1" "$WORK/models/$1" 2>>"$LOG" | tail -1) || return 1
  echo "model=$1 actor_rollout_ref.model.path=$dir"
}
base() { echo "${COMMON[@]}" trainer.total_training_steps="$STEPS" trainer.save_freq="$SAVE"; }
resume_args() {
  echo trainer.resume_mode=resume_path trainer.resume_from_path="$WORK/runs/$1/checkpoints/global_step_$SAVE"
}

for recipe in grpo kl_ppo; do
  if has $recipe; then
    # shellcheck disable=SC2046
    run $recipe $recipe $(base)
  fi
  if has ${recipe}_resume; then
    # shellcheck disable=SC2046
    run ${recipe}_resume $recipe $(base) $(resume_args $recipe)
    # steps SAVE+1.. and the KL controller's saved state read back; the first run's reward margin
    $PY scripts/gpu/e2e_resume_check.py "$WORK/runs/$recipe" "$WORK/runs/${recipe}_resume" --save-step "$SAVE" \
      --json "$WORK/figures/${recipe}_resume_check.json" 2>&1 | tee -a "$LOG"
  fi
done
for mode in fixed dynamic; do
  if has batching || has batching_$mode; then
    # shellcheck disable=SC2046
    run grpo_batching_$mode grpo $(base | sed "s#model=tiny#$(model_args "${BATCHING_MODEL:-tiny}")#") \
      batching=$mode trainer.save_freq=-1
  fi
done
# the 0.5B shape with each engine, same everything else (runs grpo_qwen05b_ENGINE): compare = vllm and hf; compare_sglang
# alone, with ROLLOUT=sglang (SGLang's site on the path instead of vLLM's), beside compare_vllm in a second invocation
for engine in vllm sglang hf; do
  if { [ "$engine" != sglang ] && has compare; } || has compare_$engine; then
    # shellcheck disable=SC2046
    run grpo_qwen05b_$engine grpo $(base | sed "s#model=tiny#$(model_args qwen2_5_0_5b)#; s#rollout=[a-z]*#rollout=$engine#") \
      trainer.save_freq=-1 ${QWEN_ARGS:-}
  fi
done
if has kl_ppo_qwen05b; then
  # shellcheck disable=SC2046
  run kl_ppo_qwen05b kl_ppo $(base | sed "s#model=tiny#$(model_args qwen2_5_0_5b)#") trainer.save_freq=-1 ${QWEN_ARGS:-}
fi
if has qwen05b; then
  # shellcheck disable=SC2046
  run grpo_qwen05b grpo $(base | sed "s#model=tiny#$(model_args qwen2_5_0_5b)#") trainer.save_freq=-1 ${QWEN_ARGS:-}
fi

$PY - "$WORK/figures" "$OUTDIR/summary.json" <<'EOF'
import json, sys
from pathlib import Path
runs = {p.stem: json.loads(p.read_text()) for p in sorted(Path(sys.argv[1]).glob("*.json"))}
for fig in runs.values():
    fig.pop("per_step", None)
Path(sys.argv[2]).write_text(json.dumps(runs, indent=1, sort_keys=True))
EOF
# every run's record, without the checkpoints' weights
(cd "$WORK" && tar -czf "$OUTDIR/runs.tar.gz" figures $(cd "$WORK" && find runs -maxdepth 2 \( -name metrics.jsonl -o \
  -name resolved_config.yaml -o -name run.log -o -name verl.log -o -name weight_sync.jsonl -o -name bands.json \
  -o -name gpu_mem.csv -o -name engine_lines.txt \) ) \
  $(cd "$WORK" && find runs -path '*checkpoints/global_step_*/kl_control.json') 2>/dev/null)
ls -la "$OUTDIR"
