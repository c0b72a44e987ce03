"""Peak memory of verl 0.9.1's actor passes on one GPU, row by row, against the planner; and the auto token budget's
speed against fixed padded micro-batches.

    python scripts/gpu/bench_memory.py --out runs/gpu/memory            # the whole matrix (one H200: about 8 minutes)
    python scripts/gpu/bench_memory.py --out /tmp/m --device cpu --model tiny --batch 16 --parts memory   # logic smoke

What runs is the same actor as ``bench_dynamic_batch.py`` (verl's ``ActorRolloutRefWorker(role="actor")``, FSDP2, world
size 1, the pack's ``grpo`` recipe composed with the row's overrides, random weights of the shipped architecture, the
same long-tailed batch and the same two substitutions: attention ``pack_varlen``, chunked fp32 log-probs).

Parts (each writes its own JSON under ``--out`` after every row, so a stopped run keeps the rows it finished):
  memory    Qwen2.5-0.5B: fixed and dynamic at 3x / 8x / 16x of prompt + response, gradient checkpointing on, and
            fixed and 8x with it off; per row the peak of a log-prob pass with entropy, one without, and an update
  speed     Qwen2.5-0.5B: fixed padded against ``batching=dynamic`` at its default budget (the plan's auto budget)
  speed7b   Qwen2.5-7B's shapes (hidden 3584, MLP 18944, vocabulary 152064) with 8 of its 28 decoder layers: the
            same two arms (a whole 7B's fp32 master weights, grads, Adam states and AdamW's step temporary need
            152 GB: more than one H200; its fixed arm ran out of memory on 2026-12-01)

Measured per pass: ``torch.cuda.max_memory_allocated`` after a reset, minus what was allocated before the worker was
built (the process keeps a previous row's leftovers until Python frees them), and the token count of every
micro-batch verl formed (padded tokens for fixed micro-batches), recorded by wrapping verl's ``prepare_micro_batches``.
"""

from __future__ import annotations

import argparse
import gc
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

import bench_dynamic_batch as bdb  # noqa: E402
from _common import environment, sync, write_json  # noqa: E402

BUDGET_FACTORS = (3, 8, 16)


def memory_rows(seq: int) -> list[tuple[str, list[str]]]:
    """(name, overrides) of the memory matrix, the rows the issue asks first."""
    no_ckpt = ["actor_rollout_ref.model.enable_gradient_checkpointing=false"]
    rows = [("fixed", ["batching=fixed"])]
    rows += [(f"dynamic_{f}x", ["batching=dynamic", *typed_budget(f * seq)]) for f in BUDGET_FACTORS]
    rows.append(("fixed_no_ckpt", ["batching=fixed", *no_ckpt]))
    rows.append(("dynamic_8x_no_ckpt", ["batching=dynamic", *typed_budget(8 * seq), *no_ckpt]))
    rows.append(("dynamic_32x", ["batching=dynamic", *typed_budget(32 * seq)]))
    rows.append(
        (
            "fixed_8_16",
            [
                "batching=fixed",
                "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=8",
                "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=16",
            ],
        )
    )
    return rows


def typed_budget(tokens: int) -> list[str]:
    return [
        f"actor_rollout_ref.actor.ppo_max_token_len_per_gpu={tokens}",
        f"actor_rollout_ref.rollout.log_prob_max_token_len_per_gpu={tokens}",
    ]


class MicroBatchLog:
    """Wraps verl's ``prepare_micro_batches`` (FSDP engine) to record the tokens of every micro-batch it returns."""

    def __init__(self) -> None:
        import verl.workers.engine.fsdp.transformer_impl as impl

        self.impl, self.original, self.calls = impl, impl.prepare_micro_batches, []
        impl.prepare_micro_batches = self._wrapped

    def _wrapped(self, data, *args, **kwargs):
        micro_batches, indices = self.original(data, *args, **kwargs)
        real, padded = [], []
        for mb in micro_batches:
            lengths = mb["input_ids"].offsets().diff()
            real.append(int(lengths.sum()))
            padded.append(int(lengths.max()) * len(lengths))
        self.calls.append({"real": real, "padded": padded})
        return micro_batches, indices

    def take(self) -> list[dict]:
        calls, self.calls = self.calls, []
        return calls


def watch_logits_dtype(worker) -> tuple[list[str], object] | None:
    """A forward hook on the output embedding that records the logits' dtype (None where the module is not found)."""
    try:
        head = worker.actor.engine.module.get_output_embeddings()
    except Exception:  # noqa: BLE001 - the record then says it could not tell
        return None
    seen: list[str] = []
    return seen, head.register_forward_hook(lambda _m, _i, out: seen.append(str(out.dtype)))


def run_row(name: str, extra: list[str], model_dir: Path, device, args, log: MicroBatchLog, timing: bool) -> dict:
    from verl.utils import tensordict_utils as tu
    from verl.workers.engine_workers import ActorRolloutRefWorker

    ns = argparse.Namespace(**vars(args))
    arm = "dynamic" if "batching=dynamic" in extra else "fixed"
    ns.override = list(args.override) + [item for item in extra if not item.startswith("batching=")]
    cfg, overrides = bdb.compose_config(arm, ns.model, model_dir, device, ns)
    actor_cfg = cfg.actor_rollout_ref
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()
    allocated = (lambda: torch.cuda.memory_allocated(device)) if device.type == "cuda" else (lambda: 0)
    baseline = allocated()
    worker = ActorRolloutRefWorker(config=actor_cfg, role="actor")
    tic = time.perf_counter()
    worker.init_model()
    init_s = time.perf_counter() - tic
    after_init = allocated() - baseline
    vocab = int(worker.actor.engine.model_config.hf_config.vocab_size)
    hook = watch_logits_dtype(worker)

    def fresh_batch():
        return bdb.make_batch(args.batch, vocab, args, args.seed)

    def log_prob(entropy: bool):
        td, *_ = fresh_batch()
        tu.assign_non_tensor(td, calculate_entropy=entropy, calculate_sum_pi_squared=False, compute_loss=False)
        sync(device)
        tic = time.perf_counter()
        worker.compute_log_prob(td)
        sync(device)
        return time.perf_counter() - tic

    def update():
        td, *_ = fresh_batch()
        mini = args.mini_batch or args.batch
        tu.assign_non_tensor(td, **bdb.update_keys(actor_cfg, mini))
        sync(device)
        tic = time.perf_counter()
        worker.update_actor(td)
        sync(device)
        return time.perf_counter() - tic

    def measured(fn, *fn_args) -> dict:
        if device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(device)
        seconds = fn(*fn_args)
        peak = torch.cuda.max_memory_allocated(device) - baseline if device.type == "cuda" else None
        return {"s": seconds, "peak_bytes": peak, "micro_batches": log.take()}

    log.take()
    first = measured(log_prob, True)  # compiles; also the logits dtype
    dtype = None
    if hook is not None:
        hook[1].remove()
        dtype = hook[0][0] if hook[0] else None
    warm = measured(update)  # creates the optimizer states
    after_warmup = allocated() - baseline
    row = {
        "name": name,
        "overrides": overrides,
        "init_s": init_s,
        "baseline_bytes": baseline,
        "after_init_bytes": after_init,
        "after_warmup_bytes": after_warmup,
        "logits_dtype": dtype,
        "use_dynamic_bsz": bool(actor_cfg.actor.use_dynamic_bsz),
        "ppo_max_token_len_per_gpu": int(actor_cfg.actor.ppo_max_token_len_per_gpu),
        "log_prob_max_token_len_per_gpu": int(actor_cfg.rollout.log_prob_max_token_len_per_gpu),
        "ppo_micro_batch_size_per_gpu": int(actor_cfg.actor.ppo_micro_batch_size_per_gpu),
        "log_prob_micro_batch_size_per_gpu": int(actor_cfg.rollout.log_prob_micro_batch_size_per_gpu),
        "gradient_checkpointing": bool(actor_cfg.model.enable_gradient_checkpointing),
        "first_log_prob": first,
        "warmup_update": warm,
        "log_prob_entropy": measured(log_prob, True),
    }
    if not timing:  # the speed rows time the passes verl's trainer runs: the actor's log-prob (entropy) and update
        row["log_prob_no_entropy"] = measured(log_prob, False)
    row["update"] = measured(update)
    worker = None  # noqa: F841 - frees the model before the next row
    return row


def speed_summary(rows: dict, real_tokens: int) -> dict:
    out = {}
    for name, row in rows.items():
        lp, up = row["log_prob_entropy"]["s"], row["update"]["s"]
        out[name] = {
            "log_prob_s": lp,
            "update_s": up,
            "both_passes_tokens_per_s": real_tokens / (lp + up),
            "ppo_max_token_len_per_gpu": row["ppo_max_token_len_per_gpu"],
            "log_prob_max_token_len_per_gpu": row["log_prob_max_token_len_per_gpu"],
        }
    if {"fixed", "auto"} <= set(out):
        out["speedup_both_passes"] = out["auto"]["both_passes_tokens_per_s"] / out["fixed"]["both_passes_tokens_per_s"]
    return out


def run_part(part: str, rows: list[tuple[str, list[str]]], args, device, log, out: Path, timing: bool) -> dict:
    layers = getattr(args, "layers", None)
    suffix = f"_{layers}l" if layers else ""
    model_dir = bdb.make_model_dir(
        args.model, Path(args.model_dir or f"/tmp/pack_bench_{args.model}{suffix}"), device, args.seed, layers
    )
    prompt_len, response_len = bdb.lengths(args.batch, args, args.seed)
    result = {
        "script": "scripts/gpu/bench_memory.py",
        "part": part,
        "argv": sys.argv[1:],
        "environment": environment(device),
        "model": args.model,
        "attention": f"pack_varlen ({args.attention_kernel})",
        "logprobs": args.logprobs,
        "batch": {
            "sequences": args.batch,
            "mini_batch": args.mini_batch or args.batch,
            "max_prompt": args.max_prompt,
            "max_response": args.max_response,
            "real_tokens": int((prompt_len + response_len).sum()),
        },
        "rows": {},
    }
    for name, extra in rows:
        print(f"[{part}] {name}: {' '.join(extra)}", flush=True)
        try:
            row = run_row(name, extra, model_dir, device, args, log, timing)
        except Exception as error:  # noqa: BLE001 - an OOM row is a result too
            row = {"name": name, "error": f"{type(error).__name__}: {str(error)[:400]}"}
            log.take()
        result["rows"][name] = row
        gc.collect()
        if timing and "error" not in row:
            result["speed"] = speed_summary(
                {k: v for k, v in result["rows"].items() if "error" not in v}, result["batch"]["real_tokens"]
            )
        write_json(out / f"{part}.json", result)
        print(f"  {summary_line(row)}", flush=True)
    return result


def summary_line(row: dict) -> str:
    if "error" in row:
        return row["error"]

    no_entropy = row.get("log_prob_no_entropy", {}).get("peak_bytes")

    def g(x):
        return "-" if x is None else f"{x / 2**30:.2f}"

    return (
        f"init {g(row['after_init_bytes'])} GiB, +optimizer {g(row['after_warmup_bytes'])}; peaks log-prob "
        f"{g(row['log_prob_entropy']['peak_bytes'])} (no entropy {g(no_entropy)}), "
        f"update {g(row['update']['peak_bytes'])}; lp {row['log_prob_entropy']['s']:.2f} s, "
        f"update {row['update']['s']:.2f} s; logits {row['logits_dtype']}"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--parts", default="memory,speed,speed7b")
    parser.add_argument("--model", default="qwen2_5_0_5b")
    parser.add_argument("--model-7b", default="qwen2_5_7b")
    parser.add_argument("--model-dir", default=None)
    parser.add_argument("--batch", type=int, default=256, help="sequences of the memory rows (one optimizer step)")
    parser.add_argument("--speed-batch", type=int, default=512)
    parser.add_argument("--speed-batch-7b", type=int, default=128)
    parser.add_argument(
        "--layers-7b",
        type=int,
        default=8,
        help="decoder layers kept of the 7B (its shapes): one "
        "H200 cannot hold a full 7B's fp32 master weights, grads, Adam states and AdamW's step",
    )
    parser.add_argument("--max-prompt", type=int, default=512)
    parser.add_argument("--max-response", type=int, default=1024)
    parser.add_argument("--prompt-min", type=int, default=64)
    parser.add_argument("--response-median", type=float, default=200.0)
    parser.add_argument("--response-sigma", type=float, default=0.9)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--torch-compile", action=argparse.BooleanOptionalAction, default=True)
    parser.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto")
    parser.add_argument("--override", action="append", default=[])
    parser.add_argument("--rows", default="", help="memory rows to run, comma-separated (default: all)")
    args = parser.parse_args(argv)
    args.mini_batch = 0
    device = bdb.prepare_process(args)
    log = MicroBatchLog()
    args.out.mkdir(parents=True, exist_ok=True)
    seq = args.max_prompt + args.max_response
    parts = args.parts.split(",")
    if "memory" in parts:
        rows = [row for row in memory_rows(seq) if not args.rows or row[0] in args.rows.split(",")]
        run_part("memory", rows, args, device, log, args.out, timing=False)
    speed_rows = [("fixed", ["batching=fixed"]), ("auto", ["batching=dynamic"])]
    if "speed" in parts:
        ns = argparse.Namespace(**{**vars(args), "batch": args.speed_batch})
        ns.mini_batch = args.speed_batch // 2
        run_part("speed", speed_rows, ns, device, log, args.out, timing=True)
    if "speed7b" in parts:
        ns = argparse.Namespace(
            **{
                **vars(args),
                "batch": args.speed_batch_7b,
                "model": args.model_7b,
                "model_dir": None,
                "layers": args.layers_7b,
            }
        )
        ns.mini_batch = 0
        ns.override = list(args.override) + [
            "actor_rollout_ref.actor.use_kl_loss=false",
            "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=8",
            "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=16",
        ]
        run_part(f"speed7b_{args.layers_7b}l", speed_rows, ns, device, log, args.out, timing=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
