#!/usr/bin/env bash
# The pack side by side with verl on one GPU: one GRPO workload, three arms, one arm per call on one warm machine.
#
#   bash scripts/gpu/vs_verl.sh prep OUTDIR     # start building the models and the data (in the background, setsid)
#   bash scripts/gpu/vs_verl.sh verl OUTDIR     # a. verl 0.9.1's own main_ppo, its Qwen2-7B GRPO example's overrides
#   bash scripts/gpu/vs_verl.sh port OUTDIR     # b. the same overrides pasted into python -m recipes.grpo
#   bash scripts/gpu/vs_verl.sh portverl OUTDIR # b with the overrides its note prints to restore verl's values
#   bash scripts/gpu/vs_verl.sh pack OUTDIR     # c. python -m recipes.grpo with the pack's defaults for model and GPU
#   bash scripts/gpu/vs_verl.sh pack7b OUTDIR   # c on the Qwen2.5-7B shape (the source article's model class)
#   python scripts/gpu/vs_verl_summary.py OUTDIR --json summary.json   # the table, after the arms
#   CHECK=1 GPU_NAME=H100 bash scripts/gpu/vs_verl.sh ARM OUTDIR   # on a CPU machine: compose the arm's command only
#                                 (verl: --cfg job; the pack: action=validate), with the installed packages
#   ARM_EXTRA="key=value ..." bash scripts/gpu/vs_verl.sh ARM OUTDIR   # these overrides after the arm's own (a variant
#                                 of one arm, e.g. data.dataloader_num_workers=0; cmd.txt records it)
#
# The workload (every arm): the Qwen2.5-1.5B shape with random weights (scripts/gpu/random_model.py), 32 prompts of
# 128-480 tokens x 5 samples a step from scripts/gpu/vs_verl_data.py, responses up to 512 tokens (a random policy
# rarely samples its eos: nearly every response runs to 512), 4 PPO mini-batches a step, STEPS steps (default 6: the
# first and 5 steady ones), no validation, no checkpoint. Arm a runs verl with the pack off its path: its own
# interpreter path holds Ray, verl and vLLM from the staged sites (scripts/gpu/stage_parts.sh) less the pack's
# `verl.plugins` entry point, and its working folder is outside the checkout; env.txt records the entry points verl
# finds. verl's example (examples/grpo_trainer/run_qwen2-7b.sh) is changed where one GPU, this model and this machine
# force it, each listed in docs/vs_verl.md. The GPU is read from nvidia-smi (H100 or H200), never assumed: it names the
# pack's cluster preset and, for arms a and b, the fixed micro-batch the plan fits on that card.
#
# Each arm starts with cold compile caches of its own (vLLM, TorchInductor, Triton under WORK/cache/ARM), so that no
# arm starts faster for an earlier arm's compile. OUTDIR/ARM gets: cmd.txt (the command), run.log (its terminal),
# step_times.txt (wall-clock seconds since the command when each step's metrics line appeared), gpu_mem.csv (the
# device's memory every 0.5 s), engine_lines.txt (vLLM's memory, compile, graph and sleep lines), figures.json
# (scripts/gpu/e2e_figures.py plus the start-up times and peak memory) and raw.tar.gz (metrics.jsonl, verl.log, the
# resolved config).
set -u -o pipefail
ARM=${1:?usage: vs_verl.sh prep|verl|port|portverl|pack|pack7b OUTDIR}
OUTDIR=$(mkdir -p "${2:-runs/vs_verl}" && cd "${2:-runs/vs_verl}" && pwd)
cd "$(dirname "$0")/../.."
REPO=$PWD
WORK=${E2E_WORK:-/tmp/klppo_e2e}
PY=${PYTHON:-python3}
STEPS=${STEPS:-6}
RUN_TIMEOUT=${RUN_TIMEOUT:-540}
read -r -a ARM_EXTRA_ARGS <<<"${ARM_EXTRA:-}"
export PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false VLLM_LOGGING_LEVEL=${VLLM_LOGGING_LEVEL:-INFO}

# the staged packages (scripts/gpu/stage_parts.sh): vLLM's site first, then Ray/verl's
[ -d "$WORK/site/verl" ] && [ -d "$WORK/vllm_site/vllm" ] || [ -n "${CHECK:-}" ] ||
  { echo "vs_verl: packages not staged ($WORK/site, $WORK/vllm_site)"; [ "$ARM" = prep ] || exit 1; }
SITES=$WORK/vllm_site:$WORK/site
# the same sites without the pack's entry point, for plain verl
if [ -d "$WORK/site/verl" ] && [ ! -d "$WORK/site_plain" ]; then
  mkdir -p "$WORK/site_plain"
  for entry in "$WORK"/site/*; do
    case $(basename "$entry") in klppo_recipes-*) ;; *) ln -s "$entry" "$WORK/site_plain/" ;; esac
  done
fi

gpu_name=${GPU_NAME:-$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1)}
case $gpu_name in
  *H200*) CLUSTER=h200_141g; VERL_MICRO=40 ;;  # the example's 40 fits: the plan's peak 101.5 GiB of 141
  *H100*) CLUSTER=h100_80g; VERL_MICRO=20 ;;   # 40 does not: the plan's log-prob peak 101.5 GiB > 80; 20 divides the 40 a mini-batch holds
  *) [ "$ARM" = prep ] || { echo "vs_verl: no H100 or H200 here (nvidia-smi: '${gpu_name}')"; exit 1; } ;;
esac

model_dir() { echo "$WORK/models/$1"; }
DATA=$WORK/vs_verl_data

if [ "$ARM" = prep ]; then
  # models on the GPU (random init in seconds), then the data with the model's tokenizer; in a session of its own,
  # so that it goes on after this call returns while the next calls stage the packages
  mkdir -p "$WORK/models"
  export PYTHONPATH=$REPO:$WORK/site
  # PREP_MODELS: the shapes to build (pack7b needs qwen2_5_7b: about 15 GB on disk); the data takes the first's tokenizer
  models=${PREP_MODELS:-qwen2_5_1_5b}; first=${models%% *}
  build=""; for m in $models; do build="$build $PY scripts/gpu/random_model.py $m $(model_dir $m) && "; done
  setsid nohup bash -c "
    $PY scripts/gpu/random_model.py $first $(model_dir $first) &&
    $PY scripts/gpu/vs_verl_data.py $(model_dir $first) $DATA --train 512 --val 16 && $build true
  " >"$WORK/prep.log" 2>&1 </dev/null &
  echo "vs_verl: prep started on '${gpu_name}' (log $WORK/prep.log)"
  exit 0
fi

case $ARM in
  verl|port|portverl|pack) MODEL=qwen2_5_1_5b ;;
  pack7b) MODEL=qwen2_5_7b ;;
  *) echo "vs_verl: unknown arm '$ARM' (verl, port, portverl, pack, pack7b, prep)"; exit 2 ;;
esac
# CHECK: the shipped architecture stands in for the random-weight folder (validation reads its config.json)
# (the data files stay absent: validation notes a path that is not on this machine)
[ -n "${CHECK:-}" ] && mkdir -p "$(model_dir $MODEL)" && cp hybrid_engine/model_configs/$MODEL/config.json "$(model_dir $MODEL)/"
for _ in $( [ -n "${CHECK:-}" ] || seq 1 120); do  # prep may still be writing the model or the data
  [ -f "$(model_dir $MODEL)/config.json" ] && [ -f "$DATA/train.parquet" ] && break; sleep 2
done
[ -f "$(model_dir $MODEL)/config.json" ] && { [ -f "$DATA/train.parquet" ] || [ -n "${CHECK:-}" ]; } ||
  { echo "vs_verl: model or data missing"; tail -20 "$WORK/prep.log"; exit 1; }

# the workload: every arm
WORKLOAD=(
  data.train_files="$DATA/train.parquet" data.val_files="$DATA/val.parquet"
  data.train_batch_size=32 data.max_prompt_length=512 data.max_response_length=512
  actor_rollout_ref.model.path="$(model_dir $MODEL)" actor_rollout_ref.rollout.n=5
  actor_rollout_ref.actor.ppo_mini_batch_size=8
  reward.custom_reward_function.path="$REPO/recipes/verl_ext/demo/reward.py"
  reward.custom_reward_function.name=compute_score
  trainer.total_training_steps="$STEPS" trainer.val_before_train=False trainer.test_freq=-1
)
# verl's examples/grpo_trainer/run_qwen2-7b.sh, as changed for one GPU (docs/vs_verl.md lists each change)
VERL_EXAMPLE=(
  algorithm.adv_estimator=grpo data.filter_overlong_prompts=True data.truncation=error
  actor_rollout_ref.actor.optim.lr=1e-6
  actor_rollout_ref.model.use_remove_padding=False ++actor_rollout_ref.model.override_config.attn_implementation=sdpa
  actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=$VERL_MICRO
  actor_rollout_ref.actor.use_kl_loss=True actor_rollout_ref.actor.kl_loss_coef=0.001
  actor_rollout_ref.actor.kl_loss_type=low_var_kl actor_rollout_ref.actor.entropy_coeff=0
  actor_rollout_ref.model.enable_gradient_checkpointing=True
  actor_rollout_ref.actor.fsdp_config.param_offload=False actor_rollout_ref.actor.fsdp_config.optimizer_offload=False
  actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=$VERL_MICRO
  actor_rollout_ref.rollout.tensor_model_parallel_size=1 actor_rollout_ref.rollout.name=vllm
  actor_rollout_ref.rollout.gpu_memory_utilization=0.6
  actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=$VERL_MICRO actor_rollout_ref.ref.fsdp_config.param_offload=True
  algorithm.use_kl_in_reward=False trainer.critic_warmup=0
  trainer.logger='["console","file"]' trainer.project_name=verl_grpo_example_gsm8k
  trainer.experiment_name=qwen2_7b_function_rm trainer.n_gpus_per_node=1 trainer.nnodes=1
  trainer.save_freq=20 trainer.total_epochs=15
)

# pack7b: the plan's refusal of the 7B shape on one GPU proposes offload=full; with the host's memory known (read
# below, as cluster.host_memory_gib) FSDP2's CPU offload does not fit the host, and what fits the card is FSDP1's
# manual offload with AdamW's foreach temporary off (docs/vs_verl.md, "The 7B shape on one GPU")
HOST_GIB=${HOST_GIB:-$(awk '/MemTotal/ {printf "%d", $2 / 1048576}' /proc/meminfo)}
FIT_7B=(offload=full strategy=fsdp +actor_rollout_ref.actor.optim.override_optimizer_config.foreach=false
  cluster.host_memory_gib=$HOST_GIB)

# portverl: the port plus the overrides its start-up notes print to restore verl's values of the keys the example
# leaves unset (the checkpoint folder aside, which no step uses) and verl's own code where flash-attn is missing: verl's
# run through the pack's launcher (the plugin's sync check and early workers stay)
VERL_VALUES=(strategy=fsdp actor_rollout_ref.rollout.cudagraph_capture_sizes=null trainer.v1.trainer_mode=sync
  trainer.v1.sampler.sampler_kwargs.poll_interval=2.0 run.flash_attn_fallbacks=false)

if [ -n "${CHECK:-}" ]; then
  case $ARM in
    verl) cd "$WORK" && exec "$PY" -m verl.trainer.main_ppo "${VERL_EXAMPLE[@]}" "${WORKLOAD[@]}" "${ARM_EXTRA_ARGS[@]}" --cfg job ;;
    port) exec "$PY" -m recipes.grpo "${VERL_EXAMPLE[@]}" "${WORKLOAD[@]}" cluster=$CLUSTER "${ARM_EXTRA_ARGS[@]}" action=validate \
      hydra.run.dir="$WORK/check/$ARM" ;;
    portverl) exec "$PY" -m recipes.grpo "${VERL_EXAMPLE[@]}" "${WORKLOAD[@]}" cluster=$CLUSTER "${VERL_VALUES[@]}" \
      "${ARM_EXTRA_ARGS[@]}" action=validate \
      hydra.run.dir="$WORK/check/$ARM" ;;
    *) extra=(); [ "$ARM" = pack7b ] && extra=("${FIT_7B[@]}")
       exec "$PY" -m recipes.grpo cluster=$CLUSTER cluster.gpus_per_node=1 parallel=tp1 rollout=vllm model=$MODEL \
         kl=fixed "${WORKLOAD[@]}" "${extra[@]}" "${ARM_EXTRA_ARGS[@]}" action=validate hydra.run.dir="$WORK/check/$ARM" ;;
  esac
fi
dir=$OUTDIR/$ARM
run_dir=$WORK/runs/$ARM
rm -rf "$dir" "$run_dir" "$WORK/cache/$ARM"; mkdir -p "$dir" "$run_dir" "$WORK/cache/$ARM"
export VLLM_CACHE_ROOT=$WORK/cache/$ARM/vllm TORCHINDUCTOR_CACHE_DIR=$WORK/cache/$ARM/inductor \
  TRITON_CACHE_DIR=$WORK/cache/$ARM/triton
case $ARM in
  verl)
    cmd=("$PY" -m verl.trainer.main_ppo "${VERL_EXAMPLE[@]}" "${WORKLOAD[@]}")
    cwd=$run_dir
    export PYTHONPATH=$WORK/vllm_site:$WORK/site_plain VERL_FILE_LOGGER_PATH=$run_dir/metrics.jsonl ;;
  port|portverl)
    # the GPU's preset: without it the pack assumes h100_80g, and on an H200 refuses the example's micro-batch of 40
    cmd=("$PY" -m recipes.grpo "${VERL_EXAMPLE[@]}" "${WORKLOAD[@]}" cluster=$CLUSTER hydra.run.dir="$run_dir")
    [ "$ARM" = portverl ] && cmd+=("${VERL_VALUES[@]}")
    cwd=$REPO; export PYTHONPATH=$REPO:$SITES ;;
  pack|pack7b)
    cmd=("$PY" -m recipes.grpo cluster=$CLUSTER cluster.gpus_per_node=1 parallel=tp1 rollout=vllm model=$MODEL kl=fixed
         "${WORKLOAD[@]}" hydra.run.dir="$run_dir")
    [ "$ARM" = pack7b ] && cmd+=("${FIT_7B[@]}")
    cwd=$REPO; export PYTHONPATH=$REPO:$SITES ;;
esac
{
  date -u +%Y-%m-%dT%H:%M:%SZ
  echo "commit ${COMMIT:-$(git rev-parse HEAD 2>/dev/null)}"
  nvidia-smi --query-gpu=name,memory.total,memory.used,clocks.sm,clocks.mem,driver_version --format=csv
  (cd "$cwd" && $PY -c "import sys, torch, transformers, ray, verl, vllm; print(sys.version.split()[0], 'torch', \
torch.__version__, 'transformers', transformers.__version__, 'ray', ray.__version__, 'verl', verl.__version__, 'vllm', \
vllm.__version__); from importlib.metadata import entry_points; print('verl.plugins entry points:', \
[e.value for e in entry_points(group='verl.plugins')])" 2>&1 | tail -2)
} >"$dir/env.txt"
cmd+=("${ARM_EXTRA_ARGS[@]}")
printf '%q ' "${cmd[@]}" >"$dir/cmd.txt"; echo >>"$dir/cmd.txt"
cat "$dir/env.txt"; echo "=== $ARM on $CLUSTER: $(cat "$dir/cmd.txt")"

nvidia-smi --query-gpu=timestamp,memory.used --format=csv,noheader,nounits -lms 500 >"$dir/gpu_mem.csv" 2>/dev/null &
smi=$!
# the host's memory in use every second (MiB): offload=full keeps the states there
(while :; do echo "$(date +%s.%N), $(free -m | awk '/^Mem:/ {print $3}')"; sleep 1; done) >"$dir/host_mem.csv" &
hostmem=$!
start=$(date +%s.%N)
(cd "$cwd" && exec timeout "$RUN_TIMEOUT" "${cmd[@]}") >"$dir/run.log" 2>&1 &
pid=$!
# the wall clock at which each step's metrics line lands (verl's file logger writes one line a step)
metrics=$run_dir/metrics.jsonl seen=0
while kill -0 $pid 2>/dev/null; do
  sleep 0.5
  n=$( [ -f "$metrics" ] && grep -c . "$metrics" || echo 0)
  if [ "$n" != "$seen" ]; then echo "$n $(awk "BEGIN{print $(date +%s.%N) - $start}")" >>"$dir/step_times.txt"; seen=$n; fi
done
wait $pid; rc=$?
end=$(date +%s.%N)
kill $smi $hostmem 2>/dev/null
(cd "$cwd" && $PY -m ray.scripts.scripts stop --force >/dev/null 2>&1)
grep -h -a -E "KV cache|Model loading took|model weights took|Memory profiling|memory profiling|CUDA graph|cudagraph|torch.compile|compil|sleep mode|Sleep mode|woke up|wake|gpu_memory_utilization|Available KV|maximum concurrency|Using .* backend|update_weights|Graph capturing" \
  /tmp/ray/session_latest/logs/*.out /tmp/ray/session_latest/logs/*.err "$run_dir/verl.log" "$dir/run.log" 2>/dev/null |
  cut -c1-400 | sort -u >"$dir/engine_lines.txt"
echo "=== $ARM: exit $rc, $(awk "BEGIN{print $end - $start}") s"
tail -25 "$dir/run.log"
$PY scripts/gpu/vs_verl_figures.py "$run_dir" "$dir" --arm "$ARM" --gpu "$gpu_name" --cluster "$CLUSTER" \
  --wall-s "$(awk "BEGIN{print $end - $start}")" --exit "$rc"
(cd "$run_dir" && tar -czf "$dir/raw.tar.gz" $(ls metrics.jsonl verl.log resolved_config.yaml weight_sync.jsonl bands.json \
  .hydra/config.yaml 2>/dev/null))
exit $rc
