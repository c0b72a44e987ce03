"""Dynamic batch size on one GPU: verl 0.9.1's actor, log-prob pass + update pass, fixed padded micro-batches against
``use_dynamic_bsz`` + ``use_remove_padding`` at the pack's token budgets, on long-tailed response lengths.

    python scripts/gpu/bench_dynamic_batch.py --json runs/gpu/dynamic_batch.json            # Qwen2.5-0.5B shape
    python scripts/gpu/bench_dynamic_batch.py --model tiny --batch 16 --device cpu           # logic smoke, CPU

What runs is verl's own actor: ``verl.workers.engine_workers.ActorRolloutRefWorker(role="actor")`` built in this
process at world size 1 (no Ray cluster: verl only needs Ray importable), ``init_model()`` (FSDP2 engine, fp32
master weights, bf16 compute, AdamW, gradient checkpointing), then ``compute_log_prob`` and ``update_actor`` on a
batch prepared exactly as verl's trainer does (left/right padded -> ``left_right_2_no_padding``, the same non-tensor
keys). Its config is the pack's ``grpo`` recipe composed with ``batching=fixed`` or ``batching=dynamic`` (budgets:
actor 3x, log-prob 4x (prompt + response); fixed: 16 sequences per update micro-batch, 32 per log-prob one), the
model path pointing at a folder of random weights of the shipped architecture.

One substitution, said in the output: attention. verl's remove-padding path needs flash-attn's varlen kernel, which
is not installed on the benchmark machine; both arms run ``attn_implementation="pack_varlen"``
(``recipes/verl_ext/plugin/varlen_attention.py``: PyTorch's own FlashAttention-2 varlen kernel; padded input is
unpadded inside attention, as transformers' flash_attention_2 does). So attention costs the same in both arms and
the difference is what padding costs the linear layers and the logits, and the micro-batch count.

Per arm: tokens/s of each pass (real tokens, not padding), peak memory (``torch.cuda.max_memory_allocated``) and the
planner's prediction for the same config (``recipes.check.plan.plan_settings`` -> ``hybrid_engine.plan.memory``), plus
the log-probs of both arms compared on the same weights.
"""

from __future__ import annotations

import argparse
import dataclasses
import gc
import math
import os
import socket
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import environment, gib, pct_error, pick_device, sync, write_json  # noqa: E402

from hybrid_engine.model_spec import MODEL_CONFIG_DIR  # noqa: E402

ARMS = ("fixed", "dynamic")
def update_keys(actor_cfg, mini: int) -> dict:
    """The non-tensor keys verl's trainer sends with ``update_actor`` (one mini-batch of ``mini`` sequences)."""
    return dict(
        calculate_entropy=False,
        distillation_use_topk=False,
        distillation_only=False,
        global_batch_size=mini,
        mini_batch_size=mini,
        epochs=int(actor_cfg.actor.ppo_epochs),
        seed=int(actor_cfg.actor.data_loader_seed or 0),
        dataloader_kwargs={"shuffle": bool(actor_cfg.actor.shuffle)},
        compute_loss=True,
    )


def patch_logprobs(fused: bool = True) -> str:
    """verl's log-prob function in this process: the plugin's chunked fp32 one (what the plugin installs on a GPU
    machine without flash-attn, recipes/verl_ext/plugin/logprobs.py), or with ``fused=False`` verl's own fallback
    without flash-attn, ``logprobs_from_logits_v2`` (a row loop)."""
    import verl.utils.torch_functional as verl_F
    import verl.workers.engine.fsdp.transformer_impl as impl

    from recipes.verl_ext.plugin.logprobs import CHUNK, chunked_logprobs

    if verl_F.FLAH_ATTN_CROSS_ENTROPY_LOSS_AVAILABLE:
        return "flash-attn cross-entropy (verl's own)"
    if not fused:
        def row_loop(logits, labels, inplace_backward=True):
            return verl_F.logprobs_from_logits_v2(logits, labels)

        verl_F.logprobs_from_logits = impl.logprobs_from_logits = row_loop
        return "verl's fallback (logprobs_from_logits_v2, a row loop)"
    verl_F.logprobs_from_logits = impl.logprobs_from_logits = chunked_logprobs
    return (
        f"chunked fp32 logsumexp + gather, {CHUNK} rows a chunk, backward in place "
        "(substitute for flash-attn's fused CE with inplace_backward)"
    )


# ---------------------------------------------------------------------------------------------------------------------
# model, config, data
# ---------------------------------------------------------------------------------------------------------------------


def make_model_dir(model: str, folder: Path, device: torch.device, seed: int, layers: int | None = None) -> Path:
    """A folder verl can load: the shipped config.json and random bf16 weights (safetensors); ``layers``: keep only
    that many decoder layers (the same shapes, a shallower model)."""
    from transformers import AutoConfig, AutoModelForCausalLM

    folder.mkdir(parents=True, exist_ok=True)
    if (folder / "model.safetensors").exists() or (folder / "model.safetensors.index.json").exists():
        return folder
    config = AutoConfig.from_pretrained(str(MODEL_CONFIG_DIR / model))
    if layers:
        config.num_hidden_layers = layers
        if getattr(config, "layer_types", None):
            config.layer_types = config.layer_types[:layers]
    torch.manual_seed(seed)
    with torch.device(device):
        net = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)
    net.save_pretrained(str(folder), safe_serialization=True)
    del net
    return folder


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def compose_config(arm: str, model: str, model_dir: Path, device: torch.device, args: argparse.Namespace):
    """The pack's grpo recipe for one arm, resolved (the actor_rollout_ref subtree is what verl's worker reads)."""
    from omegaconf import OmegaConf

    from recipes.compose.compose import compose_recipe

    overrides = [
        f"model={model}",
        "strategy=fsdp2",
        f"batching={arm}",
        "parallel=tp1",
        f"cluster={'h200_141g' if device.type == 'cuda' else 'cpu'}",
        "cluster.nnodes=1",
        "cluster.gpus_per_node=1",
        f"data.max_prompt_length={args.max_prompt}",
        f"data.max_response_length={args.max_response}",
        f"actor_rollout_ref.model.path={model_dir}",
        "++actor_rollout_ref.model.load_tokenizer=false",
        "++actor_rollout_ref.model.override_config.attn_implementation=pack_varlen",
        f"actor_rollout_ref.model.use_remove_padding={'true' if arm == 'dynamic' else 'false'}",
        "actor_rollout_ref.actor.optim.lr=1e-6",
        "actor_rollout_ref.actor.checkpoint.save_contents=[model]",
    ]
    if not args.torch_compile:
        overrides += [
            "actor_rollout_ref.actor.use_torch_compile=false",
            "actor_rollout_ref.actor.fsdp_config.use_torch_compile=false",
        ]
    if device.type != "cuda":
        fp32 = "{param_dtype:fp32,reduce_dtype:fp32,buffer_dtype:fp32}"
        overrides += [
            "trainer.device=cpu",
            f"++actor_rollout_ref.actor.fsdp_config.mixed_precision={fp32}",
            "actor_rollout_ref.model.enable_gradient_checkpointing=false",
        ]
    overrides += list(args.override)
    cfg = compose_recipe("grpo", overrides)
    return OmegaConf.create(OmegaConf.to_container(cfg, resolve=True)), overrides


def lengths(n: int, args: argparse.Namespace, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Prompt lengths uniform in [prompt_min, max_prompt]; response lengths long-tailed: lognormal(median, sigma),
    clipped to [16, max_response] (a few responses run to the limit, most stop early)."""
    g = torch.Generator().manual_seed(seed)
    prompt = torch.randint(args.prompt_min, args.max_prompt + 1, (n,), generator=g)
    normal = torch.randn(n, generator=g, dtype=torch.float64)
    response = torch.exp(math.log(args.response_median) + args.response_sigma * normal).round().long()
    return prompt, response.clamp(16, args.max_response)


def make_batch(n: int, vocab: int, args: argparse.Namespace, seed: int):
    """A rollout batch as verl's trainer holds it (prompts left-padded, responses right-padded), then converted the
    way ``RayPPOTrainer`` converts it for the actor (``left_right_2_no_padding``)."""
    from verl.utils import tensordict_utils as tu
    from verl.workers.utils.padding import left_right_2_no_padding

    P, R = args.max_prompt, args.max_response
    prompt_len, response_len = lengths(n, args, seed)
    g = torch.Generator().manual_seed(seed + 1)
    input_ids = torch.zeros(n, P + R, dtype=torch.long)
    attention_mask = torch.zeros(n, P + R, dtype=torch.long)
    for i in range(n):
        p, r = int(prompt_len[i]), int(response_len[i])
        attention_mask[i, P - p : P + r] = 1
        input_ids[i, P - p : P + r] = torch.randint(3, vocab, (p + r,), generator=g)
    position_ids = (attention_mask.cumsum(-1) - 1).clamp(min=0)
    response_mask = attention_mask[:, P:].clone()
    old_log_probs = -torch.rand(n, R, generator=g) * 3 * response_mask
    td = tu.get_tensordict(
        tensor_dict={
            "prompts": input_ids[:, :P].clone(),
            "responses": input_ids[:, P:].clone(),
            "input_ids": input_ids,
            "attention_mask": attention_mask,
            "position_ids": position_ids,
            "response_mask": response_mask,
            "old_log_probs": old_log_probs,
            "ref_log_prob": old_log_probs + 0.01 * torch.randn(n, R, generator=g) * response_mask,
            "advantages": torch.randn(n, 1, generator=g).expand(n, R).contiguous() * response_mask,
        },
        non_tensor_dict={"temperature": 1.0},
    )
    return left_right_2_no_padding(td), prompt_len, response_len


def padded_tokens(total_len: torch.Tensor, micro: int) -> int:
    """Tokens a fixed micro-batching computes: each chunk of ``micro`` sequences (in batch order) padded to its
    longest (verl pads a micro-batch to its own longest sequence, not to the global maximum)."""
    out = 0
    for start in range(0, len(total_len), micro):
        chunk = total_len[start : start + micro]
        out += int(chunk.max()) * len(chunk)
    return out


# ---------------------------------------------------------------------------------------------------------------------
# one arm
# ---------------------------------------------------------------------------------------------------------------------


def planned(cfg) -> dict:
    """The planner's memory per GPU for this config (no reference model and no rollout engine: the benchmark builds
    only the actor)."""
    from hybrid_engine.groups import hybrid_groups
    from hybrid_engine.layout import InferLayout, TrainLayout
    from hybrid_engine.model_spec import build_spec, load_arch
    from hybrid_engine.plan.memory import estimate_memory
    from recipes.check.plan import cluster_spec, plan_settings

    settings = plan_settings(cfg, has_critic=False, has_ref=False)
    settings = dataclasses.replace(settings, free_cache_engine=True)
    spec = build_spec(load_arch(str(cfg.model.name)))
    groups = hybrid_groups(TrainLayout(dp=1).resolve(1), InferLayout(tp=1).resolve(1), fsdp=True)
    memory = estimate_memory(spec, groups, cluster_spec(cfg), settings, spec.numel * 2)
    return {"settings": settings.to_dict(), "memory": memory}


def run_arm(arm: str, model_dir: Path, device: torch.device, args: argparse.Namespace, data_seed: int) -> dict:
    from verl.utils import tensordict_utils as tu
    from verl.workers.engine_workers import ActorRolloutRefWorker
    from verl.workers.utils.padding import no_padding_2_padding

    cfg, overrides = compose_config(arm, args.model, model_dir, device, args)
    actor_cfg = cfg.actor_rollout_ref
    worker = ActorRolloutRefWorker(config=actor_cfg, role="actor")
    tic = time.perf_counter()
    worker.init_model()
    init_s = time.perf_counter() - tic
    vocab = int(worker.actor.engine.model_config.hf_config.vocab_size)

    def batch():
        td, prompt_len, response_len = make_batch(args.batch, vocab, args, data_seed)
        return td, prompt_len, response_len

    def log_prob_pass():
        td, *_ = batch()
        tu.assign_non_tensor(td, calculate_entropy=True, calculate_sum_pi_squared=False, compute_loss=False)
        sync(device)
        tic = time.perf_counter()
        out = worker.compute_log_prob(td)
        sync(device)
        return time.perf_counter() - tic, out, td

    def update_pass():
        td, *_ = batch()
        mini = args.mini_batch or args.batch
        tu.assign_non_tensor(td, **update_keys(actor_cfg, mini))
        sync(device)
        tic = time.perf_counter()
        out = worker.update_actor(td)
        sync(device)
        return time.perf_counter() - tic, out

    def reset_peak() -> None:
        if device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(device)

    def peak() -> int | None:
        return torch.cuda.max_memory_allocated(device) if device.type == "cuda" else None

    # the first log-probs, on the freshly loaded weights (compared across the arms), then warm-ups
    seconds, out, td = log_prob_pass()
    log_probs = no_padding_2_padding(tu.get(out, "log_probs"), td).float().cpu()
    response_mask = td["response_mask"].bool().cpu()
    warm = {"log_prob_first_s": seconds}
    for _ in range(args.warmup):
        warm.setdefault("update_warmup_s", []).append(update_pass()[0])
    log_prob_times, log_prob_peaks, update_times, update_peaks, metrics = [], [], [], [], None
    for _ in range(args.repeat):
        reset_peak()
        seconds, _out, _td = log_prob_pass()
        log_prob_times.append(seconds)
        log_prob_peaks.append(peak())
    for _ in range(args.repeat):
        reset_peak()
        seconds, out = update_pass()
        update_times.append(seconds)
        update_peaks.append(peak())
        metrics = tu.get(out, "metrics") if out is not None else None

    _, prompt_len, response_len = batch()
    total = prompt_len + response_len
    real_tokens = int(total.sum())
    plan = planned(cfg)
    phases = plan["memory"]["phases"]
    lp = statistics.median(log_prob_times)
    up = statistics.median(update_times)
    row = {
        "overrides": overrides,
        "init_s": init_s,
        "warmup": warm,
        "use_dynamic_bsz": bool(actor_cfg.actor.use_dynamic_bsz),
        "use_remove_padding": bool(actor_cfg.model.use_remove_padding),
        "ppo_max_token_len_per_gpu": int(actor_cfg.actor.ppo_max_token_len_per_gpu),
        "log_prob_max_token_len_per_gpu": int(actor_cfg.rollout.log_prob_max_token_len_per_gpu),
        "ppo_micro_batch_size_per_gpu": int(actor_cfg.actor.ppo_micro_batch_size_per_gpu),
        "log_prob_micro_batch_size_per_gpu": int(actor_cfg.rollout.log_prob_micro_batch_size_per_gpu),
        "real_tokens": real_tokens,
        "log_prob_s": lp,
        "log_prob_s_all": log_prob_times,
        "update_s": up,
        "update_s_all": update_times,
        "log_prob_tokens_per_s": real_tokens / lp,
        "update_tokens_per_s": real_tokens / up,
        "both_passes_tokens_per_s": real_tokens / (lp + up),
        "log_prob_peak_bytes": max(p for p in log_prob_peaks if p is not None) if device.type == "cuda" else None,
        "update_peak_bytes": max(p for p in update_peaks if p is not None) if device.type == "cuda" else None,
        "planned_log_prob_bytes": phases["log_prob"],
        "planned_update_bytes": phases["training"],
        "plan": plan,
        "verl_metrics": {k: v for k, v in (metrics or {}).items() if not isinstance(v, list) or len(v) < 64},
    }
    if not row["use_dynamic_bsz"]:
        row["fixed_padded_tokens_update"] = padded_tokens(total, row["ppo_micro_batch_size_per_gpu"])
        row["fixed_padded_tokens_log_prob"] = padded_tokens(total, row["log_prob_micro_batch_size_per_gpu"])
    if device.type == "cuda":
        row["log_prob_plan_error_pct"] = pct_error(phases["log_prob"], row["log_prob_peak_bytes"])
        row["update_plan_error_pct"] = pct_error(phases["training"], row["update_peak_bytes"])
    return {"row": row, "log_probs": log_probs, "response_mask": response_mask}


# ---------------------------------------------------------------------------------------------------------------------
# main
# ---------------------------------------------------------------------------------------------------------------------


def prepare_process(args: argparse.Namespace) -> torch.device:
    """World-size-1 environment for verl's worker, the varlen attention kernel, the log-prob substitute (printed)."""
    device = pick_device(args.device)
    os.environ.setdefault("RANK", "0")
    os.environ.setdefault("LOCAL_RANK", "0")
    os.environ.setdefault("WORLD_SIZE", "1")
    os.environ.setdefault("LOCAL_WORLD_SIZE", "1")
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", str(free_port()))
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    from recipes.verl_ext.plugin import varlen_attention

    kernel = varlen_attention.register()
    if device.type != "cuda":
        kernel = "sdpa per sequence (CPU)"
    args.attention_kernel = kernel
    args.attention_check = varlen_attention.self_check(device)
    print(f"attention self-check: {args.attention_check}")
    fused = getattr(args, "fused_logprobs", True)
    args.logprobs = patch_logprobs(fused)
    print(f"log-probs: {args.logprobs}")
    return device


def run(args: argparse.Namespace) -> dict:
    device = prepare_process(args)
    kernel, attention_check, logprobs = args.attention_kernel, args.attention_check, args.logprobs
    model_dir = make_model_dir(args.model, Path(args.model_dir or f"/tmp/pack_bench_{args.model}"), device, args.seed)
    prompt_len, response_len = lengths(args.batch, args, args.seed)
    total = prompt_len + response_len
    q = torch.tensor([0.5, 0.9, 0.99])
    result: dict = {
        "script": "scripts/gpu/bench_dynamic_batch.py",
        "argv": sys.argv[1:],
        "environment": environment(device),
        "model": args.model,
        "what_runs": "verl 0.9.1 ActorRolloutRefWorker(role=actor) in-process, FSDP2 engine, world size 1",
        "attention": f"pack_varlen ({kernel}) in both arms; flash-attn is not installed",
        "attention_self_check": attention_check,
        "logprobs": logprobs,
        "batch": {
            "sequences": args.batch,
            "mini_batch": args.mini_batch or args.batch,
            "max_prompt": args.max_prompt,
            "max_response": args.max_response,
            "response_distribution": f"lognormal(median {args.response_median}, sigma {args.response_sigma}) "
            f"clipped to [16, {args.max_response}]; prompts uniform [{args.prompt_min}, {args.max_prompt}]",
            "response_mean": float(response_len.float().mean()),
            "response_p50_p90_p99": [float(x) for x in torch.quantile(response_len.float(), q)],
            "response_at_limit": int((response_len == args.max_response).sum()),
            "sequence_mean": float(total.float().mean()),
            "real_tokens": int(total.sum()),
            "padded_to_global_max_tokens": args.batch * (args.max_prompt + args.max_response),
        },
        "arms": {},
    }
    print(
        f"{args.model}: {args.batch} sequences, mean length {total.float().mean():.0f} "
        f"(responses p50/p90/p99 {[round(x) for x in result['batch']['response_p50_p90_p99']]}, "
        f"{result['batch']['response_at_limit']} at the limit); attention {kernel}"
    )
    outputs = {}
    for arm in args.arms.split(","):
        print(f"arm {arm}: building verl's actor ...", flush=True)
        outputs[arm] = run_arm(arm, model_dir, device, args, args.seed)
        gc.collect()  # the arm's worker (model, optimizer) goes with run_arm's frame
        if device.type == "cuda":
            torch.cuda.empty_cache()
        row = outputs[arm]["row"]
        result["arms"][arm] = row
        print(
            f"  {arm:<8} log-prob {row['log_prob_s']:.2f} s ({row['log_prob_tokens_per_s']:,.0f} tok/s), "
            f"update {row['update_s']:.2f} s ({row['update_tokens_per_s']:,.0f} tok/s), "
            f"peak log-prob {gib(row['log_prob_peak_bytes'])} GiB (plan {gib(row['planned_log_prob_bytes'])}), "
            f"update {gib(row['update_peak_bytes'])} GiB (plan {gib(row['planned_update_bytes'])})",
            flush=True,
        )
    if {"fixed", "dynamic"} <= set(outputs):
        fixed, dynamic = result["arms"]["fixed"], result["arms"]["dynamic"]
        mask = outputs["fixed"]["response_mask"]
        diff = (outputs["fixed"]["log_probs"] - outputs["dynamic"]["log_probs"]).abs()[mask]
        result["speedup"] = {
            "log_prob": dynamic["log_prob_tokens_per_s"] / fixed["log_prob_tokens_per_s"],
            "update": dynamic["update_tokens_per_s"] / fixed["update_tokens_per_s"],
            "both_passes": dynamic["both_passes_tokens_per_s"] / fixed["both_passes_tokens_per_s"],
        }
        result["log_prob_agreement"] = {
            "max_abs_diff": float(diff.max()) if diff.numel() else 0.0,
            "mean_abs_diff": float(diff.mean()) if diff.numel() else 0.0,
            "what": "log-probs of the first pass (same weights) fixed vs dynamic, over response tokens",
        }
        result["targets"] = {"dynamic_at_least_1_4x": result["speedup"]["both_passes"] >= 1.4}
        s = result["speedup"]
        print(
            f"dynamic / fixed tokens/s: log-prob {s['log_prob']:.2f}x, update {s['update']:.2f}x, "
            f"both passes {s['both_passes']:.2f}x; log-probs agree to "
            f"{result['log_prob_agreement']['max_abs_diff']:.2e} (max abs)"
        )
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="qwen2_5_0_5b", help="shipped config name (random weights are drawn)")
    parser.add_argument("--model-dir", default=None, help="where the random-weight model folder goes")
    parser.add_argument("--arms", default=",".join(ARMS))
    parser.add_argument("--batch", type=int, default=512, help="sequences per step (one GPU)")
    parser.add_argument("--mini-batch", type=int, default=256, help="sequences per optimizer step (0: the batch)")
    parser.add_argument("--max-prompt", type=int, default=512, help="the gsm8k task's data.max_prompt_length")
    parser.add_argument("--max-response", type=int, default=1024, help="the gsm8k task's data.max_response_length")
    parser.add_argument("--prompt-min", type=int, default=64)
    parser.add_argument("--response-median", type=float, default=200.0)
    parser.add_argument("--response-sigma", type=float, default=0.9)
    parser.add_argument("--warmup", type=int, default=1, help="update passes before timing")
    parser.add_argument("--repeat", type=int, default=2, help="timed passes of each kind")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--torch-compile", action=argparse.BooleanOptionalAction, default=True)
    parser.add_argument(
        "--fused-logprobs",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="without flash-attn: vectorised log-probs instead of verl's per-row Python loop",
    )
    parser.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto")
    parser.add_argument("--override", action="append", default=[], help="extra Hydra override (repeatable)")
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args(argv)
    if args.mini_batch and args.batch % args.mini_batch:
        raise SystemExit(f"--mini-batch {args.mini_batch} must divide --batch {args.batch}")
    result = run(args)
    write_json(args.json, result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
