"""The pack's patches of verl's internals that the plugin applies, pinned to one verl version.

verl 0.9.1 has registries for platforms and rollout replicas, which the plugin uses through their public API
(``recipes.verl_ext.plugin.__init__``). What has no public hook is patched here and in the modules beside it
(``megatron_no_te``, ``stability.verl_hooks``, ``recipes.verl_ext.api``); every patch the pack makes, of verl and
of the other projects it runs (Ray, OmegaConf, Hydra, TransferQueue, tensordict, transformers, megatron-core,
mbridge), is a row of one table, :data:`recipes.verl_ext.patch_table.PATCHES`: the module that makes it, what it
changes, why, and the version it was read against. ``tests/recipes/verl_ext/test_patch_table.py`` fails on a patch
the table does not name.

Patches to modules that are slow to import (the engines pull in transformers and peft) are applied right after the
module is first imported, by a small import hook, so ``import verl`` stays as fast as it was.

Each patch checks the verl version first: on any verl other than :data:`SUPPORTED_VERL` it raises
:class:`UnsupportedVerlError`, naming the version found and the version required. verl imports plugins inside a
``try``/``except`` that logs at debug level, so entry points call :func:`require_supported_verl` themselves.
"""

from __future__ import annotations

import functools
import importlib.abc
import importlib.metadata
import importlib.util
import logging
import sys
from collections.abc import Callable

from recipes.verl_ext.patch_table import rows_for

__all__ = [
    "SUPPORTED_VERL",
    "UnsupportedVerlError",
    "apply_cpu_patches",
    "apply_flash_attn_fallbacks",
    "apply_trainer_patches",
    "flash_attn_installed",
    "apply_rollout_patches",
    "installed_verl_version",
    "require_supported_verl",
    "when_imported",
    "wrap_once",
]

logger = logging.getLogger(__name__)

SUPPORTED_VERL = "0.9.1"
"""The one verl version whose internals these patches were written against."""

_ROLLOUT_ADAPTER = "recipes.verl_ext.plugin.hf_rollout.HFRolloutAdapter"


class UnsupportedVerlError(RuntimeError):
    """The installed verl is not the version this pack's verl patches were written for."""


def installed_verl_version() -> str:
    """The installed verl's version (package metadata; ``verl.__version__`` if metadata is missing)."""
    try:
        return importlib.metadata.version("verl")
    except importlib.metadata.PackageNotFoundError:
        import verl  # lazy: only the fallback for a verl without package metadata needs it

        return verl.__version__


def require_supported_verl(found: str | None = None) -> str:
    """Return the installed verl version, or raise :class:`UnsupportedVerlError` if it is not :data:`SUPPORTED_VERL`.

    ``found`` overrides the detected version (for tests).
    """
    found = installed_verl_version() if found is None else found
    if found != SUPPORTED_VERL:
        raise UnsupportedVerlError(
            f"recipes.verl_ext.plugin patches verl internals and supports verl=={SUPPORTED_VERL} only, "
            f"found verl=={found}. Install the pinned version (pip install verl=={SUPPORTED_VERL}) or port the "
            f"{len(rows_for('verl'))} verl patches of recipes/verl_ext/patch_table.py to verl {found}."
        )
    return found


# ---- run a function right after a module is imported ------------------------------------------------------------

_after_import: dict[str, list[Callable]] = {}


class _AfterImportFinder(importlib.abc.MetaPathFinder):
    """Wraps the loader of a watched module so the registered callbacks run once its body has executed."""

    def find_spec(self, fullname, path, target=None):
        if fullname not in _after_import:
            return None
        for finder in sys.meta_path:
            if finder is self:
                continue
            spec = finder.find_spec(fullname, path, target) if hasattr(finder, "find_spec") else None
            if spec is not None and spec.loader is not None and hasattr(spec.loader, "exec_module"):
                spec.loader = _CallbackLoader(spec.loader, fullname)
                return spec
        return None


class _CallbackLoader(importlib.abc.Loader):
    def __init__(self, loader, fullname: str) -> None:
        self._loader = loader
        self._fullname = fullname

    def create_module(self, spec):
        return self._loader.create_module(spec)

    def exec_module(self, module) -> None:
        self._loader.exec_module(module)
        for callback in _after_import.pop(self._fullname, []):
            callback(module)

    def __getattr__(self, name):
        # everything else the wrapped loader offers (runpy's get_code for ``python -m <module>``, resources)
        return getattr(self._loader, name)


_FINDER = _AfterImportFinder()


def when_imported(module_name: str, callback: Callable) -> None:
    """Call ``callback(module)`` now if ``module_name`` is imported, else right after its first import."""
    module = sys.modules.get(module_name)
    if module is not None and getattr(getattr(module, "__spec__", None), "_initializing", False) is False:
        callback(module)
        return
    _after_import.setdefault(module_name, []).append(callback)
    if _FINDER not in sys.meta_path:
        sys.meta_path.insert(0, _FINDER)


# ---- the patches -------------------------------------------------------------------------------------------------


def wrap_once(owner, attr: str, marker: str, wrap: Callable[[Callable], Callable]) -> None:
    """``owner.attr = wrap(original)``, marked with ``marker``: a second call (the hook runs once per import, the
    plugin may be installed twice) leaves the wrapped one as it is."""
    original = getattr(owner, attr)
    if getattr(original, marker, False):
        return
    wrapped = wrap(original)
    setattr(wrapped, marker, True)
    setattr(owner, attr, wrapped)


def _register_hf_adapter(base_module) -> None:
    require_supported_verl()
    base_module._ROLLOUT_REGISTRY[("hf", "async")] = _ROLLOUT_ADAPTER


def _register_cpu_engines(engine_package) -> None:
    require_supported_verl()
    # lazy: a patch, run once verl.workers.engine is imported; at the top it would import the engines in every process
    from verl.workers.engine.base import EngineRegistry

    # lazy: the FSDP engines pull in transformers and peft (seconds); only this patch, on the CPU platform, needs them
    from verl.workers.engine.fsdp.transformer_impl import FSDPEngineWithLMHead, FSDPEngineWithValueHead

    for model_type, engine_cls in (("language_model", FSDPEngineWithLMHead), ("value_model", FSDPEngineWithValueHead)):
        registered = EngineRegistry._engines.get(model_type, {})
        if all("cpu" in registered.get(backend, {}) for backend in ("fsdp", "fsdp2")):
            continue
        EngineRegistry.register(model_type=model_type, backend=["fsdp", "fsdp2"], device="cpu")(engine_cls)


def _unpinned_cpu_offload(transformer_impl) -> None:
    require_supported_verl()
    policy_cls = transformer_impl.CPUOffloadPolicy
    if policy_cls is None or getattr(policy_cls, "_hybrid_engine_unpinned", False):
        return

    @functools.wraps(policy_cls, updated=())
    def unpinned(*args, pin_memory: bool = True, **kwargs):
        return policy_cls(*args, pin_memory=False, **kwargs)

    unpinned._hybrid_engine_unpinned = True
    transformer_impl.CPUOffloadPolicy = unpinned


def _gloo_process_group(distributed) -> None:
    require_supported_verl()

    def wrap(original):
        @functools.wraps(original)
        def initialize_global_process_group_ray(timeout_second=None, backend=None):
            return original(timeout_second=timeout_second, backend=backend or "cpu:gloo")

        return initialize_global_process_group_ray

    wrap_once(distributed, "initialize_global_process_group_ray", "_hybrid_engine_gloo", wrap)


def _sdpa_value_model(model_utils) -> None:
    require_supported_verl()

    def wrap(original):
        @functools.wraps(original)
        def load_valuehead_model(local_path, torch_dtype, model_config, trust_remote_code):
            return _load_value_model(local_path, torch_dtype, model_config, trust_remote_code)

        return load_valuehead_model

    wrap_once(model_utils, "load_valuehead_model", "_hybrid_engine_sdpa", wrap)


VALUE_HEAD_SEED = 0
"""The seed of the critic's value head (the one new layer of a model loaded as a token classifier): verl draws it from
whatever state the worker's generator is in, so no two runs of one command started from the same critic."""


def _load_value_model(local_path, torch_dtype, model_config, trust_remote_code):
    """verl's loader without its hard-coded flash_attention_2 (and without its trl fallback), its new value head
    drawn from :data:`VALUE_HEAD_SEED` (the process's own generator left as it was)."""
    import torch  # lazy: as transformers below

    # lazy: half a second in every process that imports verl; only the critic's model load needs it
    from transformers import AutoModelForTokenClassification

    # verl's first choice (a token-classification head with one label), with the config's attention (set from
    # override_config by verl's model config; pack_varlen on a GPU without flash-attn), sdpa for flash-attention.
    attention = getattr(model_config, "_attn_implementation", None)
    if attention in (None, "flash_attention_2"):
        attention = "sdpa"
    elif attention == "pack_varlen":
        _register_varlen_attention()
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(VALUE_HEAD_SEED)
        return AutoModelForTokenClassification.from_pretrained(
            pretrained_model_name_or_path=local_path,
            torch_dtype=torch_dtype,
            config=model_config,
            attn_implementation=attention,
            trust_remote_code=trust_remote_code,
        )


def _sharded_export(engine_class: str, export_name: str):
    """The patch for ``transformer_impl.<engine_class>.get_per_tensor_param``: its generator (not started) goes to
    ``weight_sync.<export_name>``, which puts the engine's own sharded weights beside it (LoRA: verl's, untouched)."""

    def patch(transformer_impl) -> None:
        require_supported_verl()

        def wrap(original):
            @functools.wraps(original)
            def get_per_tensor_param(self, *args, **kwargs):
                # lazy: verl imports this module in every process; only one whose engine exports weights needs it
                import recipes.verl_ext.plugin.weight_sync as weight_sync

                per_tensor_param, peft_config = original(self, *args, **kwargs)  # also loads offloaded weights
                if peft_config is not None:
                    return per_tensor_param, peft_config
                return getattr(weight_sync, export_name)(self, per_tensor_param), peft_config

            return get_per_tensor_param

        wrap_once(getattr(transformer_impl, engine_class), "get_per_tensor_param", "_hybrid_engine_sharded", wrap)

    return patch


_sharded_weight_export = _sharded_export("FSDPEngine", "export_sharded")
_megatron_sharded_weight_export = _sharded_export("MegatronEngine", "export_megatron_sharded")


def _redacted_config_print(module) -> None:
    """verl's task runners print the whole resolved config (``pprint`` in main_ppo / main_ppo_v0), which lands in the
    terminal, the run's verl.log and Ray's worker logs: print it with the pack's redaction policy applied."""
    from pprint import pprint  # lazy: only the task runner's module needs it

    # lazy: recipes.record.redact is a leaf; this module loads in every verl process
    from recipes.record.redact import redact_config

    def redacted_pprint(obj, *args, **kwargs):
        pprint(redact_config(obj) if isinstance(obj, dict | list) else obj, *args, **kwargs)

    module.pprint = redacted_pprint


def apply_record_patches() -> None:
    """What verl prints or writes of the config goes through the pack's redaction (secrets only)."""
    require_supported_verl()
    when_imported("verl.trainer.main_ppo", _redacted_config_print)
    when_imported("verl.trainer.main_ppo_v0", _redacted_config_print)


def _configurable_poll_interval(replay_buffer) -> None:
    require_supported_verl()

    def wrap(original):
        @functools.wraps(original)
        def __init__(self, *args, **kwargs):
            original(self, *args, **kwargs)
            interval = (getattr(self, "sampler_kwargs", None) or {}).get("poll_interval")
            if interval is not None:
                self.poll_interval = float(interval)

        return __init__

    wrap_once(replay_buffer.ReplayBuffer, "__init__", "_hybrid_engine_poll", wrap)


def _router_by_value(router) -> None:
    """verl's request load balancer reaches its Ray worker by value (its code in the pickle), not by a reference to
    verl's module: ``GlobalRequestLoadBalancer`` is plain Python over ``ray``, ``random`` and ``cachetools``, and its
    worker then builds it without importing torch and verl (4-5 CPU-s on 2 cores, while the agent-loop workers start
    for the first step). The same class, the same calls."""
    require_supported_verl()
    import ray.cloudpickle  # lazy: the router module is imported only where Ray runs

    ray.cloudpickle.register_pickle_by_value(router)


def _early_router(router) -> None:
    """verl's ``get_router_handle`` returns the request router the driver started early, with the servers added,
    when it was made for these arguments (recipes/verl_ext/early_router.py), else builds verl's own."""
    require_supported_verl()
    from recipes.verl_ext import early_router  # lazy: the module is for verl's task runner only

    def wrap(original):
        @functools.wraps(original)
        def get_router_handle(servers, router_config_path=None, full_determinism=False, load_balancer_cls=None):
            adopted = early_router.adopt(servers, router_config_path, full_determinism, load_balancer_cls)
            if adopted is not None:
                return adopted
            return original(servers, router_config_path=router_config_path, full_determinism=full_determinism,
                            load_balancer_cls=load_balancer_cls)

        return get_router_handle

    wrap_once(router, "get_router_handle", "_hybrid_engine_early_router", wrap)


def _early_reward_workers(reward_loop) -> None:
    """verl's reward-loop manager takes the reward-loop workers the driver started early, when they were made for
    its config, else creates its own (recipes/verl_ext/early_reward.py)."""
    require_supported_verl()
    from recipes.verl_ext import early_reward  # lazy: the module is for verl's task runner only

    def wrap(original):
        @functools.wraps(original)
        def _init_reward_loop_workers(self):
            adopted = early_reward.adopt(self)
            if adopted is None:
                original(self)
            else:
                self.reward_loop_workers = adopted

        return _init_reward_loop_workers

    wrap_once(reward_loop.RewardLoopManager, "_init_reward_loop_workers", "_hybrid_engine_early_reward", wrap)


def _early_agent_loop_workers(agent_loop) -> None:
    """verl's agent-loop manager takes the worker processes the driver started early, built with its own arguments,
    else creates its own (recipes/verl_ext/early_agent_loop.py)."""
    require_supported_verl()
    from recipes.verl_ext import early_agent_loop  # lazy: the module is for verl's task runner only

    def wrap(original):
        @functools.wraps(original)
        async def _init_agent_loop_workers(self):
            adopted = await early_agent_loop.adopt(self)
            if adopted is None:
                await original(self)
            else:
                self.agent_loop_workers = adopted

        return _init_agent_loop_workers

    wrap_once(agent_loop.AgentLoopManager, "_init_agent_loop_workers", "_hybrid_engine_early_agent_loop", wrap)


class _DirectUtils:
    """``hydra.utils`` as verl's agent-loop module sees it: ``instantiate`` calls the class of a config that is only
    ``{"_target_": "module.Class"}`` (what verl's ``register`` records) with the keyword arguments as given, as
    Hydra calls it (verl wraps its configs and tool lists so that Hydra passes them on unconverted); any other
    config, or positional arguments, go to Hydra's own ``instantiate``. The rest is Hydra's."""

    def __init__(self, utils) -> None:
        self._utils = utils

    def __getattr__(self, name: str):
        return getattr(self._utils, name)

    def instantiate(self, config, *args, **kwargs):
        if not args and isinstance(config, dict) and set(config) == {"_target_"}:
            return self._utils.get_class(config["_target_"])(**kwargs)
        return self._utils.instantiate(config, *args, **kwargs)


class _HydraDirect:
    """``hydra`` as verl's agent-loop module sees it: Hydra, with :class:`_DirectUtils` as ``utils``."""

    def __init__(self, hydra_module) -> None:
        self._hydra = hydra_module
        self.utils = _DirectUtils(hydra_module.utils)

    def __getattr__(self, name: str):
        return getattr(self._hydra, name)


def _direct_agent_loop_instantiate(agent_loop) -> None:
    require_supported_verl()
    if not isinstance(agent_loop.hydra, _HydraDirect):
        agent_loop.hydra = _HydraDirect(agent_loop.hydra)


def apply_trainer_patches() -> None:
    """What every run needs of verl's v1 trainer, on any device: the replay buffer's poll interval from config; the
    request load balancer's worker without verl's imports; the reward-loop and agent-loop workers and the request
    router started early adopted."""
    require_supported_verl()
    when_imported("verl.trainer.ppo.v1.replay_buffer", _configurable_poll_interval)
    when_imported("verl.workers.rollout.router", _router_by_value)
    when_imported("verl.workers.rollout.router", _early_router)
    when_imported("verl.experimental.reward_loop.reward_loop", _early_reward_workers)
    when_imported("verl.experimental.agent_loop.agent_loop", _early_agent_loop_workers)
    when_imported("verl.experimental.agent_loop.agent_loop", _direct_agent_loop_instantiate)


def _checked_vllm_sync(vllm_rollout) -> None:
    """verl's sync into vLLM, timed and checked by checksum (:mod:`.vllm_sync`); the engine's export carries its own
    parameters beside verl's stream from now on in this process, for the training-side checksums."""
    require_supported_verl()
    # lazy: verl imports this module in every process; only one that builds a vLLM rollout adapter needs these
    from recipes.verl_ext.plugin import vllm_sync
    from recipes.verl_ext.plugin.weight_sync import enable_sharded_export  # lazy: as the line above

    enable_sharded_export()
    wrap_once(vllm_rollout.ServerAdapter, "update_weights", "_hybrid_engine_checked", vllm_sync.wrap_update_weights)


def _vllm_readback(vllm_utils) -> None:
    """verl's vLLM worker extension gets the read-back of the loaded weights (``klppo_loaded_checksums``)."""
    require_supported_verl()
    from recipes.verl_ext.plugin import vllm_sync  # lazy: as in _checked_vllm_sync

    # the name is vllm_sync.READBACK_METHOD, written out for the patch table's check
    vllm_utils.vLLMColocateWorkerExtension.klppo_loaded_checksums = vllm_sync.worker_loaded_checksums


def _rpc_results(vllm_async_server) -> None:
    """verl's vLLM server returns what its workers' ``collective_rpc`` returned (verl drops it): the read-back's
    checksums come back through it."""
    require_supported_verl()

    def wrap(original):
        @functools.wraps(original)
        async def collective_rpc(self, method, timeout=None, args=(), kwargs=None):
            return await self.engine.collective_rpc(method=method, timeout=timeout, args=args, kwargs=kwargs)

        return collective_rpc

    wrap_once(vllm_async_server.vLLMHttpServer, "collective_rpc", "_hybrid_engine_rpc_results", wrap)


def apply_rollout_patches() -> None:
    """Make ``rollout.name=hf`` resolvable in verl's workers, and let its weight sync use the resharder; time and
    check verl's sync into vLLM. Additive: other rollouts get verl's weight stream unchanged (the export carries the
    engine's parameters beside it only in a process with an hf or vLLM rollout adapter)."""
    require_supported_verl()
    when_imported("verl.workers.rollout.base", _register_hf_adapter)
    when_imported("verl.workers.engine.fsdp.transformer_impl", _sharded_weight_export)
    when_imported("verl.workers.engine.megatron.transformer_impl", _megatron_sharded_weight_export)
    when_imported("verl.workers.rollout.vllm_rollout.vllm_rollout", _checked_vllm_sync)
    when_imported("verl.workers.rollout.vllm_rollout.utils", _vllm_readback)
    when_imported("verl.workers.rollout.vllm_rollout.vllm_async_server", _rpc_results)


def flash_attn_installed() -> bool:
    """True where the flash-attn package can be imported (verl's hard-coded ``flash_attention_2`` needs it)."""
    return importlib.util.find_spec("flash_attn") is not None


def _varlen_default_attention(model_config) -> None:
    require_supported_verl()

    def wrap(original):
        @functools.wraps(original)
        def __post_init__(self):
            # lazy: transformers' attention registry; only a process that builds a model config needs it
            from recipes.verl_ext.plugin.varlen_attention import NAME

            _register_varlen_attention()
            if "attn_implementation" not in self.override_config:  # what verl would read as flash_attention_2
                self.override_config["attn_implementation"] = NAME  # in place: the field is frozen
            original(self)

        return __post_init__

    wrap_once(model_config.HFModelConfig, "__post_init__", "_hybrid_engine_varlen", wrap)


def apply_flash_attn_fallbacks() -> None:
    """On an accelerator machine without flash-attn: a model config that names no attention takes ``pack_varlen``
    (packed and padded batches alike, as flash-attn would run them), the critic's value model loads with its
    config's attention, and log-probs come from ``logprobs.chunked_logprobs`` instead of verl's row loop. Where
    flash-attn is installed nothing changes (verl keeps ``flash_attention_2`` and its fused cross-entropy)."""
    require_supported_verl()
    if flash_attn_installed():
        return
    when_imported("verl.workers.config.model", _varlen_default_attention)
    # a worker builds its models from a config made in another process: the name must be registered there too
    when_imported("verl.workers.engine.fsdp.transformer_impl", _register_varlen_attention)
    when_imported("verl.utils.torch_functional", _chunked_logprobs)
    when_imported("verl.workers.engine.fsdp.transformer_impl", _chunked_logprobs)  # its own name for the function
    when_imported("verl.utils.model", _sdpa_value_model)


def _chunked_logprobs(module) -> None:
    """``module.logprobs_from_logits`` becomes the plugin's chunked fp32 version (verl's is a row loop here)."""
    require_supported_verl()
    # lazy: torch autograd code, only a process that computes log-probs with verl needs it
    from recipes.verl_ext.plugin.logprobs import chunked_logprobs

    module.logprobs_from_logits = chunked_logprobs


def _register_varlen_attention(_module=None) -> None:
    # lazy: transformers' attention registry, in a process that builds models
    from recipes.verl_ext.plugin.varlen_attention import register

    register()


def _cpu_micro_batches_in_place(transformer_impl) -> None:
    """On the CPU, each FSDP engine's ``forward_step`` begins with ``micro_batch.to("cpu")``: a tensordict without a
    device walks every per-sample entry to move tensors that are already there (a tenth of a second per step on the
    KL-PPO demo). The micro batch is marked as on the CPU first, where every tensor of the process is, so the move
    returns it as it is (tensordict's own path for a batch already on the target device)."""
    require_supported_verl()
    import torch  # lazy: a patch, run once the FSDP engines are imported

    cpu = torch.device("cpu")

    def wrap(original):
        @functools.wraps(original)
        def forward_step(self, micro_batch, *args, **kwargs):
            if getattr(micro_batch, "_device", cpu) is None:
                micro_batch._device = cpu
            return original(self, micro_batch, *args, **kwargs)

        return forward_step

    for engine in (transformer_impl.FSDPEngineWithLMHead, transformer_impl.FSDPEngineWithValueHead):
        wrap_once(engine, "forward_step", "_hybrid_engine_cpu_micro_batch", wrap)


def apply_cpu_patches() -> None:
    """What verl's CPU run needs beyond the platform. Only called when the CPU platform is wanted."""
    require_supported_verl()
    when_imported("verl.utils.distributed", _gloo_process_group)
    when_imported("verl.utils.model", _sdpa_value_model)
    when_imported("verl.workers.engine", _register_cpu_engines)
    when_imported("verl.workers.engine.fsdp.transformer_impl", _unpinned_cpu_offload)
    when_imported("verl.workers.engine.fsdp.transformer_impl", _cpu_micro_batches_in_place)
