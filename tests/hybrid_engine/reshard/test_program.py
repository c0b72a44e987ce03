"""The executor's compiled copy programs (``hybrid_engine.reshard.program``) and its batched hand-off (``load_into``).

Without processes: for every scheme, rank, bucket and step of several layouts, a program's outputs equal the per-part
copies of ``packing.allocate_outputs`` (which the simulation, checked against the full model, uses) bit for bit, with
the same segments; the q/k/v rows of Megatron's fused ``linear_qkv`` are read with one strided copy per tensor, not
one per query group; a program notices storage whose strides moved. With real gloo processes (world size 1 and 2):
``stream`` and ``load_into`` give the reference weights bit for bit, switch after switch, and at world size 1
``load_into`` writes straight into the targets (no new tensors).
"""

from __future__ import annotations

import pytest
import torch
from reshard_harness import run_world, small_spec

from hybrid_engine.groups import hybrid_groups
from hybrid_engine.layout import InferLayout, TrainLayout
from hybrid_engine.model_spec import arch_from_config, build_spec
from hybrid_engine.reshard import Resharder, Scheme, fsdp_shards, make_buckets, megatron_shards, synthetic_source
from hybrid_engine.reshard.packing import allocate_outputs
from hybrid_engine.reshard.program import compile_bucket
from hybrid_engine.reshard.shards import LocalShards, synthetic_tensor, unique_tensors

SEED = 3

# Qwen2-7B's head structure (28 heads over 4 kv heads: 7 q heads per query group, qkv bias) at toy width
QWEN7B_HEADS = {
    "model_type": "qwen2",
    "hidden_size": 56,
    "intermediate_size": 96,
    "num_hidden_layers": 2,
    "num_attention_heads": 28,
    "num_key_value_heads": 4,
    "vocab_size": 128,
    "tie_word_embeddings": False,
}


def _spec(name: str):
    if name == "qwen7b_heads":
        return build_spec(arch_from_config(dict(QWEN7B_HEADS), name), "analytic")
    return small_spec(name)


def _groups(t: int, p: int, t_g: int):
    world = t * p
    return hybrid_groups(TrainLayout(tp=t, pp=p, dp=1).resolve(world), InferLayout(tp=t_g).resolve(world), fsdp=False)


def _shards(scheme: Scheme, rank: int, source) -> LocalShards:
    if scheme.source_kind == "megatron":
        return megatron_shards(scheme.spec, scheme.groups, rank, source)
    return fsdp_shards(scheme.spec, scheme.world, rank, source)


LAYOUTS = [
    pytest.param("qwen7b_heads", (1, 1, 1), ("hybridflow", "full_gather"), id="7b-heads-world1"),
    pytest.param("qwen2_5_0_5b_reduced", (2, 1, 1), ("hybridflow", "tp_group_gather", "full_gather"), id="tp2-tp1"),
    pytest.param("qwen2_5_0_5b_reduced", (4, 2, 2), ("hybridflow", "tp_group_gather"), id="tp4pp2-tp2"),
    pytest.param("qwen2_5_0_5b_reduced", (8, 1, 4), ("hybridflow",), id="tp8-tp4-kv-replicated"),
    pytest.param("llama_untied", (2, 2, 1), ("hybridflow", "tp_group_gather"), id="tp2pp2-tp1-untied"),
]


@pytest.mark.parametrize(("model", "layout", "schemes"), LAYOUTS)
def test_programs_equal_the_per_part_copies_bit_for_bit(model, layout, schemes):
    t, p, t_g = layout
    spec = _spec(model)
    groups = _groups(t, p, t_g)
    source = synthetic_source(SEED, torch.bfloat16)
    compared = 0
    for name in schemes:
        scheme = Scheme(name, spec, groups)
        for rank in range(groups.world_size):
            shards = _shards(scheme, rank, source)
            for bucket in make_buckets(spec, 16 << 10, 2, scheme.pipeline_stages):
                compared += _compare_bucket(scheme, rank, bucket, shards)
    assert compared > 0


def _compare_bucket(scheme: Scheme, rank: int, bucket, shards: LocalShards) -> int:
    """Run every step of ``bucket`` both ways; the rank's own parts must agree (the rest is what the collectives
    fill, uninitialised here). Returns the regions compared."""
    compared = 0
    previous_new = previous_old = shards
    for index, step in enumerate(scheme.steps):
        new_sources = shards if step.source == "shards" else previous_new
        old_sources = shards if step.source == "shards" else previous_old
        program = compile_bucket(scheme, index, rank, bucket, new_sources)
        new, new_bytes = program.run(new_sources, torch.bfloat16, "cpu")
        old, old_bytes = allocate_outputs(scheme, index, rank, bucket, old_sources, torch.bfloat16, "cpu")
        assert sorted(new.storage) == sorted(old.storage), (scheme.name, rank, bucket)
        assert new.segments == old.segments
        assert new_bytes == old_bytes
        for tensor_name in old.storage:
            assert new.storage[tensor_name].is_contiguous()
            for segment in shards.segments.get(tensor_name, ()) if step.source == "shards" else ():
                box = _overlap(segment.box, new.segments[tensor_name][0].box)
                if box is not None:
                    assert torch.equal(new.extract(tensor_name, box), old.extract(tensor_name, box))
                    compared += 1
        previous_new, previous_old = new, old
    return compared


def _overlap(a, b):
    box = tuple((max(a_lo, b_lo), min(a_hi, b_hi)) for (a_lo, a_hi), (b_lo, b_hi) in zip(a, b, strict=True))
    return box if all(lo < hi for lo, hi in box) else None


def test_fused_qkv_is_read_with_one_strided_copy_per_tensor():
    spec = _spec("qwen7b_heads")
    groups = _groups(1, 1, 1)
    scheme = Scheme("hybridflow", spec, groups)
    shards = megatron_shards(spec, groups, 0, synthetic_source(SEED, torch.bfloat16))
    layer = [t.name for t in unique_tensors(spec) if t.layer == 0]
    program = compile_bucket(scheme, 0, 0, layer, shards)
    # q, k, v weights and biases: new tensors, one copy each (4 query groups would be 4 copies each, 24 in all)
    assert program.copies == 6
    outputs, nbytes = program.run(shards, torch.bfloat16, "cpu")
    assert nbytes == sum(outputs.storage[n].numel() * 2 for n in layer if "self_attn" in n and "o_proj" not in n)
    for name in layer:
        expected = synthetic_tensor(name, spec.shapes()[name], outputs.segments[name][0].box, seed=SEED)
        assert torch.equal(outputs.storage[name], expected.to(torch.bfloat16)), name
    # o_proj, gate, up, down and the norms are views of the training storage: no copy
    storage_ptrs = {t.data_ptr() for t in shards.storage.values()}
    fc1 = next(t for k, t in shards.storage.items() if k.endswith("linear_fc1.weight"))
    up = next(n for n in layer if n.endswith("up_proj.weight"))
    assert outputs.storage[up].data_ptr() == fc1.data_ptr() + fc1.shape[0] // 2 * fc1.shape[1] * 2
    assert outputs.storage[next(n for n in layer if n.endswith("o_proj.weight"))].data_ptr() in storage_ptrs


def test_a_program_notices_storage_whose_strides_moved():
    spec = _spec("qwen7b_heads")
    groups = _groups(1, 1, 1)
    scheme = Scheme("hybridflow", spec, groups)
    shards = megatron_shards(spec, groups, 0, synthetic_source(SEED))
    layer = [t.name for t in unique_tensors(spec) if t.layer == 0]
    program = compile_bucket(scheme, 0, 0, layer, shards)
    assert program.matches(shards)
    key = next(k for k in shards.storage if k.endswith("linear_qkv.weight"))
    moved = shards.storage[key].t().contiguous().t()  # same shape and values, column-major
    changed = LocalShards(kind="megatron", rank=0, storage={**shards.storage, key: moved}, segments=shards.segments)
    assert not program.matches(changed)
    again = compile_bucket(scheme, 0, 0, layer, changed)
    assert again.matches(changed)
    a, _ = program.run(shards, torch.float32, "cpu")
    b, _ = again.run(changed, torch.float32, "cpu")
    assert all(torch.equal(a.storage[n], b.storage[n]) for n in layer)


# -- real processes ----------------------------------------------------------------------------------------------


def _handoff(rank: int, world: int, model: str, t: int, t_g: int) -> dict:
    spec = _spec(model)
    groups = _groups(t, 1, t_g)
    shards = megatron_shards(spec, groups, rank, synthetic_source(SEED, torch.bfloat16))
    resharder = Resharder(spec, groups, "hybridflow", bucket_bytes=8 << 10)

    def reference(name):
        box = resharder.target_box(name)
        return synthetic_tensor(name, spec.shapes()[name], box, seed=SEED, dtype=torch.bfloat16)

    names = resharder.scheme.final_names(rank)
    targets = {name: torch.full(reference(name).shape, float("nan"), dtype=torch.bfloat16) for name in names}
    report = {"streamed_bad": [], "loaded_bad": [], "errors": []}
    for _ in range(3):  # switch after switch: the compiled programs replayed
        streamed = dict(resharder.stream(shards))
        report["streamed_bad"] += [n for n in names if not torch.equal(streamed[n], reference(n))]
        report["stream_extra"] = resharder.stats.peak_extra_bytes
        for tensor in targets.values():
            tensor.fill_(float("nan"))
        resharder.load_into(shards, targets)
        report["loaded_bad"] += [n for n in names if not torch.equal(targets[n], reference(n))]
        report["load_extra"] = resharder.stats.peak_extra_bytes
    report["streamed"] = sorted(streamed) == sorted(names)
    report["copies"] = resharder.stats.tensors
    report["generation_bytes"] = resharder.stats.generation_bytes
    report["expected_bytes"] = sum(reference(n).numel() * 2 for n in names)
    report["received"], report["planned"] = resharder.stats.received_bytes, resharder.planned(2).received
    strided = {**targets, names[1]: torch.empty(tuple(reversed(targets[names[1]].shape))).t()}
    for bad_targets in (
        {n: v for n, v in list(targets.items())[1:]},
        {**targets, names[0]: torch.empty(1, 1)},
        strided,
    ):
        try:
            resharder.load_into(shards, bad_targets)
        except (KeyError, ValueError) as error:
            report["errors"].append(str(error))
    return report


@pytest.mark.parametrize(
    ("world", "model", "t", "t_g"),
    [pytest.param(1, "qwen7b_heads", 1, 1, id="world1-7b-heads"), pytest.param(2, "llama_untied", 2, 1, id="tp2-tp1")],
)
def test_stream_and_load_into_are_bit_exact_switch_after_switch(world, model, t, t_g):
    reports = run_world(_handoff, world, model, t, t_g)
    for rank, report in enumerate(reports):
        assert report["streamed"], rank
        assert report["streamed_bad"] == [] and report["loaded_bad"] == [], (rank, report)
        assert report["received"] == report["planned"]
        assert report["copies"] == len(_spec(model).tensors) - sum(1 for x in _spec(model).tensors if x.tied_to)
        missing, wrong, strided = report["errors"]
        assert "the targets lack 1 generation tensors" in missing
        assert "target shapes differ" in wrong and "(1, 1)" in wrong
        assert "targets must be contiguous" in strided
        assert report["generation_bytes"] == report["expected_bytes"]
    if world == 1:
        # the stream builds q/k/v out of the fused rows; load_into writes them straight into the targets
        assert reports[0]["stream_extra"] > 0 and reports[0]["load_extra"] == 0
    else:
        assert reports[0]["received"] > 0 and reports[0]["load_extra"] > 0  # gathered: streamed, then copied


def _feeder_syncs(rank: int, world: int, syncs: int) -> dict:
    from reshard_harness import fully_sharded_tiny_model

    from hybrid_engine.reshard import executor, rollout_weight_stream

    _, model, full = fully_sharded_tiny_model(world, SEED)
    config = model.config.to_dict()
    report = {"bad": [], "names": [], "cached": [], "programs": []}
    for _ in range(syncs):
        outputs = dict(rollout_weight_stream(model.state_dict(), rollout_world_size=world, hf_config=config))
        report["bad"] += [n for n, t in outputs.items() if not torch.equal(t, full[n])]
        report["names"].append(len(outputs))
        (resharder,) = executor._FEEDER_RESHARDERS.values()
        report["cached"].append(id(resharder))
        report["programs"].append(len(resharder._programs))
    return report


@pytest.mark.slow  # 7.5-8.7 s on 2 cores (CI, 2026-12-05)
def test_weight_syncs_reuse_one_resharder_and_its_compiled_programs():
    reports = run_world(_feeder_syncs, 2, 3)
    feeder, other = reports
    assert feeder["bad"] == [] and feeder["names"] == [26, 26, 26] and other["names"] == [0, 0, 0]
    for report in reports:
        assert len(set(report["cached"])) == 1  # the same resharder on every sync
        assert report["programs"][0] > 0 and len(set(report["programs"])) == 1  # compiled on the first sync only
