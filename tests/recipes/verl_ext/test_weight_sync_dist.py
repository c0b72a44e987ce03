"""The hf rollout's weight sync through the resharder, on 2 real gloo processes with a real FSDP2 module.

Each process holds the tiny Qwen2 under ``fully_shard`` (as verl's FSDP2 engine does), exports it the way the patched
``FSDPEngine.get_per_tensor_param`` does (``weight_sync.export_sharded``: verl's lazy generator with the state dict
beside it) and calls the real ``HFRolloutAdapter.update_weights`` against a stand-in server that records what it is
sent. Asserted, per rollout layout:

- rollout tp2 (one replica of both ranks): rank 0 hands the server every tensor, bit-equal to the full model; rank 1
  sends nothing and receives 0 bytes; rank 0 receives exactly the planner's bytes, the model minus its own rows;
- rollout tp1 (a replica per rank): both ranks feed a server with the full model;
- verl's generator (``full_tensor()`` on every rank) is never started on either path;
- a state dict the executor cannot take (a tensor the model spec does not know) falls back to verl's generator on
  both ranks, with the reason recorded, and the server still gets the full model;
- every rank's record lands in ``$KLPPO_SYNC_LOG`` (two processes appending to one file);
- the sync check: the training side's checksums (FSDP2 rows of both ranks, all-reduced) equal the server's of the
  full tensors, and a tensor the hand-off changed stops the sync on the feeder, named;
- the buckets follow verl's ``rollout.update_weights_bucket_megabytes``.
"""

from __future__ import annotations

import asyncio
import os
from types import SimpleNamespace

import pytest
import torch
import torch.distributed as dist
from reshard_harness import fully_sharded_tiny_model, run_world

from hybrid_engine.reshard.checksum import checksums
from recipes.verl_ext.plugin.packed_weights import unpack
from recipes.verl_ext.plugin.weight_sync import SYNC_LOG_ENV, SyncCheckFailed, read_sync_log

SEED = 5


class _Server:
    """Records the hf server calls the adapter makes (``.remote(...)`` returns an awaitable); ``update_weights``
    answers as the real server does, with the checksums of what it loaded (``corrupt``: one tensor's sum is off, as
    if the hand-off had changed it)."""

    def __init__(self, corrupt: str | None = None):
        self.calls = []
        self.corrupt = corrupt

    def __getattr__(self, name):
        calls, corrupt = self.calls, self.corrupt

        class _Method:
            @staticmethod
            async def remote(*args):
                calls.append((name, args))
                if name != "update_weights":
                    return None
                names, sums = checksums(unpack(args[0]))  # the adapter sends one packed buffer, as to Ray
                loaded = {n: tuple(row) for n, row in zip(names, sums.tolist(), strict=True)}
                if corrupt in loaded:
                    loaded[corrupt] = (loaded[corrupt][0] + 1, *loaded[corrupt][1:])
                return loaded

        return _Method


def _verl_generator(state_dict, started: list):
    """verl 0.9.1's export for FSDP2: every rank all-gathers every tensor (``full_tensor()``) as it is yielded."""
    started.append(True)
    for name, tensor in state_dict.items():
        yield name, tensor.full_tensor() if hasattr(tensor, "full_tensor") else tensor


def _sync(rank: int, world: int, log_path: str) -> list[dict]:
    from recipes.verl_ext.plugin.hf_rollout import HFRolloutAdapter
    from recipes.verl_ext.plugin.weight_sync import export_sharded

    os.environ["RANK"] = str(rank)
    os.environ[SYNC_LOG_ENV] = log_path
    config, model, full = fully_sharded_tiny_model(world, SEED)
    engine = SimpleNamespace(
        module=model, model_config=SimpleNamespace(hf_config=model.config), _qat_enabled=False, _is_offload_param=False
    )

    # what a rank lacks of the model, by hand: every tensor but a tied lm_head, minus the rows it holds
    lacking = sum(
        (value.numel() - value.to_local().numel()) * value.element_size()
        for name, value in model.state_dict().items()
        if not (config.get("tie_word_embeddings") and name == "lm_head.weight")
    )
    results = []
    for case, tp, break_spec in (
        ("one-replica", world, False),
        ("replica-per-rank", 1, False),
        ("fallback", world, True),
        ("corrupted", world, False),
    ):
        rollout = SimpleNamespace(
            tensor_model_parallel_size=tp,
            data_parallel_size=1,
            pipeline_model_parallel_size=1,
            update_weights_bucket_megabytes=0.1,  # ~100 kB buckets: the tiny model's 0.3 MB in several rounds
        )
        adapter = HFRolloutAdapter(rollout, SimpleNamespace(), device_mesh=None)
        adapter._server = server = _Server(corrupt="model.layers.0.self_attn.q_proj.weight" if case == "corrupted"
                                           else None)
        started: list = []
        weights = export_sharded(engine, _verl_generator(model.state_dict(), started))
        if break_spec:
            weights.state_dict["model.unknown_buffer"] = torch.zeros(3)
        try:
            asyncio.run(adapter.update_weights(weights, global_steps=3))
            error = None
        except SyncCheckFailed as failed:
            error = str(failed)
        sent = [args for name, args in server.calls if name == "update_weights"]
        state = unpack(sent[0][0]) if sent else None
        results.append(
            {
                "case": case,
                "rank": rank,
                "exported": type(weights).__name__,
                "verl_generator_started": bool(started),
                "sent": state is not None,
                "steps": sent[0][1] if sent else None,
                "names": sorted(state) if state else [],
                "mismatched": [n for n, t in (state or {}).items() if not torch.equal(t, full[n])],
                "tied": bool(config.get("tie_word_embeddings")),
                "model_names": sorted(full),
                "lacking": lacking,
                "error": error,
            }
        )
        dist.barrier()
    return results


pytestmark = pytest.mark.slow  # two gloo processes, each importing verl and torch


@pytest.fixture(scope="module")
def synced(tmp_path_factory):
    log = tmp_path_factory.mktemp("weight_sync") / "weight_sync.jsonl"
    results = [record for rank in run_world(_sync, 2, str(log)) for record in rank]
    return {(r["case"], r["rank"]): r for r in results}, read_sync_log(log)


def _log(records, scheme_case: int, rank: int) -> dict:
    """The sync log line of the ``scheme_case``-th sync (0, 1, 2) of ``rank``."""
    return [r for r in records if r["rank"] == rank][scheme_case]


def _expected_names(result) -> list[str]:
    names = result["model_names"]
    return [n for n in names if not (result["tied"] and n == "lm_head.weight")]


def test_one_replica_only_the_feeder_receives_the_model(synced):
    results, log = synced
    feeder, other = results[("one-replica", 0)], results[("one-replica", 1)]
    assert feeder["exported"] == "ShardedWeights" and feeder["sent"] and feeder["steps"] == 3
    assert feeder["names"] == _expected_names(feeder) and feeder["mismatched"] == []
    assert not other["sent"]
    assert not feeder["verl_generator_started"] and not other["verl_generator_started"]
    rank0, rank1 = _log(log, 0, 0), _log(log, 0, 1)
    assert rank0["scheme"] == rank1["scheme"] == "gather_to_feeders"
    assert rank0["feeder"] and not rank1["feeder"]
    # measured at the collectives == planned == what the feeder lacks, counted by hand; the other rank: nothing
    assert rank0["received_bytes"] == rank0["planned_bytes"] == feeder["lacking"] > 0
    assert rank1["received_bytes"] == rank1["planned_bytes"] == 0
    # verl's path: every rank gathers all it lacks, the tied lm_head a second time
    for line, result in ((rank0, feeder), (rank1, other)):
        assert line["full_tensor_bytes"] > result["lacking"]
    assert rank0["tensors"] == len(feeder["names"]) and rank1["tensors"] == 0
    # verl's rollout.update_weights_bucket_megabytes (0.1 here) sets the rounds: the sync ran in several buckets
    assert rank0["extra"]["buckets"] == rank1["extra"]["buckets"] > 1


def test_a_replica_per_rank_feeds_both_servers(synced):
    results, log = synced
    for rank in (0, 1):
        result = results[("replica-per-rank", rank)]
        assert result["sent"] and result["names"] == _expected_names(result) and result["mismatched"] == []
        assert not result["verl_generator_started"]
        line = _log(log, 1, rank)
        assert line["feeder"] and line["received_bytes"] == line["planned_bytes"] == result["lacking"]


def test_a_state_dict_the_executor_cannot_take_falls_back_to_verls_stream(synced):
    results, log = synced
    feeder, other = results[("fallback", 0)], results[("fallback", 1)]
    assert feeder["verl_generator_started"] and other["verl_generator_started"]
    assert feeder["sent"] and feeder["mismatched"] == [] and not other["sent"]
    for rank in (0, 1):
        line = _log(log, 2, rank)
        assert line["scheme"] == "verl_full_tensor" and "model.unknown_buffer" in line["fallback_reason"]
        assert line["received_bytes"] is None


def test_every_sync_is_checked_by_checksum_on_both_sides(synced):
    results, log = synced
    rank0, rank1 = _log(log, 0, 0), _log(log, 0, 1)
    # the training side's checksums (each rank's FSDP2 rows, one all-reduce) equal those of the full tensors the
    # server holds, tensor by tensor; the other rank checks its side only
    assert rank0["extra"]["checksum"]["checked"] == "both sides" and rank0["extra"]["checksum"]["match"] is True
    assert rank0["extra"]["checksum"]["tensors"] == len(results[("one-replica", 0)]["names"])
    assert rank1["extra"]["checksum"]["checked"].startswith("training side only")
    assert all(_log(log, 1, rank)["extra"]["checksum"]["match"] is True for rank in (0, 1))
    assert all(r["extra"]["checksum"]["train_seconds"] >= 0 for r in log)
    corrupted = _log(log, 3, 0)["extra"]["checksum"]
    name = "model.layers.0.self_attn.q_proj.weight"
    assert corrupted["match"] is False and corrupted["mismatch"].startswith(f"{name}: training and generation")
    assert results[("corrupted", 0)]["error"].startswith(f"weight sync for step 3: {name}: training and generation")
    assert results[("corrupted", 1)]["error"] is None  # the other rank has no generation side to compare


def test_every_sync_is_logged_once_per_rank(synced):
    _, log = synced
    assert sorted((r["rank"], r["global_steps"]) for r in log) == [(0, 3)] * 4 + [(1, 3)] * 4
    assert all(r["world_size"] == 2 and r["model_bytes"] > 0 and r["seconds"] >= 0 for r in log)
