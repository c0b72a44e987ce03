"""The training <-> generation switch: RNG states (saved, swapped, restored bit for bit, also on an exception), the
generation state shared by a generation TP group, weights streamed in and dropped on the way out."""

from __future__ import annotations

import gc
import random
import weakref

import numpy as np
import pytest
import torch
import torch.distributed as dist
from reshard_harness import run_world, small_spec

from hybrid_engine.groups import hybrid_groups
from hybrid_engine.layout import InferLayout, TrainLayout
from hybrid_engine.reshard import ModeSwitch, Resharder, RngState, megatron_shards, synthetic_source, synthetic_tensor


def _draw() -> tuple:
    return torch.rand(4), random.random(), np.random.rand(2)


def _same(a: tuple, b: tuple) -> bool:
    return torch.equal(a[0], b[0]) and a[1] == b[1] and np.array_equal(a[2], b[2])


def _seed_all(seed: int) -> None:
    torch.manual_seed(seed)
    random.seed(seed)
    np.random.seed(seed)


def test_training_state_restored_bit_exact_and_generation_stream_continues():
    _seed_all(123)
    expected_after = _draw()  # what training draws next when no generation happens in between
    _seed_all(123)
    before = RngState.capture()
    switch = ModeSwitch(seed=7, gen_dp_rank=3)
    with switch.generation() as context:
        first = _draw()
    assert RngState.capture().equals(before)
    assert _same(_draw(), expected_after)
    assert context.seed == 10

    _seed_all(10)
    assert _same(first, _draw())  # the generation state is seeded with seed + generation DP rank
    second_expected = _draw()
    _seed_all(999)
    with switch.generation():
        second = _draw()
    assert _same(second, second_expected)  # the next switch continues the generation stream


def test_exception_inside_restores_training_state_and_releases():
    _seed_all(5)
    before = RngState.capture()
    released = []
    switch = ModeSwitch(seed=0, gen_dp_rank=1)
    with pytest.raises(RuntimeError, match="sampler failed"):
        with switch.generation(release=lambda: released.append(True)) as context:
            context.weights["w"] = torch.ones(3)
            torch.rand(100)
            raise RuntimeError("sampler failed")
    assert RngState.capture().equals(before)
    assert released == [True] and context.weights == {}
    assert not switch.in_generation
    with switch.generation():  # usable again
        pass


class _FailingResharder:
    """Streams two tensors, then fails (a broken collective, a bad engine)."""

    stats = None

    def stream(self, shards):
        torch.rand(10)
        yield "a", torch.zeros(2)
        yield "b", torch.zeros(2)
        raise ConnectionError("peer went away")


def test_exception_while_streaming_weights_restores_training_state():
    _seed_all(6)
    before = RngState.capture()
    loaded = []
    switch = ModeSwitch(_FailingResharder(), seed=0, gen_dp_rank=0)
    with pytest.raises(ConnectionError):
        with switch.generation(object(), load_weights=lambda stream: loaded.extend(name for name, _ in stream)):
            pytest.fail("the body must not run when the weights did not arrive")
    assert loaded == ["a", "b"]
    assert RngState.capture().equals(before)


def _generation_worker(rank: int, world: int) -> dict:
    spec = small_spec("qwen2_5_0_5b_reduced")
    groups = hybrid_groups(TrainLayout(tp=4).resolve(world), InferLayout(tp=2).resolve(world))
    resharder = Resharder(spec, groups, "hybridflow")
    shards = megatron_shards(spec, groups, rank, synthetic_source(3))
    torch.manual_seed(1000 + rank)  # training states differ per rank
    random.seed(1000 + rank)
    before = RngState.capture()
    switch = ModeSwitch(resharder, seed=42)
    with switch.generation(shards) as context:
        sample = torch.rand(8)
        weights_ok = all(
            torch.equal(t, synthetic_tensor(n, spec.shapes()[n], resharder.target_box(n), seed=3))
            for n, t in context.weights.items()
        )
        names = sorted(context.weights)
        built = [t for n, t in context.weights.items() if t.data_ptr() not in _storage_ptrs(shards)]
        probe = weakref.ref(built[0])
        del built
    gc.collect()
    samples = [torch.empty(8) for _ in range(world)]
    dist.all_gather(samples, sample)
    return {
        "engine": groups.rank_info(rank).engine,
        "samples": [s.tolist() for s in samples],
        "restored": RngState.capture().equals(before),
        "weights_ok": weights_ok,
        "names_ok": names == sorted(resharder.scheme.final_names(rank)),
        "dropped": context.weights == {} and probe() is None,
        "loaded_bytes": context.stats.generation_bytes,
    }


def _storage_ptrs(shards) -> set[int]:
    return {t.data_ptr() for t in shards.storage.values()}


@pytest.mark.slow
def test_generation_tp_peers_share_the_generation_state():
    """tp4 -> tp2 on 4 processes: engines {0, 2} and {1, 3}; each engine's ranks draw alike, the two engines not."""
    results = run_world(_generation_worker, 4)
    samples = results[0]["samples"]
    engines = [r["engine"] for r in results]
    assert engines == [0, 1, 0, 1]
    assert samples[0] == samples[2] and samples[1] == samples[3]
    assert samples[0] != samples[1]
    for r in results:
        assert r["restored"] and r["weights_ok"] and r["names_ok"] and r["dropped"]
        assert r["loaded_bytes"] > 0
