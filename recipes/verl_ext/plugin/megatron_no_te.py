"""strategy=megatron without TransformerEngine: verl 0.9.1's Megatron engine on megatron-core's local layer spec.

Applied only where ``transformer_engine`` cannot be imported (:func:`apply_no_te_patches`, called by the plugin);
pinned to :data:`SUPPORTED_MEGATRON`. With TE installed nothing here runs. docs/megatron.md says why each is needed
and what the H200 runs of 2026-12-04 found.

Each patch, with what it changes and why, is a row of :data:`recipes.verl_ext.patch_table.PATCHES` (this module's
rows): the engine takes ``vanilla_mbridge`` (mbridge), padded batches and no masked-softmax fusion; mbridge builds
megatron-core's local layer spec, whose layernorm names map to TE's fused ones; the local attention gets no mask;
and the faults of that path in mbridge and megatron-core are worked around (rope theta under transformers 5, the
optimizer state a resume asks for first, a critic's tied checkpoint, a critic beside a tied actor).
"""

from __future__ import annotations

import functools
import importlib.metadata
import importlib.util

from recipes.verl_ext.patch_table import rows_for
from recipes.verl_ext.plugin.patches import UnsupportedVerlError, require_supported_verl, when_imported, wrap_once

__all__ = ["SUPPORTED_MEGATRON", "apply_no_te_patches", "require_supported_megatron", "transformer_engine_installed"]

SUPPORTED_MEGATRON = {"megatron-core": "0.16.1", "mbridge": "0.15.1"}
"""The megatron packages the no-TE patch was written against: the ``[megatron]`` extra of pyproject.toml pins these."""


def transformer_engine_installed() -> bool:
    """True where the transformer_engine package can be imported (mbridge's layer spec and Megatron-Bridge need it)."""
    return importlib.util.find_spec("transformer_engine") is not None


def apply_no_te_patches() -> None:
    """Where TransformerEngine cannot be imported: verl's Megatron engine runs mbridge with megatron-core's local
    layer spec (see the table above); the launcher notes it once a run is valid (recipes/check/needs.py engine_notes).
    Where TE is installed nothing changes."""
    require_supported_verl()
    if transformer_engine_installed():
        return
    when_imported("verl.workers.config.engine", _no_te_engine_config)
    when_imported("megatron.core.transformer.dot_product_attention", _causal_mask_only)
    when_imported("mbridge.core.llm_bridge", _local_layer_spec)
    when_imported("mbridge.core.llm_bridge", _rope_theta_from_rope_parameters)
    when_imported("mbridge.core.bridge", _local_layernorm_names)
    when_imported("mbridge.core.bridge", _mapping_per_bridge)
    when_imported("megatron.core.optimizer.distrib_optimizer", _fresh_optimizer_state)
    when_imported("mbridge.core.safetensor_io", _tied_output_layer)


def _no_te_engine_config(engine_config) -> None:
    require_supported_verl()

    def wrap(original):
        @functools.wraps(original)
        def __post_init__(self):
            # vanilla_mbridge is frozen once set (verl's BaseConfig): written as dataclass __init__ writes it
            object.__setattr__(self, "vanilla_mbridge", True)
            self.use_remove_padding = False
            self.override_transformer_config["masked_softmax_fusion"] = False  # in place: the field is frozen
            original(self)

        return __post_init__

    wrap_once(engine_config.McoreEngineConfig, "__post_init__", "_hybrid_engine_no_te", wrap)
    wrap_once(engine_config.McoreEngineConfig, "__setattr__", "_hybrid_engine_no_te", _padded_batches_only)


def _padded_batches_only(original):
    """verl's engine workers assign ``engine_config.use_remove_padding`` from the model config after the config is
    built (verl/workers/engine_workers.py): without TE that assignment keeps False."""

    @functools.wraps(original)
    def __setattr__(self, name, value):
        original(self, name, False if name == "use_remove_padding" else value)

    return __setattr__


def _causal_mask_only(dot_product_attention) -> None:
    require_supported_megatron()
    causal = dot_product_attention.AttnMaskType.causal

    def wrap(original):
        @functools.wraps(original)
        def forward(self, query, key, value, attention_mask, *args, **kwargs):
            # verl's bshd mask ([b, s], True on the tokens to keep) is the inverse of megatron-core's (True = masked);
            # it is also the mask verl un-pads the output with, so it is dropped here and not where verl builds it
            if self.attn_mask_type == causal:
                attention_mask = None
            return original(self, query, key, value, attention_mask, *args, **kwargs)

        return forward

    wrap_once(dot_product_attention.DotProductAttention, "forward", "_hybrid_engine_no_te", wrap)


def _local_layer_spec(llm_bridge) -> None:
    require_supported_megatron()

    def wrap(original):
        @functools.wraps(original)
        def get_gpt_decoder_block_spec(config, use_transformer_engine=True, **kwargs):
            return original(config, use_transformer_engine=False, **kwargs)

        return get_gpt_decoder_block_spec

    wrap_once(llm_bridge, "get_gpt_decoder_block_spec", "_hybrid_engine_no_te", wrap)


def _rope_theta_from_rope_parameters(llm_bridge) -> None:
    require_supported_megatron()

    def wrap(original):
        @functools.wraps(original)
        def _get_gptmodel_args(self):
            # lazy: verl's megatron utils, only a process that builds a Megatron model needs them
            from verl.utils.megatron_utils import get_hf_rope_theta

            if getattr(self.hf_config, "rope_theta", None) is None:
                self.hf_config.rope_theta = get_hf_rope_theta(self.hf_config)
            return original(self)

        return _get_gptmodel_args

    wrap_once(llm_bridge.LLMBridge, "_get_gptmodel_args", "_hybrid_engine_no_te", wrap)


def _fresh_optimizer_state(distrib_optimizer) -> None:
    require_supported_megatron()

    def wrap(original):
        @functools.wraps(original)
        def state_dict(self):
            # with torch's Adam (no TE, no apex) megatron-core reads one 'step' off the inner optimizer's state and
            # asserts it exists; a resume asks before the first step, when there is none. The state torch's Adam
            # would create at its first step (zero moments, step 0) is the same optimizer: it is created here.
            if not distrib_optimizer.HAVE_APEX_OR_TE and not self.optimizer.state and self.init_state_fn:
                import torch  # lazy: loaded already where megatron-core is; the plugin module stays torch-free

                self.init_state_fn(self.optimizer, self.config)
                for state in self.optimizer.state.values():
                    state.setdefault("step", torch.tensor(0.0))
            return original(self)

        return state_dict

    wrap_once(distrib_optimizer.DistributedOptimizer, "state_dict", "_hybrid_engine_no_te", wrap)


_HF_HEAD, _HF_EMBEDDING = "lm_head.weight", "model.embed_tokens.weight"


def _tied_output_layer(safetensor_io) -> None:
    require_supported_megatron()

    def wrap(original):
        @functools.wraps(original)
        def load_some_hf_weight(self, hf_weight_names):
            # a critic (value model) asks for lm_head.weight to skip it (mbridge's Bridge.load_weights); a
            # tied-embedding checkpoint (the tiny model, Qwen2.5-0.5B) has none: it is the embedding. verl's
            # Megatron-Bridge path allows the mismatch; mbridge, which runs without TE, raised. mbridge also counts
            # what it read against the names asked, so a name asked twice (a critic's lm_head.weight on a resume
            # on the H200, 2026-12-04) failed as "Weights set() not found": each name is read once
            names = list(dict.fromkeys(hf_weight_names))
            if _HF_HEAD not in names or _HF_HEAD in self.load_hf_weight_names():
                return original(self, names)
            weights = original(
                self, [n for n in names if n != _HF_HEAD] + [_HF_EMBEDDING] * (_HF_EMBEDDING not in names)
            )
            weights[_HF_HEAD] = weights[_HF_EMBEDDING] if _HF_EMBEDDING in names else weights.pop(_HF_EMBEDDING)
            return weights

        return load_some_hf_weight

    wrap_once(safetensor_io.SafeTensorIO, "load_some_hf_weight", "_hybrid_engine_no_te", wrap)


def _local_layernorm_names(bridge) -> None:
    require_supported_megatron()

    def wrap(original):
        @functools.wraps(original)
        def _weight_name_mapping_mcore_to_hf(self, mcore_weights_name: str) -> list[str]:
            # lazy: the resharder's module (its torch.distributed helpers) is needed in mbridge's processes only
            from hybrid_engine.reshard.megatron import LOCAL_SPEC_NAMES

            for local, fused in LOCAL_SPEC_NAMES.items():
                if mcore_weights_name.endswith("." + local):
                    mcore_weights_name = mcore_weights_name[: -len(local)] + fused
                    break
            return original(self, mcore_weights_name)

        return _weight_name_mapping_mcore_to_hf

    wrap_once(bridge.Bridge, "_weight_name_mapping_mcore_to_hf", "_hybrid_engine_no_te", wrap)


def _mapping_per_bridge(bridge) -> None:
    require_supported_megatron()

    def wrap(original):
        @functools.wraps(original)
        def __init__(self, *args, **kwargs):
            # mbridge's Qwen2 bridge ties a tied config's output layer to the embedding by writing into the class's
            # _DIRECT_MAPPING, so every bridge of the process maps output_layer.weight to model.embed_tokens.weight
            # from then on. verl builds the critic's bridge untied (a value head is never tied) beside the tied
            # actor's: its (1, hidden) value head was saved over the embedding, and the resume failed (H200,
            # 2026-12-05). Each bridge gets its own copy, which its own config adjusts.
            self._DIRECT_MAPPING = dict(type(self)._DIRECT_MAPPING)
            original(self, *args, **kwargs)

        return __init__

    wrap_once(bridge.Bridge, "__init__", "_hybrid_engine_no_te", wrap)


def require_supported_megatron() -> None:
    """Raise :class:`UnsupportedVerlError` where megatron-core or mbridge is not the version in
    :data:`SUPPORTED_MEGATRON` (the no-TE patch rewrites their internals)."""
    for package, wanted in SUPPORTED_MEGATRON.items():
        found = importlib.metadata.version(package)
        if found != wanted:
            raise UnsupportedVerlError(
                f"the no-TransformerEngine patch supports {package}=={wanted} only, found {package}=={found}: "
                f"pip install 'klppo-recipes[megatron]' (or port its {len(rows_for(package))} patches of "
                f"recipes/verl_ext/patch_table.py)"
            )
