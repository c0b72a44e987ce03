#!/usr/bin/env bash
# The run step of scripts/skypilot/klppo.yaml on every node: node 0 starts the Ray head, waits for the other nodes, runs
# the recipe (cluster.nnodes / cluster.gpus_per_node from SkyPilot) and so ends the job; the other nodes join Ray and
# return (their Ray daemons stay). Ray is started once per node: a later `sky exec` reuses it.
#   DRY_RUN=1 SKYPILOT_NODE_RANK=0 SKYPILOT_NODE_IPS=$'10.0.0.1\n10.0.0.2' SKYPILOT_NUM_NODES=2 \
#       bash scripts/skypilot/run.sh grpo nccl=ib        # print what node 0 would run
# SkyPilot runs its own Ray on port 6380: this cluster uses RAY_PORT (6379) and its own temp folder.
set -euo pipefail

RECIPE=${1:?usage: scripts/skypilot/run.sh RECIPE [overrides]}
shift
HERE=$(cd "$(dirname "$0")" && pwd)
RAY_PORT=${RAY_PORT:-6379}
DASHBOARD_PORT=${DASHBOARD_PORT:-8265}
PYTHON=${PYTHON:-python}
rank=${SKYPILOT_NODE_RANK:-0}
nnodes=${SKYPILOT_NUM_NODES:-1}
gpus=${SKYPILOT_NUM_GPUS_PER_NODE:-8}
head_ip=$(printf '%s\n' "${SKYPILOT_NODE_IPS:-127.0.0.1}" | head -n1)
node_ip=$(printf '%s\n' "${SKYPILOT_NODE_IPS:-127.0.0.1}" | sed -n "$((rank + 1))p")
export RAY_TEMP_DIR=${RAY_TEMP_DIR:-/tmp/ray_klppo}
DRY=${DRY_RUN:-0}

run() {
    if [[ "$DRY" != "0" ]]; then echo "+ $(printf '%q ' "$@" | sed 's/ $//')"; else "$@"; fi
}
ray_running_here() {  # this node already runs our Ray (a previous launch or exec)
    [[ "$DRY" == "0" ]] && pgrep -f -- "$RAY_TEMP_DIR/session" >/dev/null 2>&1
}

if [[ "$rank" != "0" ]]; then
    ray_running_here || run env NODE_IP="$node_ip" NUM_GPUS="$gpus" bash "$HERE/../ray_worker.sh" "$head_ip:$RAY_PORT"
    exit 0
fi
ray_running_here || run env NODE_IP="$head_ip" RAY_PORT="$RAY_PORT" DASHBOARD_PORT="$DASHBOARD_PORT" \
    NUM_GPUS="$gpus" bash "$HERE/../ray_head.sh"
run "$PYTHON" -m recipes.cluster.ray_jobs wait --address "$head_ip:$RAY_PORT" --nodes "$nnodes"
args=("$@")
given=" $* "
[[ "$given" == *" cluster.nnodes="* ]] || args+=("cluster.nnodes=$nnodes")
[[ "$given" == *" cluster.gpus_per_node="* ]] || args+=("cluster.gpus_per_node=$gpus")
if [[ "$given" == *" launcher=ray "* ]]; then
    [[ "$given" == *" launcher.address="* ]] || args+=("launcher.address=http://$head_ip:$DASHBOARD_PORT")
fi
run env RAY_ADDRESS="$head_ip:$RAY_PORT" "$PYTHON" -m "recipes.$RECIPE" "${args[@]}"
