"""The 3D-HybridEngine's resharding executor: training shards -> generation shards on torch.distributed.

- ``shards``: a rank's training shards (Megatron-style TP/PP with fused qkv / gate_up, or FSDP2 ``Shard(0)``) and
  deterministic weight sources to build them.
- ``exchange``: the exchange plan (who sends which box to whom) of each scheme, computed alike on every rank.
- ``packing``: the local copies around the collectives: cells packed into and unpacked from flat buffers, the
  generation outputs (views of the rank's own storage where they can be).
- ``program``: the executor's copy program of one bucket (views and fused strided copies, compiled once per
  layout, replayed with one batched copy).
- ``executor``: ``Resharder`` runs it with all-gathers / all-to-alls and streams ``(hf_name, tensor)``;
  ``stream_to_feeders`` / ``rollout_weight_stream`` are the weight hand-off for a rollout fed by one rank per
  replica (verl's colocated CPU ``hf`` rollout).
- ``megatron``: a Megatron-core GPTModel's own parameters wrapped as training shards (no copy), and their stream to
  the feeders (verl's Megatron engine).
- ``stats``: bytes, times and memory as measured, and the planner's numbers beside them.
- ``simulation``: ``simulate`` runs a scheme for every rank in one process, the collectives replaced by copies.

Nothing here runs at import time; torch is imported, transformers is not.
"""

from hybrid_engine.reshard.exchange import SCHEME_NAMES, Scheme, make_buckets
from hybrid_engine.reshard.executor import (
    DEFAULT_BUCKET_BYTES,
    Resharder,
    ShardedWeights,
    feeder_ranks,
    rollout_weight_stream,
    stream_to_feeders,
)
from hybrid_engine.reshard.megatron import (
    MegatronRank,
    MegatronShardedWeights,
    megatron_rollout_weight_stream,
    megatron_shards_from_state_dict,
    megatron_stream_to_feeders,
)
from hybrid_engine.reshard.shards import (
    LocalShards,
    fsdp_shards,
    fsdp_shards_from_state_dict,
    megatron_shards,
    state_dict_source,
    synthetic_source,
    synthetic_tensor,
)
from hybrid_engine.reshard.simulation import simulate
from hybrid_engine.reshard.stats import PlannedBytes, ReshardStats, planned_bytes

__all__ = [
    "DEFAULT_BUCKET_BYTES",
    "SCHEME_NAMES",
    "LocalShards",
    "MegatronRank",
    "MegatronShardedWeights",
    "PlannedBytes",
    "ReshardStats",
    "Resharder",
    "ShardedWeights",
    "Scheme",
    "fsdp_shards",
    "feeder_ranks",
    "fsdp_shards_from_state_dict",
    "make_buckets",
    "megatron_rollout_weight_stream",
    "megatron_shards",
    "megatron_shards_from_state_dict",
    "megatron_stream_to_feeders",
    "planned_bytes",
    "rollout_weight_stream",
    "simulate",
    "state_dict_source",
    "stream_to_feeders",
    "synthetic_source",
    "synthetic_tensor",
]
