#!/usr/bin/env bash
# Start the head node of a Ray cluster for the recipes; then run scripts/ray_worker.sh HEAD_IP:PORT on every other node.
#   scripts/ray_head.sh                              # this node's first IP, GCS port 6379, dashboard (Ray Jobs) 8265
#   NUM_GPUS=8 scripts/ray_head.sh --block           # stay in the foreground (Slurm steps, containers)
#   DRY_RUN=1 scripts/ray_head.sh                    # print the command, start nothing
# Environment: NODE_IP (default: first address of `hostname -I`), RAY_PORT (6379), DASHBOARD_PORT (8265),
# DASHBOARD_HOST (0.0.0.0: the Ray Jobs API answers on every interface), NUM_CPUS / NUM_GPUS (Ray counts them when
# unset), RAY_TEMP_DIR. Other arguments go to `ray start` as they are (--block, --resources='{"x": 1}', ports, ...).
# The NCCL settings are not set here: the recipe's nccl/ option reaches every worker through ray.init's runtime env.
set -euo pipefail

NODE_IP=${NODE_IP:-$(hostname -I 2>/dev/null | awk '{print $1}')}
NODE_IP=${NODE_IP:-127.0.0.1}
RAY_PORT=${RAY_PORT:-6379}
DASHBOARD_PORT=${DASHBOARD_PORT:-8265}
DASHBOARD_HOST=${DASHBOARD_HOST:-0.0.0.0}

cmd=(ray start --head --node-ip-address="$NODE_IP" --port="$RAY_PORT"
     --include-dashboard=true --dashboard-host="$DASHBOARD_HOST" --dashboard-port="$DASHBOARD_PORT"
     --disable-usage-stats)
[[ -n "${NUM_CPUS:-}" ]] && cmd+=(--num-cpus="$NUM_CPUS")
[[ -n "${NUM_GPUS:-}" ]] && cmd+=(--num-gpus="$NUM_GPUS")
[[ -n "${RAY_TEMP_DIR:-}" ]] && cmd+=(--temp-dir="$RAY_TEMP_DIR")
cmd+=("$@")

if [[ -n "${DRY_RUN:-}" && "${DRY_RUN}" != "0" ]]; then
    echo "+ $(printf '%q ' "${cmd[@]}" | sed 's/ $//')"
    exit 0
fi
echo "ray head: workers join with  scripts/ray_worker.sh $NODE_IP:$RAY_PORT" >&2
echo "ray head: submit runs with   python -m recipes.grpo launcher=ray launcher.address=http://$NODE_IP:$DASHBOARD_PORT" >&2
exec "${cmd[@]}"
