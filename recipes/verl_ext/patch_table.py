"""Every change the pack makes inside another project, in one table: what to re-read when one of them moves.

Each :class:`Patch` is one thing the pack replaces, wraps, registers or clears in verl, vLLM, Ray, OmegaConf, Hydra,
TransferQueue, tensordict, transformers, megatron-core or mbridge, with the pack file that does it and the version of
the other project it was read against. ``tests/recipes/verl_ext/test_patch_table.py`` reads every file of
``recipes/`` and ``hydra_plugins/`` and fails on a patch this table does not name, and on a row no code makes (its
docstring says what counts as a patch). The verl patches refuse any verl other than the pinned one
(``recipes.verl_ext.plugin.patches.require_supported_verl``), the megatron ones any other megatron-core or mbridge
(``megatron_no_te.require_supported_megatron``); their error messages count the rows to port (:func:`rows_for`).

Rows marked ``reads``: a private registry the pack only reads (its names), changing nothing.

Not rows: what the pack does through an object it made itself (a model, a config node, a tensor), and what a
wrapper installed by a row does to ``self`` (the row's ``change`` says it).
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["PATCHES", "Patch", "rows_for"]


@dataclass(frozen=True)
class Patch:
    """One patch of another project's code or state."""

    module: str
    """the pack's file that makes it, relative to the repository root"""
    target: str
    """the dotted name of what is changed (``sys.modules[...]``: a module entry; ``X[key]``: an entry of ``X``)"""
    change: str
    """what the pack does to it"""
    why: str
    """why there is no other way"""
    read_against: str
    """``"<package> <version>"``: the version of the patched project whose code this was written for"""
    seen_as: str = ""
    """the target as the pack's code reaches it, where that is not ``target`` (an imported alias, an object verl hands
    in): what the test matches at the site"""
    reads: bool = False
    """a read-only touch (a private registry's names, read to check a config): nothing is changed; the test matches
    a reference to the target in the module"""

    @property
    def package(self) -> str:
        """The distribution named in :attr:`read_against` (``"verl"``, ``"megatron-core"``)."""
        return self.read_against.rsplit(" ", 1)[0]


VERL = "verl 0.9.1"
RAY = "ray 2.60.0"
OMEGACONF = "omegaconf 2.3.1"
HYDRA = "hydra-core 1.3.8"
TRANSFER_QUEUE = "TransferQueue 0.1.11"
TENSORDICT = "tensordict 0.10.0"
TRANSFORMERS = "transformers 5.10.4"
MEGATRON = "megatron-core 0.16.1"
MBRIDGE = "mbridge 0.15.1"

_PATCHES = "recipes/verl_ext/plugin/patches.py"
_PLUGIN = "recipes/verl_ext/plugin/__init__.py"
_VARLEN = "recipes/verl_ext/plugin/varlen_attention.py"
_NO_TE = "recipes/verl_ext/plugin/megatron_no_te.py"
_HOOKS = "recipes/verl_ext/stability/verl_hooks.py"
_FSDP = "verl.workers.engine.fsdp.transformer_impl"
_NO_TE_WHY = ("without TransformerEngine (only where it cannot be imported): mbridge hard-codes TE's layer spec and "
              "Megatron-Bridge, verl's default, needs TE (docs/megatron.md)")

PATCHES: tuple[Patch, ...] = (
    # ---- verl's plugin (recipes/verl_ext/plugin): the hf rollout, the CPU platform, flash-attn's absence -------------
    Patch(_PATCHES, "verl.workers.rollout.base._ROLLOUT_REGISTRY[('hf', 'async')]",
          "adds the hf rollout adapter (recipes.verl_ext.plugin.hf_rollout.HFRolloutAdapter)",
          "verl's worker builds its rollout adapter from this private table; it has no public registration", VERL),
    Patch(_PLUGIN, "verl.workers.rollout.replica.RolloutReplicaRegistry.register",
          "registers the hf rollout replica (recipes.verl_ext.plugin.hf_rollout.HFReplica) once the module is "
          "imported",
          "rollout.name=hf: verl's public registry of rollout servers", VERL),
    Patch(_PLUGIN, "verl.plugin.platform.PlatformRegistry.register",
          "registers the CPU platform (recipes.verl_ext.plugin.platform.PlatformCPU), only where it is wanted",
          "verl's public registry of platforms; verl has none for a machine without an accelerator", VERL),
    Patch(_PATCHES, "verl.workers.engine.base.EngineRegistry.register",
          "registers verl's own FSDP engines (FSDPEngineWithLMHead/WithValueHead) for device cpu (CPU platform only)",
          "verl registers them for cuda and npu only; the same classes run on the CPU", VERL),
    Patch(_PATCHES, f"{_FSDP}.CPUOffloadPolicy",
          "replaced by a function that builds torch's CPUOffloadPolicy with pin_memory=False (CPU platform only)",
          "the forward-only ref model gets CPUOffloadPolicy(pin_memory=True); pinning needs an accelerator", VERL),
    Patch(_PATCHES, "verl.utils.distributed.initialize_global_process_group_ray",
          "wrapped: the backend defaults to 'cpu:gloo' (CPU platform only)",
          "verl asks torch for 'cpu:gloo,<device>:<backend>', which is 'cpu:gloo,cpu:gloo' on the CPU: torch rejects "
          "the duplicate", VERL),
    Patch(_PATCHES, "verl.utils.model.load_valuehead_model",
          "wrapped: the critic's value model loads with its model config's attention (sdpa where flash_attention_2 "
          "is named; pack_varlen registered where it is named) (CPU platform, or a GPU machine without flash-attn), "
          "its new value head drawn from a fixed seed",
          "verl hard-codes attn_implementation='flash_attention_2', and its fallback asks for trl and fails (seen on "
          "an H200, 2026-12-01); verl draws the value head from the worker's generator as it happens to be, so no "
          "two KL-PPO runs of one command started from the same critic", VERL),
    Patch(_PATCHES, "verl.workers.config.model.HFModelConfig.__post_init__",
          "wrapped: a model config that names no attention gets pack_varlen (PyTorch's own varlen kernel, "
          "recipes.verl_ext.plugin.varlen_attention), written into its frozen override_config in place (GPU machine "
          "without flash-attn)",
          "verl's default flash_attention_2 is refused by transformers without flash-attn; the recipes' "
          "remove-padding batches then run as they would with flash-attn", VERL),
    Patch(_VARLEN, "transformers.AttentionInterface.register",
          "registers the attention 'pack_varlen' (in each process that builds models, where flash-attn is missing)",
          "the model configs above name it; transformers' public registry of attention functions", TRANSFORMERS),
    Patch(_VARLEN, "transformers.masking_utils.AttentionMaskInterface.register",
          "registers transformers' own flash_attention_mask under 'pack_varlen'",
          "an attention name needs its mask function; pack_varlen takes the 2-D padding mask as flash-attn does",
          TRANSFORMERS),
    Patch(_PATCHES, "verl.utils.torch_functional.logprobs_from_logits",
          "replaced by recipes.verl_ext.plugin.logprobs.chunked_logprobs (fp32 logsumexp in chunks, in-place "
          "backward) (GPU machine without flash-attn)",
          "without flash-attn verl computes log-probs with a Python loop over every token (logprobs_from_logits_v2)",
          VERL),
    Patch(_PATCHES, f"{_FSDP}.logprobs_from_logits",
          "the same replacement, under the FSDP engine's own imported name",
          "the engine module binds the function at import; replacing it in torch_functional alone misses it", VERL),
    Patch(_PATCHES, f"{_FSDP}.FSDPEngineWithLMHead.forward_step",
          "wrapped: the micro batch is marked as on the CPU (tensordict's _device) before verl's "
          "micro_batch.to('cpu') (CPU platform only)",
          "a tensordict without a device walks every per-sample entry to move tensors already there (a tenth of a "
          "second per step on the KL-PPO demo)", VERL),
    Patch(_PATCHES, f"{_FSDP}.FSDPEngineWithValueHead.forward_step",
          "the same wrap for the critic's engine", "as for FSDPEngineWithLMHead.forward_step", VERL),
    Patch(_PATCHES, "tensordict.TensorDict._device",
          "set to the CPU device on a micro batch that has no device (inside the forward_step wrap above)",
          "TensorDict.to returns a batch already on the target device as it is; the private field says so without "
          "a copy", TENSORDICT, seen_as="micro_batch._device"),
    Patch(_PATCHES, f"{_FSDP}.FSDPEngine.get_per_tensor_param",
          "wrapped: in a process hosting the hf rollout the export also carries the FSDP2 state dict "
          "(weight_sync.export_sharded), so the weight sync runs through hybrid_engine.reshard; verl's generator "
          "elsewhere and for LoRA/QAT/FSDP1",
          "verl's export all-gathers every tensor on every rank; its engine has no hook for another transport", VERL),
    Patch(_PATCHES, "verl.workers.engine.megatron.transformer_impl.MegatronEngine.get_per_tensor_param",
          "wrapped: the same for strategy=megatron (weight_sync.export_megatron_sharded): the GPTModel's own "
          "parameters beside mbridge's generator; verl's for LoRA/QAT/virtual pipeline/context or expert parallelism",
          "as for FSDPEngine.get_per_tensor_param", VERL),
    Patch(_PATCHES, "verl.workers.rollout.vllm_rollout.vllm_rollout.ServerAdapter.update_weights",
          "wrapped (vllm_sync.wrap_update_weights): checksums of the weights in the rollout's dtype before verl's "
          "sync, verl's sync timed, the vLLM workers' loaded weights read back and compared; a record in "
          "weight_sync.jsonl; SyncCheckFailed on a mismatch. verl's stream sent in the rollout's dtype where the "
          "last read-back found vLLM holding it so, a tied lm_head left out. LoRA and delta updates pass through",
          "verl's sync into vLLM has no hook before or after the stream and checks nothing of what vLLM loads",
          VERL),
    Patch(_PATCHES, "verl.workers.rollout.vllm_rollout.utils.vLLMColocateWorkerExtension.klppo_loaded_checksums",
          "added (vllm_sync.worker_loaded_checksums): the checksums of the worker's loaded weights under HF names, "
          "in the rollout's dtype, and the dtype each is held in",
          "the worker extension is the only code verl runs inside vLLM's worker processes, where the weights are",
          VERL),
    Patch(_PATCHES, "verl.workers.rollout.vllm_rollout.vllm_async_server.vLLMHttpServer.collective_rpc",
          "replaced by one that returns the engine's collective_rpc result (the workers' return values)",
          "verl's server awaits the workers' replies and drops them; the read-back's checksums come back this way",
          VERL),
    Patch(_PATCHES, "verl.trainer.main_ppo.pprint",
          "replaced by a pprint that applies the pack's redaction (recipes.record.redact.redact_config) to a config",
          "verl's task runner prints the whole resolved config to the terminal, verl.log and Ray's worker logs", VERL),
    Patch(_PATCHES, "verl.trainer.main_ppo_v0.pprint",
          "the same for the legacy task runner (trainer.use_v1=false)", "as for verl.trainer.main_ppo.pprint", VERL),
    Patch(_PATCHES, "verl.trainer.ppo.v1.replay_buffer.ReplayBuffer.__init__",
          "wrapped: the poll interval comes from trainer.v1.sampler.sampler_kwargs.poll_interval where that key is "
          "given (the recipes set 0.1 s, 0.02 s on the CPU)",
          "the v1 trainer's replay buffer polls TransferQueue every 2 s, a constant", VERL),
    Patch(_PATCHES, "ray.cloudpickle.register_pickle_by_value",
          "verl.workers.rollout.router is pickled by value (its code in the pickle), not by reference",
          "the request load balancer's Ray worker then builds it without importing verl and torch (4-5 CPU-s on 2 "
          "cores while the agent-loop workers start); the module is plain Python over ray, random and cachetools",
          VERL),
    Patch(_PATCHES, "verl.workers.rollout.router.get_router_handle",
          "wrapped: returns the request router the driver started early (recipes/verl_ext/early_router.py), the "
          "servers added with its add_servers, for verl's default routing; else builds verl's own",
          "verl builds the router just before step 1, and unpickling the servers' handles loads the engine's "
          "server module in the router's fresh process (about 20 s for vLLM on an H100 machine) while the first "
          "requests wait; verl has no hook to hand in a router", VERL),
    Patch(_PATCHES, "verl.experimental.reward_loop.reward_loop.RewardLoopManager._init_reward_loop_workers",
          "wrapped: takes the reward-loop workers the driver started early (recipes/verl_ext/early_reward.py), "
          "else starts verl's own",
          "the workers start while verl builds its trainer, not after; verl has no hook to hand them in", VERL),
    Patch(_PATCHES, "verl.experimental.agent_loop.agent_loop.AgentLoopManager._init_agent_loop_workers",
          "wrapped: takes the agent-loop worker processes the driver started early "
          "(recipes/verl_ext/early_agent_loop.py), else starts verl's own",
          "as for _init_reward_loop_workers", VERL),
    Patch(_PATCHES, "verl.experimental.agent_loop.agent_loop.hydra",
          "the module's hydra replaced by a proxy whose utils.instantiate calls a registry entry that names only "
          "its class directly; every other call goes to Hydra's",
          "verl builds one agent loop per sample through Hydra's instantiate (OmegaConf merges: a fifth of the "
          "agent-loop worker's CPU on the CPU demo)", VERL),
    # ---- strategy=megatron without TransformerEngine (recipes/verl_ext/plugin/megatron_no_te.py) ---------------------
    Patch(_NO_TE, "verl.workers.config.engine.McoreEngineConfig.__post_init__",
          "wrapped: vanilla_mbridge=True (through object.__setattr__: the field is frozen), use_remove_padding=False "
          "(the packed thd path is TE's) and masked_softmax_fusion=False", _NO_TE_WHY, VERL),
    Patch(_NO_TE, "verl.workers.config.engine.McoreEngineConfig.__setattr__",
          "wrapped: an assignment of use_remove_padding keeps False",
          "verl's engine workers copy the model's use_remove_padding onto the engine config after it is built",
          VERL),
    Patch(_NO_TE, "megatron.core.transformer.dot_product_attention.DotProductAttention.forward",
          "wrapped: causal attention gets no mask",
          "megatron-core masks where the mask is True; verl's bshd mask is True on the tokens to keep, and "
          "right-padded rows under the causal mask need none", MEGATRON),
    Patch(_NO_TE, "mbridge.core.llm_bridge.get_gpt_decoder_block_spec",
          "wrapped: always use_transformer_engine=False (megatron-core's local layer spec)", _NO_TE_WHY, MBRIDGE),
    Patch(_NO_TE, "mbridge.core.llm_bridge.LLMBridge._get_gptmodel_args",
          "wrapped: hf_config.rope_theta set from verl's get_hf_rope_theta where it is missing",
          "mbridge reads hf_config.rope_theta, which transformers 5 keeps in rope_parameters", MBRIDGE),
    Patch(_NO_TE, "mbridge.core.bridge.Bridge._weight_name_mapping_mcore_to_hf",
          "wrapped: the local spec's separate layernorms (input_layernorm, pre_mlp_layernorm) map to the HF names of "
          "TE's fused ones", "mbridge's name table knows TE's layer names only", MBRIDGE),
    Patch(_NO_TE, "mbridge.core.bridge.Bridge.__init__",
          "wrapped: each bridge gets its own copy of the class's _DIRECT_MAPPING",
          "mbridge's Qwen2 bridge ties a tied config's output layer in the class's table, for every bridge of the "
          "process: a critic (untied) beside a tied actor saved its value head over the embedding (H200, 2026-12-05)",
          MBRIDGE),
    Patch(_NO_TE, "megatron.core.optimizer.distrib_optimizer.DistributedOptimizer.state_dict",
          "wrapped: with torch's Adam (no TE, no apex) the fresh optimizer state (zero moments, step 0) is created "
          "before a state dict is asked for",
          "megatron-core asserts one 'step' in the optimizer state, which a resume asks for before the first step",
          MEGATRON),
    Patch(_NO_TE, "mbridge.core.safetensor_io.SafeTensorIO.load_some_hf_weight",
          "wrapped: each name read once; a tied-embedding checkpoint hands the embedding for lm_head.weight",
          "a critic asks for lm_head.weight (to skip it for the value head), which a tied checkpoint lacks; mbridge "
          "raised, and a name asked twice failed as 'Weights set() not found' (H200, 2026-12-04)", MBRIDGE),
    # ---- the stability package (recipes/verl_ext/stability/verl_hooks.py) --------------------------------------------
    Patch(_HOOKS, "verl.trainer.ppo.v1.register_trainer",
          "registers StabilityTrainer under trainer.v1.trainer_mode=stability",
          "verl's public registry of v1 trainers", VERL),
    Patch(_HOOKS, "verl.utils.tensordict_utils.make_iterator",
          "replaced module-wide: takes the pack's keys (guard threshold, loss-side KL coefficient, a test's fault) "
          "off the update batch and, with a threshold, lets the KL guard end the mini-batch loop",
          "verl has no hook inside the mini-batch loop (the policy-loss registry sees one micro-batch, not the loop)",
          VERL, seen_as="verl.workers.engine_workers.tu.make_iterator"),
    Patch(_HOOKS, "verl.workers.engine_workers.TrainingWorker.train_batch",
          "wrapped: applies the step's KL coefficient to the loss, reports each update's actor/ppo_kl to the guard "
          "and agrees on the stop across ranks; a fault-injection test's OOM or NaN weights",
          "as for make_iterator", VERL),
    Patch(_HOOKS, "verl.workers.engine_workers.TrainingWorker.train_mini_batch",
          "wrapped: adds the guard/* metrics and steps the LR scheduler when the guard skipped the update that "
          "would have stepped it", "as for make_iterator", VERL),
    Patch(_HOOKS, "verl.workers.config.actor.ActorConfig.kl_loss_coef",
          "set through object.__setattr__ on the config of the actor's loss function (partial(ppo_loss, config=...))",
          "ActorConfig freezes kl_loss_coef after construction; the pack's KL controller changes it every step",
          VERL, seen_as="config.kl_loss_coef"),
    # ---- the driver: Ray, TransferQueue, verl's config checks ------------------------------------------------------
    Patch("recipes/verl_ext/ray_init.py", "ray.init",
          "wrapped while verl's run_ppo runs: the runtime env gets the pack's worker setup hook (GC thresholds, "
          "secret env vars), and the driver's SIGINT/SIGTERM handlers are put back after it",
          "verl's run_ppo calls ray.init itself with no hook for these; ray.init installs a SIGTERM handler that "
          "ends the process at once (no last checkpoint, no resume command)", RAY),
    Patch("recipes/verl_ext/api.py", "sys.modules['verl.workers.rollout.vllm_rollout.utils']",
          "a stand-in module with get_vllm_max_lora_rank on verl's fallback rank list, only while verl's "
          "validate_config runs and only where vLLM is not installed",
          "verl checks a LoRA rank by importing its vLLM rollout utilities, which import vLLM: on a machine without "
          "vLLM it fails before checking anything", VERL),
    # ---- read only: verl's registries, read to check names before Ray starts (recipes/check/lookups.py, issue 49) ----
    Patch("recipes/verl_ext/registries.py", "verl.workers.rollout.replica.RolloutReplicaRegistry._registry",
          "read: its names (the rollout engines verl can start a server for)",
          "actor_rollout_ref.rollout.name is looked up there only in a worker after Ray starts; the registry has no "
          "public list of its names", VERL, reads=True),
    Patch("recipes/verl_ext/registries.py", "verl.workers.rollout.base._ROLLOUT_REGISTRY",
          "read: its (name, mode) keys (the rollout engines a worker has an adapter for)",
          "get_rollout_class asserts the name in this private table inside the rollout worker", VERL, reads=True),
    Patch("recipes/verl_ext/registries.py", "verl.experimental.reward_loop.reward_manager.registry.REWARD_MANAGER",
          "read: its names (the reward managers of source=register)",
          "get_reward_manager_cls raises on an unknown name inside the reward-loop worker, without the choices; the "
          "module exports no list", VERL, reads=True),
    Patch("recipes/verl_ext/early_start.py", "transfer_queue.interface._TQ_STORAGE",
          "cleared (None) after the SimpleStorage units this process started are killed",
          "TransferQueue's close() waits for each storage unit to stop (about 1 s a run); with the record cleared it "
          "closes the client and the controller only", TRANSFER_QUEUE),
    # ---- OmegaConf and Hydra (composition speed, the launcher) ------------------------------------------------------
    Patch("recipes/compose/parse_memo.py", "omegaconf.base.parse",
          "replaced by grammar_parser.parse with an LRU of parse trees (4096 strings)",
          "OmegaConf parses an interpolation with its ANTLR grammar on every read: two thirds of a full resolution",
          OMEGACONF),
    Patch("recipes/compose/parse_memo.py", "omegaconf._utils.parse",
          "the same, under this module's imported name", "as for omegaconf.base.parse", OMEGACONF),
    Patch("recipes/compose/parse_memo.py", "omegaconf.resolvers.oc.parse",
          "the same, under this module's imported name", "as for omegaconf.base.parse", OMEGACONF),
    Patch("recipes/compose/resolvers.py", "omegaconf.OmegaConf.register_new_resolver",
          "registers the pack.* resolvers (once per process)", "OmegaConf's public registry of resolvers", OMEGACONF),
    Patch("recipes/compose/hydra_cache.py", "hydra._internal.config_repository.ConfigRepository.load_config",
          "replaced: each config file's parse is kept (keyed by its bytes' digest) and a deep copy handed out",
          "Hydra reads and parses about 110 files on every composition (0.46 -> 0.29 s each)", HYDRA),
    Patch("recipes/__init__.py", "hydra_plugins.__path__",
          "the launcher plugin's real folder appended to Hydra's plugin namespace package",
          "Hydra lists the hydra_plugins namespace folder by folder and misses an editable install's import hook "
          "(facebookresearch/hydra#2359)", HYDRA),
)
"""Every patch the pack makes, one row per target."""


def rows_for(package: str) -> tuple[Patch, ...]:
    """The rows read against ``package`` (a distribution name: ``"verl"``, ``"megatron-core"``)."""
    return tuple(row for row in PATCHES if row.package == package)
