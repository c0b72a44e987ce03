"""What one actor-update micro-batch costs in the model itself, outside verl: forward, log-probs and backward of a
packed micro-batch, at two sizes, with the packed sequence bounds found once per forward or in every layer.

    python3 scripts/gpu/bench_micro_batch.py                        # Qwen2.5-0.5B shape, random weights, on CUDA
    python3 scripts/gpu/bench_micro_batch.py --model tiny --device cpu --repeat 2 --tokens 96,192   # a smoke test

The end-to-end runs (docs/gpu_e2e.md, call 13) put about 0.44 s on every update micro-batch of the 0.5B shape, at
384 tokens and at 1,200 alike. This measures the same step without verl's engine: the shipped architecture in bf16
with random weights, gradient checkpointing on (verl's default), attention ``pack_varlen``
(recipes/verl_ext/plugin/varlen_attention.py), log-probs by the plugin's ``chunked_logprobs``; sequences of
``--seq-len`` tokens packed into one row as verl's remove-padding path packs them. Arms, side by side in one run:
bounds ``once`` (the plugin's default) and ``per_layer`` (``CACHE_BOUNDS = False``), and ``once`` without gradient
checkpointing. Prints a table; ``--json`` writes the figures.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import REPO, environment, pick_device, time_it, write_json  # noqa: E402

from recipes.verl_ext.plugin import varlen_attention  # noqa: E402
from recipes.verl_ext.plugin.logprobs import chunked_logprobs  # noqa: E402

ARMS = (("once", True, True), ("per_layer", False, True), ("once_no_checkpointing", True, False))
"""(name, bounds found once per forward, gradient checkpointing)"""


def build_model(name: str, device: torch.device):
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.from_pretrained(str(REPO / "hybrid_engine" / "model_configs" / name))
    torch.manual_seed(0)
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    model = AutoModelForCausalLM.from_config(config, dtype=dtype, attn_implementation=varlen_attention.NAME)
    return model.to(device).train()


def packed_batch(tokens: int, seq_len: int, vocab: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """One row of ``tokens // seq_len`` sequences: input ids and position ids restarting at 0 for each."""
    count = max(tokens // seq_len, 1)
    g = torch.Generator().manual_seed(tokens)
    ids = torch.randint(0, vocab, (1, count * seq_len), generator=g)
    positions = torch.arange(seq_len).repeat(count)[None]
    return ids.to(device), positions.to(device)


def step(model, ids: torch.Tensor, positions: torch.Tensor) -> None:
    """Forward, log-probs of the next tokens, backward; gradients dropped after."""
    logits = model(input_ids=ids, position_ids=positions.clone()).logits[0, :-1]
    logprobs = chunked_logprobs(logits, ids[0, 1:], inplace_backward=True)
    (-logprobs.mean()).backward()
    model.zero_grad(set_to_none=True)


def measure(model, device, tokens: int, seq_len: int, warmup: int, repeat: int) -> list[dict]:
    ids, positions = packed_batch(tokens, seq_len, model.config.vocab_size, device)
    rows = []
    for name, once, checkpointing in ARMS:
        varlen_attention.CACHE_BOUNDS = once
        if checkpointing:
            model.gradient_checkpointing_enable()
        else:
            model.gradient_checkpointing_disable()
        times = time_it(lambda: step(model, ids, positions), device, warmup=warmup, repeat=repeat)
        median = statistics.median(times)
        rows.append({"arm": name, "tokens": int(ids.shape[1]), "sequences": int(ids.shape[1]) // seq_len,
                     "median_s": median, "min_s": min(times), "tokens_per_s": ids.shape[1] / median, "times_s": times})
    varlen_attention.CACHE_BOUNDS = True
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="qwen2_5_0_5b", help="a folder of hybrid_engine/model_configs")
    parser.add_argument("--device", default="auto")
    parser.add_argument("--tokens", default="384,1920", help="micro-batch sizes in tokens, comma-separated")
    parser.add_argument("--seq-len", type=int, default=48, help="tokens per packed sequence (the tiny task's limit)")
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--repeat", type=int, default=10)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)
    device = pick_device(args.device)
    kernel = varlen_attention.register()
    model = build_model(args.model, device)
    rows = []
    for tokens in (int(t) for t in args.tokens.split(",")):
        rows += measure(model, device, tokens, args.seq_len, args.warmup, args.repeat)
    print(f"{args.model} on {device}, attention {kernel}, median of {args.repeat} after {args.warmup} warm-ups")
    print(f"{'arm':<24}{'tokens':>8}{'seqs':>6}{'median ms':>11}{'tokens/s':>11}")
    for row in rows:
        print(f"{row['arm']:<24}{row['tokens']:>8}{row['sequences']:>6}{row['median_s'] * 1e3:>11.1f}"
              f"{row['tokens_per_s']:>11.0f}")
    write_json(args.json, {"model": args.model, "kernel": kernel, "seq_len": args.seq_len, "rows": rows,
                           "environment": environment(device)})
    return 0


if __name__ == "__main__":
    sys.exit(main())
