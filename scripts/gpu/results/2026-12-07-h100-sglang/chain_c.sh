while [ ! -f /tmp/chain.done ]; do sleep 3; done
cd "$1"
rm -rf /tmp/klppo_e2e/runs/grpo /tmp/klppo_e2e/runs/grpo_resume /tmp/klppo_e2e/runs/kl_ppo /tmp/klppo_e2e/runs/grpo_qwen05b /tmp/klppo_e2e/figures/grpo.json /tmp/klppo_e2e/figures/grpo_resume*.json /tmp/klppo_e2e/figures/kl_ppo.json /tmp/klppo_e2e/figures/grpo_qwen05b.json
ROLLOUT=sglang PARTS=qwen05b STEPS=4 SAVE=2 RUN_TIMEOUT=400 bash scripts/gpu/run_h200_e2e.sh /tmp/o_sg4 > /tmp/o_sg4.out 2>&1; touch /tmp/chain.c1
ROLLOUT=sglang PARTS="grpo grpo_resume kl_ppo" STEPS=4 SAVE=2 FAIL_FAST=1 RUN_TIMEOUT=400 EXTRA="reward.num_workers=1 actor_rollout_ref.rollout.agent.num_workers=1 data.dataloader_num_workers=0 ++actor_rollout_ref.rollout.engine_kwargs.sglang.attention_backend=triton" bash scripts/gpu/run_h200_e2e.sh /tmp/o_sg3 > /tmp/o_sg3.out 2>&1; touch /tmp/chain.c
