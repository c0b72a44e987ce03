"""Weight handoff on one GPU: the actor's training weights -> the generation model's parameters, timed per switch.

    python scripts/gpu/bench_handoff.py --model qwen2_7b --json runs/gpu/handoff.json
    python scripts/gpu/bench_handoff.py --model qwen2_5_0_5b_reduced --device cpu --repeat 2   # logic smoke, CPU

Side by side, in one process, on one device (world size 1, NCCL on a GPU, gloo on the CPU), with random bf16 weights
drawn per tensor from a seeded generator (so every result is checked bit for bit against the reference):

- ``copy_floor``: one flat device copy of the model's bytes (the HBM floor measured, not computed).
- ``per_tensor_copy``: one ``copy_`` per HF tensor from tensors already in the generation layout (no executor): what
  a per-tensor Python loop of copies costs on this host.
- ``pack``: the pack's executor (``hybrid_engine.reshard.Resharder``, scheme ``hybridflow``, world size 1) from
  Megatron-style training shards (fused ``linear_qkv`` with q/k/v interleaved per query group, fused ``linear_fc1``
  gate|up) to HF generation tensors (the q/k/v re-layout), each ``copy_`` into a preallocated HF model's parameter
  (built on the meta device, then ``to_empty`` on the device): the generation engine's own weights.
- ``pack_stream_only``: the same stream, consumed without the copy (the executor's own cost).
- ``pack_into``: the executor's ``Resharder.load_into``: a bucket that needs nothing from other ranks (all of them at
  world size 1) is copied straight from the training shards into the HF model's parameters (no q/k/v temporaries),
  the others streamed and copied in. (Measured on an H200 on 2026-12-01 in a first version that copied each bucket
  with one ``torch._foreach_copy_``: 14.15 ms for Qwen2-7B, slower than ``pack``.)
- ``foreach_copy``: ``per_tensor_copy`` as one batched ``torch._foreach_copy_`` of the whole model (no executor).
- ``verl_bf16`` / ``verl_fp32``: verl 0.9.1's way (``FSDPEngine.get_per_tensor_param``): an FSDP2 module's
  ``state_dict()``, then per tensor ``param.to(device, non_blocking=True).full_tensor()``, then the rollout's
  default weight loader, ``param.data.copy_(loaded_weight)`` (casting). verl's actor keeps fp32 parameters under
  FSDP2 (``verl_fp32``, what verl really moves); ``verl_bf16`` moves the same bytes as ``pack``.

Per scheme: median / min seconds per switch, peak extra memory (``torch.cuda.max_memory_allocated`` above what was
allocated before the switch), and the HBM floor: (training bytes read + generation bytes written) / the copy
bandwidth measured in the same run. The planner's memory prediction sits beside the measured peak (plan accuracy).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
import zlib
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # scripts/: the reshard harness

from _common import (  # noqa: E402
    GIB,
    MB,
    copy_bandwidth,
    environment,
    gib,
    init_single_process_group,
    pct_error,
    pick_device,
    sync,
    write_json,
)
from reshard_harness import SMALL_SHAPES, small_spec  # noqa: E402

from hybrid_engine.groups import hybrid_groups  # noqa: E402
from hybrid_engine.layout import InferLayout, TrainLayout  # noqa: E402
from hybrid_engine.model_spec import MODEL_CONFIG_DIR  # noqa: E402
from hybrid_engine.reshard import Resharder, megatron_shards  # noqa: E402
from hybrid_engine.reshard.shards import full_box, narrow_box, unique_tensors  # noqa: E402

SCHEMES = (
    "copy_floor",
    "per_tensor_copy",
    "foreach_copy",
    "pack",
    "pack_into",
    "pack_stream_only",
    "verl_bf16",
    "verl_fp32",
)


# ---------------------------------------------------------------------------------------------------------------------
# weights
# ---------------------------------------------------------------------------------------------------------------------


class Reference:
    """Random weights: tensor ``name`` is drawn from a generator seeded by crc32(seed:name), on the device."""

    def __init__(self, device: torch.device, dtype: torch.dtype, seed: int = 0, scale: float = 0.02):
        self.device, self.dtype, self.seed, self.scale = device, dtype, seed, scale

    def full(self, name: str, shape: tuple[int, ...]) -> torch.Tensor:
        generator = torch.Generator(device=self.device)
        generator.manual_seed(zlib.crc32(f"{self.seed}:{name}".encode()))
        values = torch.randn(shape, generator=generator, device=self.device, dtype=torch.float32)
        return values.mul_(self.scale).to(self.dtype)

    def source(self, name: str, shape: tuple[int, ...], box) -> torch.Tensor:
        """A ``hybrid_engine.reshard`` weight source: the box of the full reference tensor."""
        return narrow_box(self.full(name, shape), full_box(shape), box).clone()


def hf_config(model: str):
    from transformers import AutoConfig

    if model in SMALL_SHAPES:
        shape = dict(SMALL_SHAPES[model])
        return AutoConfig.for_model(shape.pop("model_type"), **shape)
    return AutoConfig.from_pretrained(str(MODEL_CONFIG_DIR / model))


def empty_hf_model(config, device: torch.device, dtype: torch.dtype):
    """The generation model: built on the meta device, then ``to_empty`` on ``device`` (no initialisation)."""
    from transformers import AutoModelForCausalLM

    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config, dtype=dtype)
    model.to_empty(device=device)
    if getattr(config, "tie_word_embeddings", False):
        model.tie_weights()
    return model.eval().requires_grad_(False)


def check_against_reference(params: dict[str, torch.Tensor], names, shapes, ref: Reference) -> list[str]:
    bad = []
    for name in names:
        if not torch.equal(params[name], ref.full(name, shapes[name])):
            bad.append(name)
    return bad


# ---------------------------------------------------------------------------------------------------------------------
# the schemes
# ---------------------------------------------------------------------------------------------------------------------


def measure(fn, device: torch.device, warmup: int, repeat: int) -> dict:
    """Seconds per call and the peak memory above what was allocated before each call."""
    for _ in range(warmup):
        fn()
    sync(device)
    times, peaks = [], []
    for _ in range(repeat):
        sync(device)
        base = torch.cuda.memory_allocated(device) if device.type == "cuda" else 0
        if device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(device)
        tic = time.perf_counter()
        fn()
        sync(device)
        times.append(time.perf_counter() - tic)
        if device.type == "cuda":
            peaks.append(torch.cuda.max_memory_allocated(device) - base)
    return {
        "seconds_median": statistics.median(times),
        "seconds_min": min(times),
        "seconds_all": times,
        "peak_extra_bytes": max(peaks) if peaks else None,
        "peak_absolute_bytes": (torch.cuda.max_memory_allocated(device) if device.type == "cuda" else None),
    }


def build_fsdp_actor(config, device: torch.device, dtype: torch.dtype, ref: Reference):
    """verl's actor at world size 1: an HF model under FSDP2 (every decoder layer, then the root), ``dtype`` params."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
    from transformers import AutoModelForCausalLM

    mesh = init_device_mesh(device.type, (1,))
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config, dtype=dtype)
    policy = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    for layer in model.model.layers:
        fully_shard(layer, mesh=mesh, mp_policy=policy)
    fully_shard(model, mesh=mesh, mp_policy=policy)
    model.to_empty(device=device)
    if getattr(config, "tie_word_embeddings", False):
        model.tie_weights()
    with torch.no_grad():
        for name, param in model.named_parameters():
            local = param.to_local() if hasattr(param, "to_local") else param
            local.copy_(ref.full(name, tuple(param.shape)).to(dtype))
    return model


def verl_handoff(actor, target_params: dict[str, torch.Tensor], device: torch.device) -> None:
    """verl 0.9.1 FSDPEngine.get_per_tensor_param (FSDP2, no LoRA) feeding the rollout's default weight loader."""
    from torch.distributed.tensor import DTensor

    params = actor.state_dict()
    per_tensor_param = (
        (name, param.to(device, non_blocking=True).full_tensor() if isinstance(param, DTensor) else param)
        for name, param in params.items()
    )
    for name, tensor in per_tensor_param:
        if name in target_params:
            target_params[name].data.copy_(tensor)


# ---------------------------------------------------------------------------------------------------------------------
# the plan beside it
# ---------------------------------------------------------------------------------------------------------------------


def planned_memory(spec, resharder: Resharder, dtype_size: int, shard_bytes: int) -> dict:
    """What the planner (``planned_bytes``) and the executor's own accounting predict for one switch at world 1:
    generation weights = peak_param_bytes (M / (t_g*p_g)), training shards = the Megatron shard bytes, extra = the
    executor's tracked buffers (generation tensors it had to build rather than view, one bucket at a time)."""
    planned = resharder.planned(dtype_size)
    stats = resharder.stats
    return {
        "model_bytes": planned.model_bytes,
        "received_bytes_planned": planned.received,
        "received_bytes_measured": stats.received_bytes if stats else None,
        "generation_weight_bytes_planned": planned.peak_param_bytes,
        "training_shard_bytes": shard_bytes,
        "executor_extra_bytes_planned": stats.peak_extra_bytes if stats else None,
        "peak_bytes_planned": planned.peak_param_bytes + shard_bytes + (stats.peak_extra_bytes if stats else 0),
    }


# ---------------------------------------------------------------------------------------------------------------------
# main
# ---------------------------------------------------------------------------------------------------------------------


def run(args: argparse.Namespace) -> dict:
    device = pick_device(args.device)
    init_single_process_group(device)
    dtype = torch.bfloat16
    spec = small_spec(args.model)
    shapes = spec.shapes()
    names = [t.name for t in unique_tensors(spec)]
    config = hf_config(args.model)
    ref = Reference(device, dtype, seed=args.seed)
    schemes = [s.strip() for s in args.schemes.split(",") if s.strip()]
    unknown = set(schemes) - set(SCHEMES)
    if unknown:
        raise SystemExit(f"--schemes: unknown {sorted(unknown)}; choose from {', '.join(SCHEMES)}")
    result: dict = {
        "script": "scripts/gpu/bench_handoff.py",
        "argv": sys.argv[1:],
        "environment": environment(device),
        "model": args.model,
        "parameters": spec.numel,
        "dtype": "bfloat16",
        "bucket_mb": args.bucket_mb,
        "warmup": args.warmup,
        "repeat": args.repeat,
        "schemes": {},
    }
    element = 2
    model_bytes = sum(t.numel for t in unique_tensors(spec)) * element
    result["model_bytes"] = model_bytes
    print(f"model {args.model}: {spec.numel / 1e9:.3f} B parameters, {model_bytes / GIB:.2f} GiB in bf16; {device}")

    bandwidth = copy_bandwidth(device, nbytes=args.bandwidth_gib * GIB)
    result["copy_bandwidth"] = bandwidth
    bw = bandwidth["bytes_per_s"]
    print(f"device copy bandwidth: {bw / 1e12:.2f} TB/s (read + write, {bandwidth['buffer_bytes'] / GIB:.1f} GiB)")

    target = empty_hf_model(config, device, dtype)
    target_params = dict(target.named_parameters())
    missing = [n for n in names if n not in target_params]
    if missing:
        raise SystemExit(f"the HF model lacks {missing[:5]} (spec and transformers disagree on names)")

    def poison() -> None:
        with torch.no_grad():
            for name in names:
                target_params[name].fill_(float("nan"))

    def record(scheme: str, timing: dict, read_bytes: int, write_bytes: int, extra: dict | None = None) -> None:
        floor = (read_bytes + write_bytes) / bw
        row = {
            **timing,
            "bytes_read": read_bytes,
            "bytes_written": write_bytes,
            "hbm_floor_s": floor,
            "x_floor": timing["seconds_median"] / floor if floor else None,
            **(extra or {}),
        }
        result["schemes"][scheme] = row
        print(
            f"  {scheme:<17} {timing['seconds_median'] * 1e3:9.2f} ms  (min {timing['seconds_min'] * 1e3:.2f})  "
            f"floor {floor * 1e3:7.2f} ms  x{row['x_floor'] or 0:.2f}  peak extra {gib(timing['peak_extra_bytes'])} GiB"
        )

    if "copy_floor" in schemes:
        flat_src = torch.empty(model_bytes // element, dtype=dtype, device=device).uniform_()
        flat_dst = torch.empty_like(flat_src)
        timing = measure(lambda: flat_dst.copy_(flat_src), device, args.warmup, args.repeat)
        del flat_src, flat_dst
        record("copy_floor", timing, model_bytes, model_bytes, {"what": "one flat copy of the model's bytes"})

    if {"pack", "pack_into", "pack_stream_only", "per_tensor_copy", "foreach_copy"} & set(schemes):
        groups = hybrid_groups(TrainLayout(tp=1, pp=1, dp=1).resolve(1), InferLayout(tp=1).resolve(1), fsdp=False)
        tic = time.perf_counter()
        shards = megatron_shards(spec, groups, 0, ref.source)
        sync(device)
        build_s = time.perf_counter() - tic
        shard_bytes = shards.nbytes
        resharder = Resharder(spec, groups, "hybridflow", bucket_bytes=int(args.bucket_mb * MB) or None)

        def pack_handoff() -> None:
            for name, tensor in resharder.stream(shards):
                target_params[name].copy_(tensor)

        def pack_stream_only() -> None:
            for _name, tensor in resharder.stream(shards):
                del tensor

        fused = sorted(k for k in shards.storage if "linear_qkv" in k or "linear_fc1" in k)
        info = {
            "training_layout": "Megatron-style tp1 pp1 (fused linear_qkv per query group, fused linear_fc1)",
            "fused_storage_tensors": len(fused),
            "shards_built_s": build_s,
        }
        if "pack" in schemes:
            poison()
            timing = measure(pack_handoff, device, args.warmup, args.repeat)
            stats = resharder.stats.to_dict()
            plan = planned_memory(spec, resharder, element, shard_bytes)
            bad = check_against_reference(target_params, names, shapes, ref) if args.verify else None
            record(
                "pack",
                timing,
                shard_bytes,
                model_bytes,
                {**info, "executor_stats": stats, "plan": plan, "mismatched": bad},
            )
        if "pack_stream_only" in schemes:
            timing = measure(pack_stream_only, device, args.warmup, args.repeat)
            record("pack_stream_only", timing, 0, 0, {"executor_stats": resharder.stats.to_dict()})
        if "pack_into" in schemes:
            poison()
            timing = measure(lambda: resharder.load_into(shards, target_params), device, args.warmup, args.repeat)
            bad = check_against_reference(target_params, names, shapes, ref) if args.verify else None
            record(
                "pack_into",
                timing,
                shard_bytes,
                model_bytes,
                {**info, "executor_stats": resharder.stats.to_dict(), "mismatched": bad},
            )
        if "per_tensor_copy" in schemes:
            generation = {name: tensor.clone() for name, tensor in resharder.stream(shards)}

            def per_tensor_copy() -> None:
                for name, tensor in generation.items():
                    target_params[name].copy_(tensor)

            poison()
            timing = measure(per_tensor_copy, device, args.warmup, args.repeat)
            bad = check_against_reference(target_params, names, shapes, ref) if args.verify else None
            record("per_tensor_copy", timing, model_bytes, model_bytes, {"tensors": len(generation), "mismatched": bad})
        if "foreach_copy" in schemes:
            if "per_tensor_copy" not in schemes:
                generation = {name: tensor.clone() for name, tensor in resharder.stream(shards)}
            dsts, srcs = [target_params[n] for n in generation], list(generation.values())
            poison()
            timing = measure(lambda: torch._foreach_copy_(dsts, srcs), device, args.warmup, args.repeat)
            bad = check_against_reference(target_params, names, shapes, ref) if args.verify else None
            record("foreach_copy", timing, model_bytes, model_bytes, {"tensors": len(generation), "mismatched": bad})
            del dsts, srcs
        if "per_tensor_copy" in schemes or "foreach_copy" in schemes:
            del generation
        del shards, resharder
        sync(device)

    for scheme, train_dtype in (("verl_bf16", torch.bfloat16), ("verl_fp32", torch.float32)):
        if scheme not in schemes or device.type != "cuda" and args.skip_verl_on_cpu:
            continue
        actor = build_fsdp_actor(config, device, train_dtype, ref)
        actor_bytes = sum(p.to_local().numel() * p.element_size() for p in actor.parameters())
        poison()
        timing = measure(
            lambda actor=actor: verl_handoff(actor, target_params, device), device, args.warmup, args.repeat
        )
        bad = check_against_reference(target_params, names, shapes, ref) if args.verify else None
        largest = max(t.numel for t in unique_tensors(spec)) * torch.empty((), dtype=train_dtype).element_size()
        record(
            scheme,
            timing,
            actor_bytes,
            model_bytes,
            {
                "training_dtype": str(train_dtype).removeprefix("torch."),
                "largest_full_tensor_bytes": largest,
                "mismatched": bad,
            },
        )
        del actor
        sync(device)
        if device.type == "cuda":
            torch.cuda.empty_cache()

    pack = result["schemes"].get("pack")
    if pack:
        plan = pack["plan"]
        measured = pack["peak_absolute_bytes"]
        plan["peak_bytes_measured"] = measured
        plan["peak_error_pct"] = pct_error(plan["peak_bytes_planned"], measured) if measured else None
        plan["extra_bytes_measured"] = pack["peak_extra_bytes"]
        if pack["peak_extra_bytes"]:
            plan["extra_error_pct"] = pct_error(plan["executor_extra_bytes_planned"], pack["peak_extra_bytes"])
        result["targets"] = {
            "pack_under_50ms": pack["seconds_median"] < 0.050,
            "pack_within_3x_floor": pack["x_floor"] <= 3.0,
            "pack_within_1.4x_floor": pack["x_floor"] <= 1.4,
        }
        if "pack_into" in result["schemes"]:
            result["targets"]["pack_into_within_1.4x_floor"] = result["schemes"]["pack_into"]["x_floor"] <= 1.4
        for scheme in ("verl_bf16", "verl_fp32"):
            if scheme in result["schemes"]:
                result["schemes"][scheme]["x_pack"] = (
                    result["schemes"][scheme]["seconds_median"] / pack["seconds_median"]
                )
    bad = {s: r.get("mismatched") for s, r in result["schemes"].items() if r.get("mismatched")}
    result["verified"] = None if not args.verify else not bad
    if bad:
        print(f"VERIFY FAILED: {bad}")
    elif args.verify:
        print("verified: every generation parameter equals its reference tensor bit for bit, for every scheme")
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="qwen2_7b", help=f"shipped config name or {', '.join(SMALL_SHAPES)}")
    parser.add_argument("--schemes", default=",".join(SCHEMES), help="comma-separated subset of " + ", ".join(SCHEMES))
    parser.add_argument("--bucket-mb", type=float, default=64.0, help="executor bucket, full MB (0: one round)")
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--repeat", type=int, default=10)
    parser.add_argument("--bandwidth-gib", type=float, default=2.0, help="buffer of the copy-bandwidth probe")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto")
    parser.add_argument("--no-verify", dest="verify", action="store_false", help="skip the bit-for-bit check")
    parser.add_argument("--skip-verl-on-cpu", action="store_true", help="CPU smoke: leave the FSDP2 schemes out")
    parser.add_argument("--json", type=Path, default=None, help="write the figures here")
    args = parser.parse_args(argv)
    result = run(args)
    write_json(args.json, result)
    return 0 if result["verified"] in (None, True) else 1


if __name__ == "__main__":
    sys.exit(main())
