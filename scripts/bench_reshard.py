"""Benchmark the 3D-HybridEngine resharding against its baselines in one run, and set the planner's bytes beside it.

    python scripts/bench_reshard.py                                   # qwen2_5_0_5b, tp4pp2 -> tp2, 8 processes
    python scripts/bench_reshard.py --model tiny --layout tp4:tp2 --verify
    python scripts/bench_reshard.py --layout fsdp:tp2 --nproc 8

Spawns N processes (gloo on CPU; NCCL when CUDA has at least N GPUs), builds each rank's training shards from
deterministic weights (``synthetic_source``: no rank builds a tensor it does not hold), runs every applicable scheme
(Megatron layouts: hybridflow, tp_group_gather, full_gather from FSDP2 Shard(0) shards; FSDP layouts: fsdp_to_tp,
full_gather) ``--repeat`` times, and prints per scheme: bytes received per rank (measured and planned), time (the
slowest rank, median over repeats), peak extra memory, the ratios to full_gather, and the cost of the weight
sync's check (the checksums of hybrid_engine/reshard/checksum.py on both sides, per sync).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from reshard_harness import SMALL_SHAPES, run_world, small_spec  # noqa: E402

from hybrid_engine.groups import HybridGroups, hybrid_groups  # noqa: E402
from hybrid_engine.layout import InferLayout, TrainLayout  # noqa: E402
from hybrid_engine.reshard import (  # noqa: E402
    Resharder,
    fsdp_shards,
    megatron_shards,
    synthetic_source,
    synthetic_tensor,
)
from hybrid_engine.reshard.checksum import ChecksumBatch, checksums, wrap  # noqa: E402

DTYPES = {"bf16": torch.bfloat16, "fp32": torch.float32, "fp16": torch.float16}
MB = 1 << 20


def parse_layout(text: str, nproc: int | None) -> tuple[TrainLayout, InferLayout, bool]:
    """``tp8pp4:tp4``, ``tp4pp2dp2:tp2``, ``fsdp:tp2`` -> (train, infer, fsdp)."""
    if ":" not in text:
        raise SystemExit(f"--layout {text!r}: write TRAIN:INFER, e.g. tp8pp4:tp4 or fsdp:tp2")
    train_text, infer_text = text.split(":", 1)

    def degrees(part: str, allowed: str) -> dict[str, int]:
        found = dict((axis, int(value)) for axis, value in re.findall(r"(tp|pp|dp)(\d+)", part))
        if re.sub(r"(tp|pp|dp)\d+", "", part) or not set(found) <= set(allowed.split(",")):
            raise SystemExit(f"--layout: cannot read {part!r} (use tp<N>, pp<N>{', dp<N>' if 'dp' in allowed else ''})")
        return found

    infer = degrees(infer_text, "tp,pp")
    if train_text == "fsdp":
        world = nproc or 8
        return TrainLayout(dp=world), InferLayout(**infer).resolve(world), True
    train = degrees(train_text, "tp,pp,dp")
    model_parallel = train.get("tp", 1) * train.get("pp", 1)
    world = nproc or model_parallel * train.get("dp", 1)
    train_layout = TrainLayout(**train).resolve(world)
    return train_layout, InferLayout(**infer).resolve(world), False


def schemes_for(groups: HybridGroups) -> list[str]:
    return ["fsdp_to_tp", "full_gather"] if groups.fsdp else ["hybridflow", "tp_group_gather", "full_gather"]


def worker(rank: int, world: int, args: argparse.Namespace) -> dict:
    """One rank: build its training shards, run every scheme ``--repeat`` times, return its measurements."""
    device = torch.device("cuda", rank) if args.device == "cuda" else torch.device("cpu")
    train, infer, fsdp = parse_layout(args.layout, world)
    groups = hybrid_groups(train, infer, fsdp=fsdp)
    spec = small_spec(args.model)
    dtype = DTYPES[args.dtype]
    source = synthetic_source(args.seed, dtype)
    result: dict = {"rank": rank, "schemes": {}, "build_s": {}}
    shards = {}
    for scheme in schemes_for(groups):
        kind = "megatron" if scheme in ("hybridflow", "tp_group_gather") else "fsdp"
        if kind not in shards:
            tic = time.perf_counter()
            built = (
                megatron_shards(spec, groups, rank, source)
                if kind == "megatron"
                else fsdp_shards(spec, world, rank, source)
            )
            built.storage = {key: tensor.to(device) for key, tensor in built.storage.items()}
            shards[kind] = built
            result["build_s"][kind] = time.perf_counter() - tic
        resharder = Resharder(spec, groups, scheme, bucket_bytes=int(args.bucket_mb * MB) or None)
        runs, mismatched = [], []
        for repeat in range(args.repeat):
            dist.barrier()
            tic = time.perf_counter()
            for name, tensor in resharder.stream(shards[kind]):
                if args.verify and repeat == 0:
                    expected = synthetic_tensor(
                        name, spec.shapes()[name], resharder.target_box(name), seed=args.seed, dtype=dtype
                    )
                    if not torch.equal(tensor.cpu(), expected):
                        mismatched.append(name)
                del tensor
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            elapsed = time.perf_counter() - tic
            runs.append({"elapsed": elapsed, **resharder.stats.to_dict()})
        planned = resharder.planned(torch.empty((), dtype=dtype).element_size())
        result["schemes"][scheme] = {
            "runs": runs,
            "planned": planned.received,
            "planned_all": list(planned.received_all),
            "planned_phase_max": planned.phase_max,
            "planned_by_tensor_ok": all(resharder.stats.by_tensor.get(n, 0) == b for n, b in planned.by_tensor.items()),
            "model_bytes": planned.model_bytes,
            "mismatched": mismatched,
        }
        result["schemes"][scheme]["checksum"] = checksum_cost(resharder, shards[kind], device)
        del resharder
    return result


def checksum_cost(resharder: Resharder, shards, device: torch.device) -> dict:
    """The sync check's cost on this rank (hybrid_engine/reshard/checksum.py): the training side (this rank's
    shards, then one all-reduce of the [tensors, 3] sums over every rank's tensor names) and the generation side
    (every tensor the stream yields; this extra pass is not in the reshard's time)."""
    held: list = [None] * dist.get_world_size()
    dist.all_gather_object(held, sorted(shards.storage))  # pipeline stages hold different tensors
    names = sorted(set().union(*held))
    dist.barrier()
    tic = time.perf_counter()
    _, sums = checksums(shards.storage, names)
    dist.all_reduce(sums)
    wrap(sums)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    train_s = time.perf_counter() - tic
    generation_s, tensors, batch = 0.0, 0, ChecksumBatch()  # as the generation side takes them: batched
    for _, tensor in resharder.stream(shards):
        tic = time.perf_counter()
        batch.add(tensor)
        generation_s += time.perf_counter() - tic
        tensors += 1
    tic = time.perf_counter()
    if tensors:
        batch.result()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    generation_s += time.perf_counter() - tic
    return {"train_s": train_s, "generation_s": generation_s, "train_tensors": len(shards.storage),
            "generation_tensors": tensors}


def _mb(nbytes: float) -> str:
    return f"{nbytes / MB:,.1f}"


def report(args: argparse.Namespace, world: int, results: list[dict], backend: str, wall: float) -> dict:
    train, infer, fsdp = parse_layout(args.layout, world)
    groups = hybrid_groups(train, infer, fsdp=fsdp)
    spec = small_spec(args.model)
    schemes = schemes_for(groups)
    summary: dict = {
        "model": args.model,
        "layout": args.layout,
        "world": world,
        "backend": backend,
        "bucket_mb": args.bucket_mb,
        "repeat": args.repeat,
        "dtype": args.dtype,
        "schemes": {},
    }
    for scheme in schemes:
        per_rank = [r["schemes"][scheme] for r in results]
        measured = [p["runs"][0]["received_bytes"] for p in per_rank]
        wire = [p["runs"][0]["wire_bytes"] for p in per_rank]
        planned = per_rank[0]["planned_all"]
        times = [max(p["runs"][i]["elapsed"] for p in per_rank) for i in range(args.repeat)]
        phases = {}
        for p in per_rank:
            for phase in p["runs"][0]["phases"]:
                phases[phase["name"]] = max(phases.get(phase["name"], 0), phase["received_bytes"])
        summary["schemes"][scheme] = {
            "received_max": max(measured),
            "received_min": min(measured),
            "planned_max": max(planned),
            "measured_equals_planned": measured == planned
            and all(p["planned_by_tensor_ok"] for p in per_rank)
            and all(phases.get(n, 0) == b for n, b in per_rank[0]["planned_phase_max"].items()),
            "wire_max": max(wire),
            "time_s": statistics.median(times),
            "times_s": times,
            "peak_extra_max": max(p["runs"][-1]["peak_extra_bytes"] for p in per_rank),
            "peak_cuda_max": max((p["runs"][-1]["peak_cuda_bytes"] or 0) for p in per_rank) or None,
            "generation_max": max(p["runs"][0]["generation_bytes"] for p in per_rank),
            "phases": max((p["runs"][0]["phases"] for p in per_rank), key=lambda ph: sum(x["seconds"] for x in ph)),
            "mismatched": sorted({n for p in per_rank for n in p["mismatched"]}),
            "checksum": {key: max(p["checksum"][key] for p in per_rank) for key in per_rank[0]["checksum"]},
        }
    model_bytes = results[0]["schemes"][schemes[0]]["model_bytes"]
    full = summary["schemes"]["full_gather"]
    print(
        f"model {args.model}: {spec.numel / 1e6:,.1f}M parameters, {_mb(model_bytes)} MB in {args.dtype}; "
        f"layout {args.layout} on {world} ranks (t={groups.t} p={groups.p} d={groups.d} -> t_g={groups.t_g} "
        f"p_g={groups.p_g}, micro-DP size d_g={groups.d_g}); {backend}; bucket {args.bucket_mb} MB; "
        f"repeat {args.repeat}"
    )
    build = max(max(r["build_s"].values()) for r in results)
    print(f"training shards built in {build:.1f} s per rank (deterministic weights); whole run {wall:.1f} s")
    header = (
        f"{'scheme':<16} {'recv/rank MB (max)':>18} {'planned MB':>11} {'=plan':>6} {'wire MB':>9} "
        f"{'time s':>8} {'peak extra MB':>14} {'gen shard MB':>13} {'bytes vs full':>14} {'speed vs full':>14} "
        f"{'memory vs full':>15}"
    )
    print(header)
    print("-" * len(header))
    for scheme, row in summary["schemes"].items():
        bytes_ratio = full["received_max"] / row["received_max"] if row["received_max"] else float("inf")
        time_ratio = full["time_s"] / row["time_s"] if row["time_s"] else float("inf")
        memory_ratio = row["peak_extra_max"] / full["peak_extra_max"] if full["peak_extra_max"] else 0.0
        row.update(bytes_fewer_than_full=bytes_ratio, faster_than_full=time_ratio, memory_vs_full=memory_ratio)
        print(
            f"{scheme:<16} {_mb(row['received_max']):>18} {_mb(row['planned_max']):>11} "
            f"{'yes' if row['measured_equals_planned'] else 'NO':>6} {_mb(row['wire_max']):>9} "
            f"{row['time_s']:>8.2f} {_mb(row['peak_extra_max']):>14} {_mb(row['generation_max']):>13} "
            f"{bytes_ratio:>13.2f}x {time_ratio:>13.2f}x {memory_ratio:>14.3f}x"
        )
    zero = "fsdp_to_tp" if groups.fsdp else "hybridflow"
    if not groups.fsdp:
        formula = f"(N-1)/(d_g-1) = {world - 1}/{groups.d_g - 1}" if groups.d_g > 1 else "(nothing moves)"
        print(f"formula: full_gather / hybridflow bytes = {formula}")
    print(
        f"{zero} peak extra memory vs full_gather: {summary['schemes'][zero]['memory_vs_full']:.3f} (1/t_g = "
        f"{1 / groups.t_g:.3f})"
    )
    print("per phase (slowest rank, first run): received MB, wire MB, collectives, s pack/comm/unpack/assemble")
    for scheme, row in summary["schemes"].items():
        for phase in row["phases"]:
            counts = phase["collectives"]
            collectives = (
                f"ag={counts['all_gather']} (in place {counts['in_place']}) bc={counts['broadcast']} "
                f"p2p={counts['p2p_messages']}"
            )
            seconds = "/".join(f"{phase[key]:.2f}" for key in ("pack_s", "comm_s", "unpack_s", "assemble_s"))
            print(
                f"  {scheme:<16} {phase['name']:<34} {_mb(phase['received_bytes']):>9} {_mb(phase['wire_bytes']):>9} "
                f"{collectives}  {seconds}"
            )
    print("sync check per sync (hybrid_engine/reshard/checksum.py; slowest rank): training side (its shards + one "
          "all-reduce), generation side (every tensor it receives), share of the reshard's time")
    for scheme, row in summary["schemes"].items():
        check = row["checksum"]
        total = check["train_s"] + check["generation_s"]
        share = total / row["time_s"] if row["time_s"] else float("inf")
        print(f"  {scheme:<16} training {check['train_s'] * 1e3:8.2f} ms ({check['train_tensors']} tensors)  "
              f"generation {check['generation_s'] * 1e3:8.2f} ms ({check['generation_tensors']} tensors)  "
              f"{share:6.1%} of {row['time_s']:.2f} s")
    for scheme, row in summary["schemes"].items():
        if row["mismatched"]:
            print(f"VERIFY FAILED {scheme}: {row['mismatched'][:5]}")
        elif args.verify:
            print(f"verified {scheme}: every rank's generation tensors equal the reference slices bit for bit")
    return summary


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "--model",
        default="qwen2_5_0_5b",
        help=f"shipped config name (tiny, qwen2_5_0_5b, ...) or {', '.join(SMALL_SHAPES)}",
    )
    parser.add_argument("--layout", default="tp4pp2:tp2", help="TRAIN:INFER, e.g. tp8pp4:tp4, tp4:tp2, fsdp:tp2")
    parser.add_argument("--nproc", type=int, default=None, help="processes (default: the layout's tp*pp*dp; fsdp 8)")
    parser.add_argument("--bucket-mb", type=float, default=64.0, help="full MB of tensors per round (0: one round)")
    parser.add_argument("--repeat", type=int, default=2, help="runs of each scheme (time: median)")
    parser.add_argument("--dtype", choices=sorted(DTYPES), default="bf16")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto")
    parser.add_argument("--verify", action="store_true", help="check every generation tensor bit for bit")
    parser.add_argument("--json", type=Path, default=None, help="write the summary here")
    args = parser.parse_args(argv)
    train, infer, _ = parse_layout(args.layout, args.nproc)
    world = train.world_size
    if args.device == "auto":
        args.device = "cuda" if torch.cuda.is_available() and torch.cuda.device_count() >= world else "cpu"
    if args.device == "cuda" and torch.cuda.device_count() < world:
        raise SystemExit(f"--device cuda needs {world} GPUs, found {torch.cuda.device_count()}")
    backend = "nccl on CUDA" if args.device == "cuda" else f"gloo on CPU ({os.cpu_count()} cores)"
    tic = time.perf_counter()
    results = run_world(worker, world, args, backend="nccl" if args.device == "cuda" else "gloo")
    wall = time.perf_counter() - tic
    summary = report(args, world, results, backend, wall)
    if args.json:
        args.json.write_text(json.dumps(summary, indent=2))
    ok = all(row["measured_equals_planned"] and not row["mismatched"] for row in summary["schemes"].values())
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
