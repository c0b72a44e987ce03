#!/bin/bash
# sample CPU seconds (utime+stime+cutime+cstime) of the make test-fast process tree every 3 s
tck=$(getconf CLK_TCK)
while kill -0 13289 2>/dev/null; do
  tot=0
  for p in 13289 13356 13362 $(pgrep -P 13356) $(pgrep -P 13362); do
    [ -r /proc/$p/stat ] || continue
    v=$(awk '{print $14+$15+$16+$17}' /proc/$p/stat 2>/dev/null) || continue
    tot=$((tot + ${v:-0}))
  done
  echo "$(date -u +%H:%M:%S) $tot $tck $(cut -d' ' -f1 /proc/loadavg)" > /tmp/tf/cpu_last.txt
  sleep 3
done
