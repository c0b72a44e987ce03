#!/usr/bin/env bash
# This session's GPU chain (2026-12-07 evening), run from the repo root after staging, in the background: the
# weight-sync check's cost on real shapes, the checksums of a57be1e and the batched ones alternating
# (scripts/bench_sync_check.py); then the pack arm of scripts/gpu/vs_verl.sh twice on this warm machine: with
# a57be1e's recipes/ and hybrid_engine/ (per-tensor checksums, verl's fp32 stream with the tied lm_head) and at 7144735
# (batched checksums; the stream in bf16 where vLLM holds it so, no tied lm_head).
set -u
O=/tmp/o; W=/tmp/klppo_e2e; SITES=$W/vllm_site:$W/site
mkdir -p $O /tmp/older && tar -xf .gpu-tools/older-a57be1e.tar -C /tmp/older
# the old arm's tree: this one with a57be1e's two packages
rm -rf /tmp/oldrepo && mkdir /tmp/oldrepo && tar -cf - --exclude='./.gpu-stage*' . | tar -xf - -C /tmp/oldrepo
rm -rf /tmp/oldrepo/recipes /tmp/oldrepo/hybrid_engine && cp -r /tmp/older/recipes /tmp/older/hybrid_engine /tmp/oldrepo/
date -u +%FT%TZ > $O/bench.start
for i in 1; do
  PYTHONPATH=/tmp/older:$SITES python3 scripts/bench_sync_check.py --hidden 1536 --device cuda >>$O/bench_a57be1e.jsonl 2>>$O/bench.err
  PYTHONPATH=$PWD:$SITES python3 scripts/bench_sync_check.py --hidden 1536 --device cuda >>$O/bench_batched.jsonl 2>>$O/bench.err
done
date -u +%FT%TZ > $O/bench.done
(cd /tmp/oldrepo && COMMIT="7144735 tree, recipes/ and hybrid_engine/ of a57be1e" RUN_TIMEOUT=420 \
  bash scripts/gpu/vs_verl.sh pack $O/a57be1e) >$O/pack_a57be1e.out 2>&1
COMMIT=7144735 RUN_TIMEOUT=420 bash scripts/gpu/vs_verl.sh pack $O/7144735 >$O/pack_7144735.out 2>&1
date -u +%FT%TZ > $O/DONE
