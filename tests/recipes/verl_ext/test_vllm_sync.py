"""The sync into vLLM, timed and checked (recipes.verl_ext.plugin.vllm_sync), against a stand-in vLLM model.

vLLM does not run on this machine (no CUDA), so the generation side is a module laid out as vLLM's Qwen2 is: q/k/v
rows in one ``qkv_proj`` and gate/up in one ``gate_up_proj`` (each with vLLM's ``output_sizes``), the class's
``packed_modules_mapping``, an embedding padded to 64 rows, a tied ``lm_head``, every parameter in bf16. verl's
sync (``original``) is stood in by a loader that does what vLLM's ``load_weights`` does with the stream: cast to
bf16 and copy each HF tensor into its rows. What is asserted is the pack's wrapper around it: the checksums expected
(from the engine's parameters, or from verl's stream as sent), the read-back under HF names, the exact comparison,
the record in the sync log, and a tensor changed anywhere on the way stopping the sync, named.
"""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

import pytest
import torch
from torch import nn

from hybrid_engine.reshard import ShardedWeights
from hybrid_engine.reshard.checksum import tensor_checksum
from recipes.verl_ext.plugin import patches, vllm_sync
from recipes.verl_ext.plugin.weight_sync import SYNC_LOG_ENV, SyncCheckFailed, read_sync_log

HIDDEN, HEADS_Q, HEADS_KV, HEAD, FFN, VOCAB = 16, 4, 2, 4, 24, 50


class _Fused(nn.Module):
    def __init__(self, sizes: list[int], bias: bool) -> None:
        super().__init__()
        self.output_sizes = sizes
        self.weight = nn.Parameter(torch.zeros(sum(sizes), HIDDEN, dtype=torch.bfloat16))
        self.bias = nn.Parameter(torch.zeros(sum(sizes), dtype=torch.bfloat16)) if bias else None


class _VllmQwen2(nn.Module):
    """One layer of vLLM's Qwen2 layout (names as vLLM's Qwen2ForCausalLM has them)."""

    packed_modules_mapping = {"qkv_proj": ["q_proj", "k_proj", "v_proj"], "gate_up_proj": ["gate_proj", "up_proj"]}

    def __init__(self) -> None:
        super().__init__()
        self.model = nn.Module()
        self.model.embed_tokens = nn.Module()
        self.model.embed_tokens.weight = nn.Parameter(torch.zeros(64, HIDDEN, dtype=torch.bfloat16))  # padded
        layer = nn.Module()
        layer.self_attn = nn.Module()
        layer.self_attn.qkv_proj = _Fused([HEADS_Q * HEAD, HEADS_KV * HEAD, HEADS_KV * HEAD], bias=True)
        layer.mlp = nn.Module()
        layer.mlp.gate_up_proj = _Fused([FFN, FFN], bias=False)
        layer.input_layernorm = nn.Module()
        layer.input_layernorm.weight = nn.Parameter(torch.zeros(HIDDEN, dtype=torch.bfloat16))
        self.model.layers = nn.ModuleList([layer])
        self.lm_head = self.model.embed_tokens  # tied, as vLLM ties them

    def load(self, name: str, tensor: torch.Tensor) -> None:
        """What vLLM's load_weights does with one HF tensor: cast, then copy into its rows."""
        parts = {p: (f, i) for f, ps in self.packed_modules_mapping.items() for i, p in enumerate(ps)}
        prefix, _, attr = name.rpartition(".")
        parent, _, leaf = prefix.rpartition(".")
        if leaf in parts:
            fused, index = parts[leaf]
            module = self.get_submodule(f"{parent}.{fused}")
            start = sum(module.output_sizes[:index])
            getattr(module, attr).data[start : start + tensor.shape[0]] = tensor.to(torch.bfloat16)
        elif name != "model.layers.0.self_attn.rotary_emb.inv_freq":  # vLLM computes it, skips the loaded one
            param = self.get_parameter(name)
            param.data[: tensor.shape[0]] = tensor.to(param.dtype)


class _VllmWithGate(_VllmQwen2):
    """The same with a parameter vLLM keeps in fp32, as it keeps a MoE router's gate."""

    def __init__(self) -> None:
        super().__init__()
        self.model.layers[0].mlp.gate = nn.Module()
        self.model.layers[0].mlp.gate.weight = nn.Parameter(torch.zeros(4, HIDDEN))


def _hf_weights(seed: int = 0) -> dict[str, torch.Tensor]:
    """The HF state dict verl streams (fp32, as FSDP's export sends it)."""
    g = torch.Generator().manual_seed(seed)
    shapes = {
        "model.embed_tokens.weight": (VOCAB, HIDDEN),
        "model.layers.0.self_attn.q_proj.weight": (HEADS_Q * HEAD, HIDDEN),
        "model.layers.0.self_attn.q_proj.bias": (HEADS_Q * HEAD,),
        "model.layers.0.self_attn.k_proj.weight": (HEADS_KV * HEAD, HIDDEN),
        "model.layers.0.self_attn.k_proj.bias": (HEADS_KV * HEAD,),
        "model.layers.0.self_attn.v_proj.weight": (HEADS_KV * HEAD, HIDDEN),
        "model.layers.0.self_attn.v_proj.bias": (HEADS_KV * HEAD,),
        "model.layers.0.mlp.gate_proj.weight": (FFN, HIDDEN),
        "model.layers.0.mlp.up_proj.weight": (FFN, HIDDEN),
        "model.layers.0.input_layernorm.weight": (HIDDEN,),
        "model.layers.0.self_attn.rotary_emb.inv_freq": (HEAD // 2,),
    }
    return {name: torch.randn(shape, generator=g) for name, shape in shapes.items()}


class _Adapter:
    """verl's ServerAdapter as the wrapper uses it: its config, ``_has_server`` and ``_execute_method`` (the
    read-back runs the pack's worker method on the stand-in model)."""

    def __init__(self, model: _VllmQwen2, reply=None) -> None:
        self.config = SimpleNamespace(dtype="bfloat16", tensor_model_parallel_size=1)
        self._has_server = True
        self.model, self.reply, self.methods = model, reply, []

    async def _execute_method(self, method, kwargs=None, **_):
        self.methods.append(method)
        if self.reply is not None:
            return self.reply(kwargs)
        return [vllm_sync.loaded_checksums(self.model, kwargs["shapes"], kwargs.get("dtype"))]


def _loader(change: str | None = None, arrived: dict | None = None):
    """verl's sync stood in: drains the stream into the model (``change``: that tensor arrives with one value off;
    ``arrived``: filled with each name's dtype as it arrived)."""
    calls = []

    async def original(adapter, weights, global_steps=None, wire_format="named_tensors", **kwargs):
        calls.append(weights)
        for name, tensor in weights:
            if arrived is not None:
                arrived[name] = tensor.dtype
            if name == change:
                tensor = tensor.clone()
                tensor.view(-1)[0] += 1.0
            adapter.model.load(name, tensor)

    return original, calls


def _sync(adapter, weights, original, step: int = 3):
    return asyncio.run(vllm_sync.checked_update_weights(original, adapter, weights, global_steps=step))


@pytest.fixture
def sync_log(tmp_path, monkeypatch):
    path = tmp_path / "weight_sync.jsonl"
    monkeypatch.setenv(SYNC_LOG_ENV, str(path))
    return path


def test_read_back_under_hf_names_matches_each_tensor():
    hf = _hf_weights()
    model = _VllmQwen2()
    for name, tensor in hf.items():
        model.load(name, tensor)
    got = vllm_sync.loaded_checksums(model, {n: list(t.shape) for n, t in hf.items()})
    assert got["not_found"] == ["model.layers.0.self_attn.rotary_emb.inv_freq"]
    assert set(got["sums"]) == set(hf) - {"model.layers.0.self_attn.rotary_emb.inv_freq"}
    for name, sums in got["sums"].items():
        assert sums == tensor_checksum(hf[name].to(torch.bfloat16)).tolist(), name
    # the tied lm_head reads the embedding's 50 rows of its 64
    got = vllm_sync.loaded_checksums(model, {"lm_head.weight": [VOCAB, HIDDEN]})
    assert got["sums"]["lm_head.weight"] == tensor_checksum(hf["model.embed_tokens.weight"].bfloat16()).tolist()


def test_verl_stream_checked_and_recorded(sync_log):
    hf = _hf_weights()
    adapter = _Adapter(_VllmQwen2())
    original, calls = _loader()
    _sync(adapter, iter(hf.items()), original)
    assert len(calls) == 1 and adapter.methods == [vllm_sync.READBACK_METHOD]
    (record,) = read_sync_log(sync_log)
    assert record["scheme"] == "vllm_ipc" and record["global_steps"] == 3 and record["tensors"] == len(hf)
    assert record["model_bytes"] == sum(t.numel() * 4 for t in hf.values())  # fp32, as streamed
    check = record["extra"]["checksum"]
    assert check["checked"] == "both sides" and check["match"] is True and check["tensors"] == len(hf) - 1
    assert check["source"] == "verl's stream as sent" and check["dtype"] == "bfloat16"
    assert check["not_read_back"] == ["model.layers.0.self_attn.rotary_emb.inv_freq"]
    assert "resharder" in record["fallback_reason"]


@pytest.mark.parametrize("changed", ["model.layers.0.self_attn.k_proj.weight", "model.layers.0.mlp.up_proj.weight"])
def test_a_tensor_changed_on_the_way_stops_the_sync_named(sync_log, changed):
    hf = _hf_weights()
    original, _ = _loader(change=changed)
    with pytest.raises(SyncCheckFailed, match=f"step 3: {changed.replace('.', '[.]')}: training and generation"):
        _sync(_Adapter(_VllmQwen2()), iter(hf.items()), original)
    (record,) = read_sync_log(sync_log)
    assert record["extra"]["checksum"]["match"] is False and changed in record["extra"]["checksum"]["mismatch"]


def test_engine_parameters_are_the_reference_when_the_export_carries_them(sync_log):
    """With the engine's own parameters beside verl's stream (the pack's export), the check covers the export too:
    a stream that differs from the parameters fails, though vLLM loaded what it was sent."""
    hf = _hf_weights()
    exported = dict(hf)
    exported["model.layers.0.self_attn.v_proj.bias"] = hf["model.layers.0.self_attn.v_proj.bias"] * 2
    original, _ = _loader()
    weights = ShardedWeights(hf, fallback=iter(exported.items()))
    with pytest.raises(SyncCheckFailed, match="v_proj.bias"):
        _sync(_Adapter(_VllmQwen2()), weights, original)
    assert read_sync_log(sync_log)[0]["extra"]["checksum"]["source"] == "training engine's parameters"

    original, _ = _loader()
    _sync(_Adapter(_VllmQwen2()), ShardedWeights(hf, fallback=iter(hf.items())), original, step=4)
    assert read_sync_log(sync_log)[1]["extra"]["checksum"]["match"] is True


def test_the_training_side_casts_each_tensor_once():
    """The training side's checksums in the rollout's dtype read each fp32 parameter once (a cast a read)."""
    from recipes.verl_ext.plugin import weight_sync

    class Reads(dict):
        count = 0

        def __getitem__(self, name):
            Reads.count += 1
            return super().__getitem__(name)

    hf = Reads(_hf_weights())
    sums = weight_sync.training_checksums(ShardedWeights(hf, fallback=iter(())), dtype=torch.bfloat16)
    assert Reads.count == len(hf) == len(sums)
    assert sums["model.embed_tokens.weight"] == tuple(
        tensor_checksum(hf["model.embed_tokens.weight"].to(torch.bfloat16)).tolist())


def test_nan_in_the_training_weights_stops_before_the_stream(sync_log):
    hf = _hf_weights()
    hf["model.layers.0.mlp.gate_proj.weight"][2, 3] = float("nan")
    original, calls = _loader()
    with pytest.raises(SyncCheckFailed, match=r"StabilityFault\[nan_weights\].*gate_proj.weight holds NaN/Inf"):
        _sync(_Adapter(_VllmQwen2()), ShardedWeights(hf, fallback=iter(hf.items())), original)
    assert calls == [] and read_sync_log(sync_log) == []


def test_unchecked_or_broken_read_back_is_recorded_and_the_run_goes_on(sync_log):
    hf = _hf_weights()
    original, _ = _loader()
    tp2 = _Adapter(_VllmQwen2(), reply=lambda kwargs: [{"unchecked": "vLLM tensor parallel 2: each worker holds a "
                                                                      "slice"}] * 2)
    _sync(tp2, iter(hf.items()), original)

    def broken(kwargs):
        raise RuntimeError("worker gone")

    _sync(_Adapter(_VllmQwen2(), reply=broken), iter(hf.items()), original, step=4)
    first, second = (r["extra"]["checksum"]["checked"] for r in read_sync_log(sync_log))
    assert first == "no: vLLM tensor parallel 2: each worker holds a slice"
    assert second == "no: RuntimeError: worker gone"


def test_without_a_sync_log_or_for_lora_verl_runs_as_it_is(monkeypatch):
    monkeypatch.delenv(SYNC_LOG_ENV, raising=False)
    weights = iter(_hf_weights().items())
    original, calls = _loader()
    adapter = _Adapter(_VllmQwen2())
    _sync(adapter, weights, original)
    assert calls == [weights] and adapter.methods == []


def test_patches_install_on_verls_classes():
    """The three patches, applied to stand-ins of verl's modules: the adapter's sync wrapped once, the worker
    extension's read-back added, the server's collective_rpc returning what the workers returned."""

    class ServerAdapter:
        async def update_weights(self, weights, global_steps=None, wire_format="named_tensors", **kwargs):
            return "verl"

    class Engine:
        async def collective_rpc(self, method, timeout=None, args=(), kwargs=None):
            return [f"{method} on worker 0"]

    class vLLMHttpServer:  # noqa: N801  (verl's name)
        engine = Engine()

        async def collective_rpc(self, method, timeout=None, args=(), kwargs=None):
            await self.engine.collective_rpc(method=method, timeout=timeout, args=args, kwargs=kwargs)

    class vLLMColocateWorkerExtension:  # noqa: N801  (verl's name)
        pass

    rollout = SimpleNamespace(ServerAdapter=ServerAdapter)
    patches._checked_vllm_sync(rollout)
    wrapped = ServerAdapter.update_weights
    patches._checked_vllm_sync(rollout)
    assert ServerAdapter.update_weights is wrapped and wrapped.__wrapped__ is not None
    patches._vllm_readback(SimpleNamespace(vLLMColocateWorkerExtension=vLLMColocateWorkerExtension))
    assert vLLMColocateWorkerExtension.klppo_loaded_checksums is vllm_sync.worker_loaded_checksums
    assert vllm_sync.READBACK_METHOD == "klppo_loaded_checksums"
    patches._rpc_results(SimpleNamespace(vLLMHttpServer=vLLMHttpServer))
    assert asyncio.run(vLLMHttpServer().collective_rpc("ping")) == ["ping on worker 0"]


def test_the_run_summary_says_time_bytes_and_checks(sync_log):
    """The line a run prints at its end (recipes.run.train.weight_sync_summary) from the records the syncs wrote."""
    from recipes.run.train import weight_sync_summary

    hf = _hf_weights()
    original, _ = _loader()
    for step in (1, 2, 3):
        _sync(_Adapter(_VllmQwen2()), iter(hf.items()), original, step=step)
    line = weight_sync_summary(sync_log)
    mib = sum(t.numel() * 4 for t in hf.values()) / 2**20  # 8,520 bytes of fp32
    assert line.startswith("weight sync into vLLM (3 syncs, verl's CUDA-IPC path, weight_sync.jsonl): median ")
    check = sorted(r["extra"]["checksum"]["check_seconds"] for r in read_sync_log(sync_log))[1]
    assert line.endswith(f" s for 0.01 MiB; checksum matched in 3 of 3, the check {check:.3f} s a sync (median)")
    assert f"{mib:.2f}" == "0.01"


def test_weights_on_the_host_under_nccl_fall_back_to_the_stream(sync_log, monkeypatch):
    """FSDP2's CPU offload keeps the actor's weights on the host; NCCL's all-reduce takes device tensors only, so on
    several ranks the training side is not summed there (it would fail mid-sync) and the stream is the reference."""
    from recipes.verl_ext.plugin import weight_sync

    monkeypatch.setattr(weight_sync.dist, "is_initialized", lambda: True)
    monkeypatch.setattr(weight_sync.dist, "get_world_size", lambda *a: 2)
    monkeypatch.setattr(weight_sync.dist, "get_backend", lambda *a: "nccl")
    monkeypatch.setattr(weight_sync.dist, "get_rank", lambda *a: 0)

    def no_all_reduce(*args, **kwargs):
        raise AssertionError("all_reduce of host tensors under NCCL")

    monkeypatch.setattr(weight_sync.dist, "all_reduce", no_all_reduce)
    hf = _hf_weights()
    assert weight_sync.training_checksums(ShardedWeights(hf, fallback=iter(())), dtype=torch.bfloat16) is None
    original, _ = _loader()
    _sync(_Adapter(_VllmQwen2()), ShardedWeights(hf, fallback=iter(hf.items())), original)
    check = read_sync_log(sync_log)[0]["extra"]["checksum"]
    assert check["source"] == "verl's stream as sent" and check["match"] is True


def test_a_scalar_reads_back_and_a_shape_vllm_changed_is_named():
    """A 0-d tensor reads back; a scalar that vLLM holds as a 1-element vector is named with both shapes, not an
    error in the worker."""
    model = _VllmQwen2()
    model.register_buffer("scale", torch.tensor(2.5, dtype=torch.bfloat16))
    model.register_buffer("shift", torch.tensor([1.5], dtype=torch.bfloat16))
    got = vllm_sync.loaded_checksums(model, {"scale": [], "shift": []})
    assert got["sums"] == {"scale": tensor_checksum(torch.tensor(2.5, dtype=torch.bfloat16)).tolist()}
    assert got["not_found"] == ["shift (1,) != ()"]


def test_later_syncs_send_in_the_rollout_dtype_what_vllm_holds_in_it(sync_log):
    """The first sync sends verl's fp32 tensors as they are and learns from the read-back what vLLM holds in bf16;
    from the second on those go in bf16 (half the bytes), the same bits loaded, and what vLLM keeps in fp32 (the gate)
    or does not hold (rotary inv_freq) still goes in fp32."""
    gate = "model.layers.0.mlp.gate.weight"
    hf = _hf_weights()
    hf[gate] = torch.randn(4, HIDDEN, generator=torch.Generator().manual_seed(7))
    model, arrived = _VllmWithGate(), {}
    adapter = _Adapter(model)
    original, _ = _loader(arrived=arrived)
    _sync(adapter, iter(hf.items()), original, step=1)
    assert set(arrived.values()) == {torch.float32}
    _sync(adapter, iter(hf.items()), original, step=2)
    kept = {gate, "model.layers.0.self_attn.rotary_emb.inv_freq"}
    assert {name for name, dtype in arrived.items() if dtype == torch.float32} == kept
    assert {dtype for name, dtype in arrived.items() if name not in kept} == {torch.bfloat16}
    first, second = read_sync_log(sync_log)
    assert first["extra"]["sent"]["in_rollout_dtype"] == 0
    assert second["extra"]["sent"]["in_rollout_dtype"] == len(hf) - len(kept)
    assert second["model_bytes"] == sum(t.numel() * (4 if n in kept else 2) for n, t in hf.items())
    assert second["extra"]["checksum"]["match"] is True
    assert torch.equal(model.get_parameter(gate), hf[gate])  # fp32 kept to the last bit


def test_a_quantized_rollout_gets_verls_tensors_as_they_are(sync_log):
    hf = _hf_weights()
    adapter, arrived = _Adapter(_VllmQwen2()), {}
    adapter.config.quantization = "fp8"
    original, _ = _loader(arrived=arrived)
    for step in (1, 2):
        _sync(adapter, iter(hf.items()), original, step=step)
        assert set(arrived.values()) == {torch.float32}, step


def test_a_tied_lm_head_is_not_sent(sync_log):
    """vLLM's load_weights skips ``lm_head.weight`` when the model ties it to the embedding, so the stream leaves it
    out (verl sends it: 0.87 GiB of fp32 a sync for Qwen2.5-1.5B); the check still reads back every tensor sent."""
    hf = _hf_weights()
    hf["lm_head.weight"] = hf["model.embed_tokens.weight"]
    adapter, arrived = _Adapter(_VllmQwen2()), {}
    original, _ = _loader(arrived=arrived)
    adapter.model_config = SimpleNamespace(hf_config=SimpleNamespace(tie_word_embeddings=True))
    _sync(adapter, iter(hf.items()), original)
    assert "lm_head.weight" not in arrived and len(arrived) == len(hf) - 1
    (record,) = read_sync_log(sync_log)
    assert record["extra"]["sent"]["skipped"] == ["lm_head.weight"] and record["extra"]["checksum"]["match"] is True
    assert record["extra"]["checksum"]["tensors"] == len(hf) - 1  # lm_head read back too (inv_freq is not held)

    adapter.model_config.hf_config.tie_word_embeddings = False  # untied: sent, as verl sends it
    arrived.clear()
    _sync(_Adapter(_VllmQwen2()), iter(hf.items()), original)
    assert "lm_head.weight" in arrived


def test_a_head_vllm_did_not_tie_fails_the_check(sync_log):
    """Where the config ties the head but vLLM's model holds a head of its own, the head left out of the stream keeps
    its old weights; the read-back finds them and stops the sync, naming it."""
    hf = _hf_weights()
    hf["lm_head.weight"] = hf["model.embed_tokens.weight"]
    model = _VllmQwen2()
    model.lm_head = nn.Module()
    model.lm_head.weight = nn.Parameter(torch.zeros(64, HIDDEN, dtype=torch.bfloat16))
    adapter = _Adapter(model)
    adapter.model_config = SimpleNamespace(hf_config=SimpleNamespace(tie_word_embeddings=True))
    original, _ = _loader()
    with pytest.raises(SyncCheckFailed, match="lm_head.weight: training and generation weights differ"):
        _sync(adapter, iter(hf.items()), original)
