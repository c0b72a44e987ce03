"""The aten calls of one forward and backward of the Qwen2.5-0.5B shape (4 layers, batch 2 x 128, fp32, CPU), under
whichever transformers is first on the path: does SGLang's pinned transformers 5.8.1 run the model with more
operations (GPU kernel launches) than the GPU image's 5.17.0? README.md beside this file.

    PYTHONPATH=<transformers 5.8.1> python opcount.py sdpa|eager
"""

import json
import sys
from pathlib import Path

import torch
import transformers
from torch.profiler import ProfilerActivity, profile
from transformers import AutoConfig, AutoModelForCausalLM

SHAPE = Path(__file__).resolve().parents[3] / "hybrid_engine" / "model_configs" / "qwen2_5_0_5b"

cfg = AutoConfig.from_pretrained(str(SHAPE))
cfg.num_hidden_layers = 4
torch.manual_seed(0)
model = AutoModelForCausalLM.from_config(cfg, dtype=torch.float32, attn_implementation=sys.argv[1])
ids = torch.randint(0, 1000, (2, 128))


def step():
    model(input_ids=ids, use_cache=False).logits.float().mean().backward()


step()  # the first call's one-off work is not counted
with profile(activities=[ProfilerActivity.CPU]) as prof:
    step()
calls = sum(e.count for e in prof.key_averages() if e.key.startswith("aten::"))
print(json.dumps({"transformers": transformers.__version__, "attn": sys.argv[1], "aten_calls": calls}))
