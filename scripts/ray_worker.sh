#!/usr/bin/env bash
# Join this node to the Ray cluster whose head runs at HEAD_IP:PORT (started by scripts/ray_head.sh).
#   scripts/ray_worker.sh 10.0.0.1:6379
#   NUM_GPUS=8 scripts/ray_worker.sh 10.0.0.1:6379 --block
#   DRY_RUN=1 scripts/ray_worker.sh 10.0.0.1:6379    # print the commands, start nothing
# Waits up to WAIT_S seconds (120) for the head to answer first, so every node can be started at once (Slurm).
# Environment: NODE_IP (default: first address of `hostname -I`), NUM_CPUS / NUM_GPUS, RAY_TEMP_DIR, WAIT_S.
# Other arguments go to `ray start` as they are.
set -euo pipefail

HEAD=${1:?usage: scripts/ray_worker.sh HEAD_IP:PORT [ray start arguments]}
shift
NODE_IP=${NODE_IP:-$(hostname -I 2>/dev/null | awk '{print $1}')}
NODE_IP=${NODE_IP:-127.0.0.1}
WAIT_S=${WAIT_S:-120}

wait_cmd=(ray health-check --address="$HEAD")
cmd=(ray start --address="$HEAD" --node-ip-address="$NODE_IP" --disable-usage-stats)
[[ -n "${NUM_CPUS:-}" ]] && cmd+=(--num-cpus="$NUM_CPUS")
[[ -n "${NUM_GPUS:-}" ]] && cmd+=(--num-gpus="$NUM_GPUS")
[[ -n "${RAY_TEMP_DIR:-}" ]] && cmd+=(--temp-dir="$RAY_TEMP_DIR")
cmd+=("$@")

if [[ -n "${DRY_RUN:-}" && "${DRY_RUN}" != "0" ]]; then
    echo "+ $(printf '%q ' "${wait_cmd[@]}" | sed 's/ $//')  # until it answers, at most ${WAIT_S}s"
    echo "+ $(printf '%q ' "${cmd[@]}" | sed 's/ $//')"
    exit 0
fi
deadline=$((SECONDS + WAIT_S))
until "${wait_cmd[@]}" >/dev/null 2>&1; do
    if ((SECONDS >= deadline)); then
        echo "ray worker: no Ray head answers at $HEAD after ${WAIT_S}s" >&2
        exit 1
    fi
    sleep 2
done
exec "${cmd[@]}"
