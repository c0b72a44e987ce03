"""The verl plugin on the CPU: platform, version gate, patches, the ``hf`` rollout pieces, the override list.

Everything here runs in this process (no Ray); ``tests/e2e/test_verl_cpu.py`` runs verl's trainer end to end.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import textwrap

import pytest
import torch
import verl  # noqa: F401  (imports the plugin through the verl.plugins entry point)
from omegaconf import OmegaConf

from recipes.verl_ext.plugin import cpu_device, patches
from recipes.verl_ext.plugin.platform import PlatformCPU, accelerator_build, cpu_platform_wanted

cpu_build_only = pytest.mark.skipif(accelerator_build() is not None, reason="torch has an accelerator build")


@pytest.fixture(scope="module")
def assets(tmp_path_factory):
    from recipes.verl_ext.demo import ensure_tiny_assets

    return ensure_tiny_assets(tmp_path_factory.mktemp("assets"))


def compose_verl(assets, algo: str = "grpo", world_size: int = 1):
    """verl's own config tree with the pack's CPU overrides, as ``main_ppo`` would see it."""
    from hydra import compose, initialize_config_dir

    from recipes.verl_ext.demo.run import demo_overrides

    config_dir = os.path.join(os.path.dirname(verl.__file__), "trainer", "config")
    with initialize_config_dir(config_dir=config_dir, version_base=None):
        return compose("ppo_trainer", overrides=demo_overrides(assets, algo=algo, world_size=world_size, steps=3))


# ---- platform ----------------------------------------------------------------------------------------------------


@cpu_build_only
def test_cpu_platform_is_registered_and_chosen():
    from verl.plugin.platform import PlatformRegistry, get_platform
    from verl.utils import device

    assert PlatformRegistry.get("cpu") is PlatformCPU
    assert cpu_platform_wanted()
    platform = get_platform()
    assert isinstance(platform, PlatformCPU)
    assert (platform.device_name, platform.communication_backend_name(), platform.current_device()) == (
        "cpu",
        "gloo",
        "cpu",
    )
    assert isinstance(PlatformCPU.__dict__["device_module"], property)
    assert platform.device_module is cpu_device
    assert (device.get_device_name(), device.get_nccl_backend(), device.get_device_id()) == ("cpu", "gloo", "cpu")
    assert device.get_resource_name() == "GPU"  # logical GPUs in Ray, see cpu_overrides


def test_cpu_device_module_has_what_verl_calls():
    calls = ["empty_cache", "synchronize", "is_available", "current_stream", "set_device", "mem_get_info",
             "device_count", "memory_allocated", "max_memory_allocated", "memory_reserved", "max_memory_reserved",
             "get_rng_state", "set_rng_state", "manual_seed", "ipc_collect", "set_per_process_memory_fraction",
             "get_device_name", "reset_peak_memory_stats"]  # fmt: skip
    for name in calls:
        assert callable(getattr(cpu_device, name)), name
    free, total = cpu_device.mem_get_info()
    assert 0 < free <= total
    assert cpu_device.max_memory_allocated() >= cpu_device.memory_allocated() > 0
    state = cpu_device.get_rng_state()
    first = torch.rand(3)
    cpu_device.set_rng_state(state)
    assert torch.equal(first, torch.rand(3))


def test_simulated_cuda_build_does_not_want_the_cpu_platform(monkeypatch):
    """The plugin's choice of platform under a CUDA build of torch; ``VERL_PLATFORM=cpu`` still forces the CPU one.

    Simulated: torch.version.cuda "12.4", monkeypatched on CPU torch. Real: the plugin's platform choice."""
    monkeypatch.delenv("VERL_PLATFORM", raising=False)
    monkeypatch.setattr(torch.version, "cuda", "12.4")
    assert accelerator_build() == "cuda"
    assert not cpu_platform_wanted()
    monkeypatch.setenv("VERL_PLATFORM", "cpu")
    assert cpu_platform_wanted()


def _cuda_build_probe(flash_attn: bool, tmp_path):
    """The environment of a fresh interpreter for a CUDA-build probe, with or without a (stub) flash_attn module."""
    env = {k: v for k, v in os.environ.items() if k != "VERL_PLATFORM"}
    if flash_attn:
        (tmp_path / "flash_attn").mkdir()
        (tmp_path / "flash_attn" / "__init__.py").write_text("")
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(tmp_path), env.get("PYTHONPATH")]))
    return env


@pytest.mark.slow
def test_simulated_cuda_build_with_flash_attn_import_changes_nothing(tmp_path):
    """With a CUDA build of torch and flash-attn installed, importing verl (and so the plugin) registers no CPU
    platform and patches nothing.

    Simulated: CPU torch reports torch.version.cuda "12.4", flash_attn a stub. Real: verl, transformers, the plugin."""
    probe = textwrap.dedent(
        """
        import os, torch
        torch.version.cuda = "12.4"          # what a CUDA build reports
        os.environ.pop("VERL_PLATFORM", None)
        import verl
        from verl.plugin.platform import PlatformRegistry
        import verl.utils.distributed as dist, verl.utils.model as model
        from verl.workers.rollout.replica import RolloutReplicaRegistry
        assert "cpu" not in PlatformRegistry.registered_names(), PlatformRegistry.registered_names()
        assert "VERL_PLATFORM" not in os.environ
        assert not hasattr(dist.initialize_global_process_group_ray, "_hybrid_engine_gloo")
        assert not hasattr(model.load_valuehead_model, "_hybrid_engine_sdpa")
        from verl.workers.config.model import HFModelConfig
        assert not hasattr(HFModelConfig.__post_init__, "_hybrid_engine_varlen")
        import verl.utils.torch_functional as verl_F
        assert verl_F.logprobs_from_logits.__module__ == "verl.utils.torch_functional"
        assert "hf" in RolloutReplicaRegistry._registry   # additive: a new backend name, nothing else changes
        print("OK")
        """
    )
    env = _cuda_build_probe(flash_attn=True, tmp_path=tmp_path)
    result = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, env=env, timeout=300)
    assert result.returncode == 0 and "OK" in result.stdout, result.stderr[-3000:]


@pytest.mark.slow
def test_simulated_cuda_build_without_flash_attn_keeps_verls_code_when_the_run_asks(tmp_path):
    """run.flash_attn_fallbacks=false reaches every worker as KLPPO_FLASH_ATTN_FALLBACKS=0: there, without flash-attn,
    verl keeps its own log-prob function, model config and value-model loader (the port measured as verl's run).

    Simulated: CPU torch reports torch.version.cuda "12.4", no flash_attn. Real: verl, transformers, the plugin."""
    probe = textwrap.dedent(
        """
        import os, importlib.util, torch
        torch.version.cuda = "12.4"          # what a CUDA build reports
        os.environ.pop("VERL_PLATFORM", None)
        assert importlib.util.find_spec("flash_attn") is None
        import verl
        import verl.utils.model as model
        import verl.utils.torch_functional as verl_F
        from verl.workers.config.model import HFModelConfig
        assert verl_F.logprobs_from_logits.__module__ == "verl.utils.torch_functional"
        assert not hasattr(HFModelConfig.__post_init__, "_hybrid_engine_varlen")
        assert not hasattr(model.load_valuehead_model, "_hybrid_engine_sdpa")
        print("OK")
        """
    )
    env = {**_cuda_build_probe(flash_attn=False, tmp_path=tmp_path), "KLPPO_FLASH_ATTN_FALLBACKS": "0"}
    result = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, env=env, timeout=300)
    assert result.returncode == 0 and "OK" in result.stdout, result.stderr[-3000:]


@pytest.mark.slow
def test_simulated_cuda_build_without_flash_attn_loads_the_critic_with_sdpa(assets, tmp_path):
    """The KL-PPO critic on a GPU machine without flash-attn (seen on an H200, 2026-12-01): verl 0.9.1 loads the value
    model with a hard-coded flash_attention_2, then falls back to trl's value head and fails ("please install trl").
    With a CUDA build and no flash_attn, the plugin's loader gives verl's first choice, a one-label token
    classification head, with sdpa; nothing else is patched (verl's CUDA platform, its process group).

    Simulated: CPU torch reports torch.version.cuda "12.4", no flash_attn. Real: verl, transformers, the plugin."""
    probe = textwrap.dedent(
        f"""
        import os, importlib.util, torch
        torch.version.cuda = "12.4"          # what a CUDA build reports
        os.environ.pop("VERL_PLATFORM", None)
        assert importlib.util.find_spec("flash_attn") is None
        import verl
        from verl.plugin.platform import PlatformRegistry
        import verl.utils.distributed as dist, verl.utils.model as model
        from transformers import AutoConfig
        assert "cpu" not in PlatformRegistry.registered_names()
        assert not hasattr(dist.initialize_global_process_group_ray, "_hybrid_engine_gloo")
        assert model.load_valuehead_model._hybrid_engine_sdpa
        config = AutoConfig.from_pretrained({str(assets.model_dir)!r}, num_labels=1)
        critic = model.load_valuehead_model({str(assets.model_dir)!r}, torch.float32, config, False)
        assert type(critic).__name__.endswith("ForTokenClassification"), type(critic)
        assert critic.config._attn_implementation == "sdpa", critic.config._attn_implementation
        assert critic.score.out_features == 1
        print("OK")
        """
    )
    env = _cuda_build_probe(flash_attn=False, tmp_path=tmp_path)
    result = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, env=env, timeout=300)
    assert result.returncode == 0 and "OK" in result.stdout, result.stderr[-3000:]


@pytest.mark.slow
def test_simulated_cuda_build_without_flash_attn_runs_remove_padding_batches_with_pack_varlen(assets, tmp_path):
    """The recipes' default batches (batching=dynamic: use_remove_padding, one packed row per micro-batch) on a GPU
    machine without flash-attn: verl's model config would name flash_attention_2, which transformers refuses there.
    The plugin names pack_varlen instead, for the actor and the critic; a packed row of two sequences then gives
    each sequence's own logits (sdpa over the packed row would let the second attend to the first). A typed
    attention is kept.

    Simulated: CPU torch reports torch.version.cuda "12.4", no flash_attn. Real: verl, transformers, the plugin."""
    probe = textwrap.dedent(
        f"""
        import os, importlib.util, torch
        torch.version.cuda = "12.4"          # what a CUDA build reports
        os.environ.pop("VERL_PLATFORM", None)
        assert importlib.util.find_spec("flash_attn") is None
        import verl
        import verl.utils.model as model_utils
        from verl.workers.config.model import HFModelConfig
        from transformers import AutoModelForCausalLM
        path = {str(assets.model_dir)!r}
        config = HFModelConfig(path=path)
        assert config.hf_config._attn_implementation == "pack_varlen", config.hf_config._attn_implementation
        model = AutoModelForCausalLM.from_pretrained(path, config=config.hf_config, dtype=torch.float32).eval()
        first, second = torch.tensor([[5, 9, 11, 3]]), torch.tensor([[7, 2, 8]])
        with torch.no_grad():
            packed = model(input_ids=torch.cat([first, second], 1),
                           position_ids=torch.tensor([[0, 1, 2, 3, 0, 1, 2]])).logits[0]
            apart = torch.cat([model(input_ids=first).logits[0], model(input_ids=second).logits[0]])
        torch.testing.assert_close(packed, apart, atol=1e-5, rtol=0)
        critic = model_utils.load_valuehead_model(path, torch.float32, HFModelConfig(path=path).hf_config, False)
        assert critic.config._attn_implementation == "pack_varlen", critic.config._attn_implementation
        typed = HFModelConfig(path=path, override_config={{"attn_implementation": "sdpa"}})
        assert typed.hf_config._attn_implementation == "sdpa"
        import pickle
        pickle.dump(config.hf_config, open({str(tmp_path / "hf_config.pkl")!r}, "wb"))
        print("OK")
        """
    )
    # a Ray worker: the config made in the task runner arrives pickled; the worker's engine builds the models
    worker = textwrap.dedent(
        f"""
        import os, pickle, torch
        torch.version.cuda = "12.4"
        os.environ.pop("VERL_PLATFORM", None)
        import verl
        import verl.workers.engine.fsdp.transformer_impl
        import verl.utils.model as model_utils
        from transformers import AutoModelForCausalLM
        path = {str(assets.model_dir)!r}
        hf_config = pickle.load(open({str(tmp_path / "hf_config.pkl")!r}, "rb"))
        actor = AutoModelForCausalLM.from_pretrained(path, config=hf_config, dtype=torch.float32)
        critic = model_utils.load_valuehead_model(path, torch.float32, hf_config, False)
        assert actor.config._attn_implementation == critic.config._attn_implementation == "pack_varlen"
        # log-probs: the plugin's chunked fp32 function, in verl's module and in the FSDP engine's own name for it
        import verl.utils.torch_functional as verl_F, verl.workers.engine.fsdp.transformer_impl as impl
        from recipes.verl_ext.plugin.logprobs import chunked_logprobs
        assert verl_F.logprobs_from_logits is impl.logprobs_from_logits is chunked_logprobs
        logits, labels = torch.randn(2, 7, 512), torch.randint(0, 512, (2, 7))
        torch.testing.assert_close(verl_F.logprobs_from_logits(logits, labels),
                                   verl_F.logprobs_from_logits_v2(logits, labels), atol=1e-5, rtol=0)
        print("OK")
        """
    )
    env = _cuda_build_probe(flash_attn=False, tmp_path=tmp_path)
    for code in (probe, worker):
        result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300)
        assert result.returncode == 0 and "OK" in result.stdout, result.stderr[-3000:]


# ---- version gate ------------------------------------------------------------------------------------------------


def test_installed_verl_is_the_supported_one():
    assert patches.require_supported_verl() == patches.SUPPORTED_VERL == "0.9.1"


def test_another_verl_version_is_refused_with_both_versions_named(monkeypatch):
    with pytest.raises(patches.UnsupportedVerlError) as error:
        patches.require_supported_verl(found="0.10.0")
    message = str(error.value)
    assert "found verl==0.10.0" in message and "verl==0.9.1" in message
    assert isinstance(error.value, RuntimeError)

    monkeypatch.setattr(patches, "installed_verl_version", lambda: "0.8.2")
    for apply in (patches.apply_cpu_patches, patches.apply_rollout_patches):
        with pytest.raises(patches.UnsupportedVerlError, match=r"found verl==0\.8\.2"):
            apply()
    from recipes.verl_ext import plugin as verl_plugin

    with pytest.raises(patches.UnsupportedVerlError, match=r"supports verl==0\.9\.1 only"):
        verl_plugin.install()


# ---- patches -----------------------------------------------------------------------------------------------------


@cpu_build_only
def test_cpu_patches_are_in_place():
    import verl.utils.distributed as distributed
    import verl.utils.model as model_utils
    from verl.workers.engine import EngineRegistry
    from verl.workers.engine.fsdp import transformer_impl
    from verl.workers.rollout.base import get_rollout_class
    from verl.workers.rollout.replica import get_rollout_replica_class

    from recipes.verl_ext.plugin.hf_rollout import HFReplica, HFRolloutAdapter

    assert EngineRegistry.get_engine_cls("language_model", "fsdp2") is transformer_impl.FSDPEngineWithLMHead
    assert EngineRegistry.get_engine_cls("value_model", "fsdp2") is transformer_impl.FSDPEngineWithValueHead
    assert transformer_impl.CPUOffloadPolicy(pin_memory=True).pin_memory is False
    assert distributed.initialize_global_process_group_ray._hybrid_engine_gloo
    assert model_utils.load_valuehead_model._hybrid_engine_sdpa
    assert get_rollout_replica_class("hf") is HFReplica
    assert get_rollout_class("hf", "async") is HFRolloutAdapter


@cpu_build_only
def test_value_model_loads_with_sdpa(assets):
    import verl.utils.model as model_utils
    from transformers import AutoConfig

    config = AutoConfig.from_pretrained(assets.model_dir, num_labels=1)
    model = model_utils.load_valuehead_model(assets.model_dir, torch.float32, config, False)
    assert model.config._attn_implementation == "sdpa"
    values = model(input_ids=torch.tensor([[2, 5, 7]])).logits
    assert values.shape == (1, 3, 1)


def test_every_load_of_the_value_model_starts_from_the_same_head_and_leaves_the_generator_alone(assets):
    """verl drew the critic's new value head from the worker's generator as it happened to be: no two runs of one
    KL-PPO command started from the same critic."""
    import verl.utils.model as model_utils
    from transformers import AutoConfig

    config = AutoConfig.from_pretrained(assets.model_dir, num_labels=1)
    heads = []
    for seed in (1, 2):
        torch.manual_seed(seed)
        model = model_utils.load_valuehead_model(assets.model_dir, torch.float32, config, False)
        after = torch.rand(1)
        torch.manual_seed(seed)
        assert torch.equal(after, torch.rand(1))  # the process's generator where it was
        heads.append(model.score.weight.detach().clone())
    assert torch.equal(heads[0], heads[1]) and heads[0].abs().sum() > 0


def test_when_imported_runs_after_the_first_import_and_at_once_later(tmp_path, monkeypatch):
    (tmp_path / "late_module_for_test.py").write_text("VALUE = 1\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    calls = []
    patches.when_imported("late_module_for_test", lambda module: calls.append(module.VALUE))
    assert calls == []
    import late_module_for_test  # noqa: F401

    assert calls == [1]
    patches.when_imported("late_module_for_test", lambda module: calls.append(module.VALUE + 1))
    assert calls == [1, 2]
    sys.modules.pop("late_module_for_test", None)


# ---- the hf rollout ----------------------------------------------------------------------------------------------


def test_hand_off_drains_every_rank_and_copies_on_the_sender():
    from recipes.verl_ext.plugin.hf_rollout import hand_off_weights
    from recipes.verl_ext.plugin.packed_weights import unpack

    live = {"a": torch.ones(2), "b": torch.zeros(3)}
    drained = []

    def stream():
        for name, tensor in live.items():
            drained.append(name)
            yield name, tensor

    assert hand_off_weights(stream(), keep=False) is None
    assert drained == ["a", "b"]  # a non-sending rank still runs every all-gather
    packed = hand_off_weights(stream(), keep=True)
    live["a"].add_(5)
    state = unpack(packed)
    assert torch.equal(state["a"], torch.ones(2)) and packed.names == ["a", "b"]


def test_a_packed_hand_off_carries_every_dtype_and_layout_bit_for_bit():
    from recipes.verl_ext.plugin.hf_rollout import hand_off_weights
    from recipes.verl_ext.plugin.packed_weights import ALIGN, unpack

    reused = torch.zeros(4, 3)  # a stream may hand out one buffer again and again
    transposed = torch.randn(5, 7).bfloat16().t()  # non-contiguous, 2-byte elements

    def stream():
        for step in range(2):
            reused.fill_(step + 1)
            yield f"reused{step}", reused
        yield "bf16_t", transposed
        yield "scalar", torch.tensor(3.5, dtype=torch.float64)
        yield "ids", torch.arange(7)
        yield "empty", torch.zeros(0, 4)

    packed = hand_off_weights(stream(), keep=True)
    state = unpack(packed)
    assert torch.equal(state["reused0"], torch.ones(4, 3)) and torch.equal(state["reused1"], torch.full((4, 3), 2.0))
    assert state["bf16_t"].dtype == torch.bfloat16 and torch.equal(state["bf16_t"], transposed)
    assert state["scalar"].shape == () and state["scalar"].item() == 3.5 and state["ids"].tolist() == list(range(7))
    assert state["empty"].shape == (0, 4) and len(packed) == 6
    assert all(offset % ALIGN == 0 for _, _, _, offset, _ in packed.index)


@pytest.mark.parametrize(("value", "enabled"), [(None, True), ("1", True), ("0", False), ("false", False)])
def test_weight_sync_switch(monkeypatch, value, enabled):
    from recipes.verl_ext.plugin.hf_rollout import SYNC_WEIGHTS_ENV, weight_sync_enabled

    if value is None:
        monkeypatch.delenv(SYNC_WEIGHTS_ENV, raising=False)
    else:
        monkeypatch.setenv(SYNC_WEIGHTS_ENV, value)
    assert weight_sync_enabled() is enabled


class _FakeServer:
    """Stands in for the Ray actor handle: ``server.method.remote(...)`` returns an awaitable."""

    def __init__(self):
        self.calls = []

    def __getattr__(self, name):
        server = self

        class _Method:
            @staticmethod
            def remote(*args):
                server.calls.append((name, args))
                future = asyncio.get_event_loop().create_future()
                future.set_result(None)
                return future

        return _Method


def _adapter(compose_cfg, monkeypatch, *, rank: int, tp: int = 1, sync: bool = True):
    from recipes.verl_ext.plugin.hf_rollout import SYNC_WEIGHTS_ENV, HFRolloutAdapter

    monkeypatch.setenv("RANK", str(rank))
    monkeypatch.setenv(SYNC_WEIGHTS_ENV, "1" if sync else "0")
    rollout = compose_cfg.actor_rollout_ref.rollout
    rollout.tensor_model_parallel_size = tp
    adapter = HFRolloutAdapter(rollout, compose_cfg.actor_rollout_ref.model, device_mesh=None)
    adapter._server = _FakeServer()
    return adapter


@pytest.fixture(scope="module")
def composed(assets):
    return compose_verl(assets)


def _weights():
    yield "w", torch.ones(2)
    yield "v", torch.zeros(1)


def test_adapter_sends_full_weights_and_the_step_from_the_replica_leader(composed, monkeypatch):
    adapter = _adapter(composed, monkeypatch, rank=0)
    asyncio.run(adapter.update_weights(_weights(), global_steps=7, peft_config=None, base_sync_done=True))
    [(method, (state, steps, device_uuid))] = adapter._server.calls
    assert method == "update_weights" and steps == 7 and state.names == ["w", "v"]
    assert device_uuid is None  # no CUDA here: the server keeps generating on the host


def test_adapter_on_a_non_leader_rank_drains_but_sends_nothing(composed, monkeypatch):
    adapter = _adapter(composed, monkeypatch, rank=3, tp=2)
    assert (adapter.replica_rank, adapter.rollout_rank) == (1, 1)
    stream = _weights()
    asyncio.run(adapter.update_weights(stream, global_steps=7))
    assert adapter._server.calls == [] and next(stream, None) is None


def test_adapter_with_sync_off_only_advances_the_step(composed, monkeypatch):
    adapter = _adapter(composed, monkeypatch, rank=0, sync=False)
    asyncio.run(adapter.update_weights(_weights(), global_steps=4))
    assert adapter._server.calls == [("set_global_steps", (4, None))]
    with pytest.raises(NotImplementedError, match="named_tensors"):
        asyncio.run(adapter.update_weights(_weights(), wire_format="delta_flush"))


@pytest.fixture(scope="module")
def server(composed):
    from recipes.verl_ext.plugin.hf_server import HFServer

    return HFServer(composed.actor_rollout_ref.rollout, composed.actor_rollout_ref.model, replica_rank=0)


def test_server_generates_with_log_probs_that_match_a_forward_pass(server):
    prompt = [2, 352, 201, 21, 13, 22, 31, 1, 201, 2, 361, 201]
    out = asyncio.run(server.generate(prompt, {"temperature": 1.0, "logprobs": True, "max_tokens": 8}, "r0"))
    assert 1 <= len(out.token_ids) <= 8 and len(out.log_probs) == len(out.token_ids)
    assert "global_steps" in out.extra_fields and out.stop_reason == "completed"
    if len(out.token_ids) < 8:
        assert out.token_ids[-1] in server.eos_token_ids
    with torch.no_grad():
        logits = server.model(input_ids=torch.tensor([prompt + out.token_ids])).logits[0, len(prompt) - 1 : -1]
    expected = torch.log_softmax(logits, -1).gather(-1, torch.tensor(out.token_ids)[:, None]).squeeze(-1)
    torch.testing.assert_close(torch.tensor(out.log_probs), expected, atol=1e-5, rtol=0)


def test_server_samples_from_the_whole_vocabulary_unless_told_otherwise(server):
    """transformers' generate defaults to top_k=50; verl's actor scores the full softmax, so the server must not."""
    prompt = [2, 352, 201, 21, 13, 22, 31, 1, 201, 2, 361, 201]
    one_batch = server._generate_batch([prompt] * 400, (1, 1.0, 1.0, -1, True), list(range(400)))
    first = [row[0][0] for row in one_batch]
    assert len(set(first)) > 100  # ~near-uniform over 512 tokens: top-50 truncation would give <= 50
    truncated = server._generate_batch([prompt] * 200, (1, 1.0, 1.0, 5, True), list(range(200)))
    assert len({row[0][0] for row in truncated}) <= 5
    # with top-k the log-probs are those of the distribution sampled from (renormalised over 5 tokens)
    assert all(row[1][0] > -torch.log(torch.tensor(5.0)).item() - 1.0 for row in truncated)


def test_server_batches_concurrent_requests_and_answers_each(server, monkeypatch):
    batches = []
    original = server._generate_batch

    def counting(prompts, key, seeds):
        batches.append(len(prompts))
        return original(prompts, key, seeds)

    monkeypatch.setattr(server, "_generate_batch", counting)
    prompts = [[2, 352, 201, 21 + i, 13, 22, 31, 1, 201, 2, 361, 201][: 6 + i] for i in range(6)]

    async def many():
        return await asyncio.gather(
            *[server.generate(p, {"temperature": 0, "max_tokens": 4}, f"r{i}") for i, p in enumerate(prompts)]
        )

    outs = asyncio.run(many())
    assert sum(batches) == 6 and len(batches) <= 2
    assert all(1 <= len(out.token_ids) <= 4 and out.log_probs is None for out in outs)
    single = asyncio.run(server.generate(prompts[3], {"temperature": 0, "max_tokens": 4}, "again"))
    assert single.token_ids == outs[3].token_ids  # greedy, left padding does not change the answer


def test_a_sample_does_not_depend_on_the_requests_batched_with_it(server):
    """Two runs with one seed sample alike, however their concurrent requests happen to batch."""
    prompt, other = [2, 352, 201, 21, 13], [2, 361, 201, 22, 31, 1, 201]
    params = {"temperature": 1.0, "top_p": 0.9, "logprobs": True, "max_tokens": 12}

    async def together(prompts):
        return await asyncio.gather(*[server.generate(p, params, f"r{i}") for i, p in enumerate(prompts)])

    alone = asyncio.run(together([prompt] * 5))
    server._seen_version = -1  # the same weight version, counted afresh: a second run with the same seed
    order = [other, prompt, other, other, prompt, prompt, other, prompt, prompt]
    mixed = [out for p, out in zip(order, asyncio.run(together(order)), strict=True) if p == prompt]
    assert [out.token_ids for out in mixed] == [out.token_ids for out in alone]
    for a, b in zip(alone, mixed, strict=True):
        assert a.log_probs == pytest.approx(b.log_probs, abs=1e-4)
    assert len({tuple(out.token_ids) for out in alone}) >= 4  # the n samples of one prompt draw apart


def test_a_request_seed_fixes_the_sample_and_a_new_weight_version_draws_anew(server):
    prompt = [2, 352, 201, 21, 13]
    params = {"temperature": 1.0, "max_tokens": 12}
    seeded = [asyncio.run(server.generate(prompt, {**params, "seed": 7}, f"s{i}")).token_ids for i in range(2)]
    assert seeded[0] == seeded[1]
    server._seen_version = -1
    first = asyncio.run(server.generate(prompt, params, "a")).token_ids
    server._seen_version = -1
    assert asyncio.run(server.generate(prompt, params, "b")).token_ids == first
    server.weight_version += 1
    assert asyncio.run(server.generate(prompt, params, "c")).token_ids != first


def test_server_loads_handed_off_weights_and_tags_the_step(server):
    before = asyncio.run(server.get_state())
    state = {name: tensor + 0.01 for name, tensor in server.model.state_dict().items()}
    from hybrid_engine.reshard.checksum import checksums

    loaded = asyncio.run(server.update_weights(state, global_steps=3))  # the loaded tensors' checksums
    names, sums = checksums(state)
    assert loaded == {name: tuple(row) for name, row in zip(names, sums.tolist(), strict=True)}
    after = asyncio.run(server.get_state())
    assert after["weight_version"] == before["weight_version"] + 1 and after["global_steps"] == 3
    assert after["checksum"] != before["checksum"]
    out = asyncio.run(server.generate([2, 352, 201], {"temperature": 0, "max_tokens": 2}, "r"))
    assert out.extra_fields["global_steps"] == 3
    with pytest.raises(RuntimeError, match="does not match the model"):
        asyncio.run(server.update_weights({"nonsense.weight": torch.zeros(1)}))


def test_server_checks_bf16_weights_in_the_dtype_they_were_sent_in(server):
    """Megatron's export sends bfloat16 into the float32 server: the read-back checksums are those of the bf16
    tensors sent (an H200 run on 2026-12-05 failed its first sync check: the fp32 bits were compared)."""
    from hybrid_engine.reshard.checksum import checksums

    state = {name: (tensor - 0.01).to(torch.bfloat16) for name, tensor in server.model.state_dict().items()}
    loaded = asyncio.run(server.update_weights(state, global_steps=4))
    names, sums = checksums(state)
    assert loaded == {name: tuple(row) for name, row in zip(names, sums.tolist(), strict=True)}
    assert next(server.model.parameters()).dtype == torch.float32  # the server keeps its own dtype


def test_server_told_of_a_gpu_it_cannot_see_stays_on_the_host_and_says_so(composed, caplog):
    from recipes.verl_ext.plugin.hf_server import HFServer

    server = HFServer(composed.actor_rollout_ref.rollout, composed.actor_rollout_ref.model, replica_rank=0)
    with caplog.at_level("WARNING"):
        asyncio.run(server.set_global_steps(2, "GPU-00000000-0000-0000-0000-000000000000"))
        asyncio.run(server.set_global_steps(3, "GPU-00000000-0000-0000-0000-000000000000"))
    warned = [r.getMessage() for r in caplog.records if "not visible here" in r.getMessage()]
    assert len(warned) == 1 and "GPU-00000000" in warned[0]  # once: the placement is tried at the first hand-off
    state = asyncio.run(server.get_state())
    assert state["device"] == "cpu" and state["global_steps"] == 3
    assert {p.device.type for p in server.model.parameters()} == {"cpu"}


def test_server_lifecycle_calls_are_no_ops(server):
    async def lifecycle():
        await server.wake_up(tags=["weights"])
        await server.sleep()
        await server.clear_kv_cache()
        await server.release_kv_cache()
        await server.resume_kv_cache()
        await server.resume_generation()
        await server.wait_for_requests_to_drain()
        await server.start_profile()
        await server.stop_profile()
        await server.set_global_steps(9)
        return await server.abort_all_requests(reject_request=True)

    assert asyncio.run(lifecycle())["aborted_count"] == 0
    assert server.global_steps == 9


# ---- the override list -------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("algo", "world_size"), [("grpo", 1), ("grpo", 2), ("kl_ppo", 1)])
def test_cpu_overrides_compose_on_verls_tree_and_pass_its_validator(assets, algo, world_size):
    from verl.trainer.ppo.utils import need_critic, need_reference_policy
    from verl.utils.config import validate_config

    config = compose_verl(assets, algo=algo, world_size=world_size)
    validate_config(config, use_reference_policy=need_reference_policy(config), use_critic=need_critic(config))
    assert config.actor_rollout_ref.rollout.name == "hf" and config.trainer.device == "cpu"
    assert config.trainer.n_gpus_per_node == config.ray_kwargs.ray_init.num_gpus == world_size
    assert config.actor_rollout_ref.model.path == str(assets.model_dir)
    assert need_critic(config) is (algo == "kl_ppo")


def _has_a_reason(text: str, dotted: str) -> bool:
    """A comment explains the key in its YAML file: above the key, above the run of sibling keys it is part of, or
    above one of its parents (the file's header comment, before the first key, does not count)."""
    lines = text.splitlines()
    first_key = next(i for i, line in enumerate(lines) if line.strip() and not line.lstrip().startswith("#"))
    chain, start, indent = [], 0, 0
    for part in dotted.split("."):
        index = next(i for i in range(start, len(lines)) if lines[i].startswith(" " * indent + part + ":"))
        chain.append((index, indent))
        start, indent = index + 1, indent + 2
    for index, indent in reversed(chain):  # the key, then its parents
        i = index - 1
        while i >= first_key:
            stripped = lines[i].strip()
            lead = len(lines[i]) - len(lines[i].lstrip())
            if stripped.startswith("#") and lead == indent:
                return True
            if stripped and (lead > indent or (lead == indent and not stripped.startswith("- "))):
                i -= 1  # a sibling above (its comment covers the run) or a deeper line of a sibling's subtree
                continue
            if not stripped:
                i -= 1
                continue
            break
    return False


def test_every_override_has_a_comment():
    """Each key of the list carries its reason: the comment beside it in the conf file it is read from."""
    from recipes.verl_ext.plugin import cpu_overrides

    origins = cpu_overrides.ORIGINS
    missing = []
    for group_name, group in cpu_overrides.GROUPS.items():
        if group_name == "demo run":
            continue
        for key in group:
            bare = key.lstrip("+")
            if not _has_a_reason(origins[bare].read_text(), bare):
                missing.append(f"{bare} ({origins[bare].name})")
    assert not missing, "keys without a comment: " + ", ".join(missing)


@pytest.mark.slow
def test_another_verl_fails_loudly_when_the_plugin_is_an_external_module():
    """With VERL_USE_EXTERNAL_MODULES (what demo_run sets), ``import verl`` itself raises the refusal."""
    from recipes.verl_ext.demo.run import loud_plugin_env

    probe = textwrap.dedent(
        """
        import importlib.metadata as metadata
        real = metadata.version
        metadata.version = lambda name: "0.10.0" if name == "verl" else real(name)
        import verl
        """
    )
    env = loud_plugin_env({k: v for k, v in os.environ.items() if k != "VERL_USE_EXTERNAL_MODULES"})
    result = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, env=env, timeout=300)
    assert result.returncode != 0
    assert "UnsupportedVerlError" in result.stderr and "found verl==0.10.0" in result.stderr


def test_verls_task_runner_prints_the_config_redacted(capsys):
    """verl's TaskRunner pprints the whole config (terminal, verl.log, Ray's worker logs): secrets come out hidden."""
    import verl.trainer.main_ppo as main_ppo

    main_ppo.pprint({"trainer": {"wandb_key": "hunter2", "project_name": "p"},
                     "data": {"url": "https://user:pw@host/x", "prompt_key": "prompt"}})
    out = capsys.readouterr().out
    assert "hunter2" not in out and ":pw@" not in out and "'***'" in out
    assert "'prompt_key': 'prompt'" in out and "'project_name': 'p'" in out


@pytest.mark.slow  # a child process: verl's own entry point
def test_verls_own_cli_still_starts_with_the_plugin_loaded(tmp_path):
    """``python -m verl.trainer.main_ppo`` runs its module through runpy (the loader's get_code), which the plugin's
    import hook must pass through."""
    import subprocess
    import sys

    from tests.conftest import checkout_env

    proc = subprocess.run([sys.executable, "-m", "verl.trainer.main_ppo", "--help"], cwd=tmp_path, env=checkout_env(),
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "main_ppo is powered by Hydra" in proc.stdout


# ---- the v1 replay buffer's poll -----------------------------------------------------------------------------------


def _replay_buffer(sampler_kwargs):
    from verl.trainer.ppo.v1.replay_buffer import ReplayBuffer

    return ReplayBuffer(trainer_mode="sync", trainer_config={}, max_off_policy_threshold=None,
                        max_off_policy_strategy="drop", sampler_kwargs=sampler_kwargs)


def test_the_replay_buffer_polls_at_the_configured_interval():
    """verl 0.9.1 waits a fixed 2 s between polls for finished rollouts (2.0 s of 'generation' a step for a tiny
    model on an H200); with trainer.v1.sampler.sampler_kwargs.poll_interval it waits that long instead."""
    assert _replay_buffer({"poll_interval": 0.1}).poll_interval == 0.1
    assert _replay_buffer({}).poll_interval == 2.0  # verl's own default where the key is not given


@pytest.mark.parametrize(("cluster", "interval"), [([], 0.02), (["cluster=h100_80g"], 0.1)], ids=["cpu", "gpu"])
def test_the_recipes_set_the_poll_interval(tmp_path, cluster, interval, recipe_main):
    run = recipe_main("grpo", *cluster, "action=validate", f"hydra.run.dir={tmp_path}", cwd=tmp_path)
    assert run.returncode == 0, run.stderr[-2000:]
    resolved = OmegaConf.load(tmp_path / "resolved_config.yaml")
    assert resolved.trainer.v1.sampler.sampler_kwargs.poll_interval == interval
    assert resolved.trainer.v1.sampler.custom_sampler.path is None  # verl's own buffer (group filtering and refill)
