"""Model specs: the architecture numbers of an HF model (``ModelArch``) and, from them, every tensor with its shape
and tensor-parallel partition (``ModelSpec``), without loading a weight.

``load_arch`` reads an HF ``config.json`` (a folder, a file, a shipped name such as ``qwen2_7b``, or a hub id of a
shipped model such as ``Qwen/Qwen2-7B-Instruct``: ``SHIPPED_HUB_IDS``). The shipped configs in
``hybrid_engine/model_configs/`` copy the public HF configs' architecture numbers (DeepSeek-V3 without its FP8
``quantization_config``: we plan in bf16). A malformed config is a ``ModelSpecError`` naming the file and the field.

Nothing at import time needs torch or transformers; ``build_spec(..., method="meta")`` imports them on demand.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path

__all__ = [
    "MODEL_CONFIG_DIR",
    "SHIPPED_HUB_IDS",
    "PARTITIONS",
    "ModelArch",
    "ModelSpec",
    "ModelSpecError",
    "TensorSpec",
    "arch_from_config",
    "build_spec",
    "load_arch",
    "longest_sequence",
    "looks_like_hub_id",
    "shipped_name_of_folder",
    "shipped_name_of_hub_id",
    "shipped_models",
    "units_range",
]

MODEL_CONFIG_DIR = Path(__file__).resolve().parent / "model_configs"

SHIPPED_HUB_IDS: dict[str, tuple[str, ...]] = {
    # a base model and its instruct model share every architecture number (they differ in max_position_embeddings,
    # bos/eos ids and the chat template, none of which a shape check or the plan reads)
    "qwen2_7b": ("Qwen/Qwen2-7B", "Qwen/Qwen2-7B-Instruct"),
    "qwen2_5_0_5b": ("Qwen/Qwen2.5-0.5B", "Qwen/Qwen2.5-0.5B-Instruct"),
    "qwen2_5_1_5b": ("Qwen/Qwen2.5-1.5B", "Qwen/Qwen2.5-1.5B-Instruct"),
    "qwen2_5_7b": ("Qwen/Qwen2.5-7B", "Qwen/Qwen2.5-7B-Instruct"),
    "qwen2_5_32b": ("Qwen/Qwen2.5-32B", "Qwen/Qwen2.5-32B-Instruct"),
    "llama3_1_8b": (
        "meta-llama/Llama-3.1-8B",
        "meta-llama/Llama-3.1-8B-Instruct",
        "meta-llama/Meta-Llama-3.1-8B",
        "meta-llama/Meta-Llama-3.1-8B-Instruct",
    ),
    "llama3_1_70b": (
        "meta-llama/Llama-3.1-70B",
        "meta-llama/Llama-3.1-70B-Instruct",
        "meta-llama/Meta-Llama-3.1-70B",
        "meta-llama/Meta-Llama-3.1-70B-Instruct",
    ),
    "qwen3_30b_a3b": ("Qwen/Qwen3-30B-A3B",),
    "deepseek_v3": ("deepseek-ai/DeepSeek-V3", "deepseek-ai/DeepSeek-V3-Base"),
}
"""Shipped name -> every hub id whose config.json has that shipped config's architecture numbers. The one table
that maps a hub id to a shipped config (``shipped_name_of_hub_id``, ``load_arch``)."""

_BY_HUB_ID = {hub.lower(): name for name, hubs in SHIPPED_HUB_IDS.items() for hub in hubs}
_HUB_SPELLING = {hub.lower(): hub for hubs in SHIPPED_HUB_IDS.values() for hub in hubs}
_HUB_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*/[A-Za-z0-9][A-Za-z0-9_.-]*")


def shipped_name_of_hub_id(text: str) -> str | None:
    """The shipped config of hub id ``text`` (case-insensitive, as the hub resolves ids), or None."""
    return _BY_HUB_ID.get(str(text).strip().rstrip("/").lower())


def shipped_name_of_folder(text: str) -> tuple[str, str] | None:
    """(shipped config, hub id) whose model name a path names: its last folder (``/models/Qwen3-30B-A3B``) or a hub
    cache folder on the way (``.../models--Qwen--Qwen3-30B-A3B/snapshots/<hash>``), case-insensitive; or None."""
    parts = [part for part in str(text).strip().replace("\\", "/").split("/") if part]
    for part in reversed(parts):
        if part.lower().startswith("models--") and part.count("--") >= 2:
            hub = "/".join(part.split("--", 2)[1:])
            if (name := shipped_name_of_hub_id(hub)) is not None:
                return name, _HUB_SPELLING[hub.lower()]
    last = parts[-1].lower() if parts else ""
    matches = {hub for hub in _HUB_SPELLING.values() if hub.split("/", 1)[1].lower() == last}
    if len(matches) == 1:
        (hub,) = matches
        return shipped_name_of_hub_id(hub), hub
    return None


def looks_like_hub_id(text: str) -> bool:
    """``owner/name`` and nothing else: no leading ``/``, ``.``, ``~``, no second ``/`` (then it is a path)."""
    return bool(_HUB_ID.fullmatch(str(text).strip().rstrip("/")))


class ModelSpecError(ValueError):
    """A model that cannot be found or described."""


def shipped_models() -> list[str]:
    """Names of the configs shipped in ``hybrid_engine/model_configs/``, sorted."""
    return sorted(p.parent.name for p in MODEL_CONFIG_DIR.glob("*/config.json"))


@dataclass(frozen=True, kw_only=True, slots=True)
class ModelArch:
    """Architecture numbers of a decoder-only causal LM, as its HF config.json states them."""

    name: str
    """Shipped name, folder name or file path the config came from."""
    model_type: str
    """HF ``model_type``: llama, qwen2, qwen3, qwen3_moe, deepseek_v3, ..."""
    hidden_size: int
    """Width of the residual stream."""
    intermediate_size: int
    """Width of a dense MLP (DeepSeek: of the first_k_dense layers)."""
    num_hidden_layers: int
    """Decoder layers (DeepSeek's multi-token-prediction layer is not counted: HF does not build it)."""
    num_attention_heads: int
    """Query heads."""
    num_key_value_heads: int
    """Key/value heads (GQA when smaller than the query heads)."""
    head_dim: int
    """Query/key width per head (MLA: qk_nope_head_dim + qk_rope_head_dim)."""
    vocab_size: int
    """Rows of the embedding and of lm_head."""
    tie_word_embeddings: bool = False
    """lm_head shares the embedding's weight (one tensor, counted once)."""
    max_position_embeddings: int = 0
    """Longest sequence the model was configured for."""
    torch_dtype: str = "bfloat16"
    """dtype the checkpoint is stored in."""
    qkv_bias: bool = False
    """q/k/v projections carry a bias (always for Qwen2; ``attention_bias`` elsewhere)."""
    o_bias: bool = False
    """o_proj carries a bias (``attention_bias`` for llama/qwen3/deepseek; never for qwen2)."""
    mlp_bias: bool = False
    """MLP projections carry a bias (llama ``mlp_bias``)."""
    qk_norm: bool = False
    """Per-head RMSNorm on q and k (Qwen3)."""
    num_experts: int = 0
    """Routed experts per MoE layer (Qwen ``num_experts``, DeepSeek ``n_routed_experts``); 0 = dense model."""
    num_experts_per_tok: int = 0
    """Routed experts each token visits."""
    moe_intermediate_size: int = 0
    """Width of one routed expert's MLP."""
    num_shared_experts: int = 0
    """Shared experts (DeepSeek ``n_shared_experts``), fused into one MLP of width n * moe_intermediate_size."""
    shared_expert_intermediate_size: int = 0
    """Width of the shared expert MLP (Qwen2-MoE style); DeepSeek: n_shared_experts * moe_intermediate_size."""
    first_k_dense: int = 0
    """DeepSeek ``first_k_dense_replace``: the first k layers keep a dense MLP."""
    moe_layer_freq: int = 1
    """Every n-th layer is MoE (DeepSeek ``moe_layer_freq``, Qwen ``decoder_sparse_step``)."""
    mlp_only_layers: tuple[int, ...] = ()
    """Qwen MoE: layers that keep a dense MLP."""
    q_lora_rank: int = 0
    """MLA: rank of the query down-projection (0 = plain q_proj)."""
    kv_lora_rank: int = 0
    """MLA: rank of the compressed key/value latent (0 = not MLA)."""
    qk_rope_head_dim: int = 0
    """MLA: rotary part of each query/key head."""
    qk_nope_head_dim: int = 0
    """MLA: non-rotary part of each query/key head."""
    v_head_dim: int = 0
    """MLA: width of each value head (otherwise head_dim)."""
    config: dict = field(default_factory=dict, repr=False, compare=False)
    """The raw config.json (used to build the model on the meta device)."""
    source: str = field(default="", compare=False)
    """Where these numbers were read, in words (``load_arch``: the config file; callers may say more)."""

    @property
    def is_moe(self) -> bool:
        return self.num_experts > 0

    @property
    def is_mla(self) -> bool:
        return self.kv_lora_rank > 0

    def is_moe_layer(self, layer: int) -> bool:
        """Whether decoder layer ``layer`` has routed experts (HF's rule for this model_type)."""
        if not self.is_moe:
            return False
        if self.model_type.startswith("deepseek"):
            return layer >= self.first_k_dense and layer % self.moe_layer_freq == 0
        return layer not in self.mlp_only_layers and (layer + 1) % self.moe_layer_freq == 0

    @property
    def moe_layers(self) -> list[int]:
        return [layer for layer in range(self.num_hidden_layers) if self.is_moe_layer(layer)]

    def to_dict(self) -> dict:
        out = {name: getattr(self, name) for name in self.__dataclass_fields__ if name != "config"}
        out["mlp_only_layers"] = list(self.mlp_only_layers)
        return out


def _find_config(name_or_path: str | Path) -> tuple[Path, str]:
    text = str(name_or_path)
    text = shipped_name_of_hub_id(text) or text
    shipped = MODEL_CONFIG_DIR / text / "config.json"
    if "/" not in text and shipped.is_file():
        return shipped, text
    path = Path(text).expanduser()
    if path.is_dir() and (path / "config.json").is_file():
        return path / "config.json", path.name
    if path.is_file():
        return path, str(path)
    raise ModelSpecError(
        f"model {text!r} not found: not a shipped name, a folder with config.json, or a config file."
        f" Shipped: {shipped_models()} (or their hub ids: {sorted(h for hs in SHIPPED_HUB_IDS.values() for h in hs)})"
    )


# RoPE scalings whose max_position_embeddings already states the longest sequence (vLLM's _get_and_verify_max_len)
_ROPE_SCALINGS_STATED = ("su", "longrope", "llama3", "default", "mrope")


def longest_sequence(arch: ModelArch) -> int:
    """The longest prompt + response a rollout engine accepts for ``arch`` (0: the config does not say), by vLLM's
    rule: ``max_position_embeddings``, or under a RoPE scaling that extends it (yarn, linear, dynamic)
    ``original_max_position_embeddings`` (else ``max_position_embeddings``) times its ``factor``."""
    scaling = arch.config.get("rope_scaling") or arch.config.get("rope_parameters") or {}
    kind = str(scaling.get("rope_type") or scaling.get("type") or "default") if isinstance(scaling, dict) else ""
    factor = scaling.get("factor") if isinstance(scaling, dict) else None
    if kind in _ROPE_SCALINGS_STATED or not isinstance(factor, (int, float)) or factor <= 1:
        return arch.max_position_embeddings
    return int((scaling.get("original_max_position_embeddings") or arch.max_position_embeddings) * factor)


_REQUIRED_SIZES = ("hidden_size", "num_hidden_layers", "num_attention_heads", "vocab_size")
_OPTIONAL_SIZES = ("num_key_value_heads", "head_dim", "qk_nope_head_dim", "qk_rope_head_dim")
_OPTIONAL_COUNTS = (
    "intermediate_size", "moe_intermediate_size", "num_experts", "n_routed_experts", "num_local_experts",
    "n_shared_experts", "num_experts_per_tok", "first_k_dense_replace", "kv_lora_rank", "q_lora_rank", "v_head_dim",
    "shared_expert_intermediate_size", "max_position_embeddings",
)


def _is_count(value: object, minimum: int) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= minimum


def _config_problem(config: dict) -> str | None:
    """The first field of a config.json dict that a ModelArch cannot take, as ``field: why``; None when usable."""
    if not isinstance(config.get("model_type"), str) or not config.get("model_type"):
        return f"model_type: must be a non-empty string, got {config.get('model_type')!r}"
    for key in _REQUIRED_SIZES:
        if not _is_count(config[key], 1):
            return f"{key}: must be a positive integer, got {config[key]!r}"
    for key, minimum in [(k, 1) for k in _OPTIONAL_SIZES] + [(k, 0) for k in _OPTIONAL_COUNTS]:
        value = config.get(key)
        if value is not None and not _is_count(value, minimum):
            kind = "a positive integer" if minimum else "a non-negative integer"
            return f"{key}: must be {kind} (or absent), got {value!r}"
    heads, kv = config["num_attention_heads"], config.get("num_key_value_heads") or config["num_attention_heads"]
    if not config.get("kv_lora_rank") and heads % kv:
        return f"num_key_value_heads: {kv} must divide num_attention_heads {heads} ({heads} % {kv} = {heads % kv})"
    if not config.get("kv_lora_rank") and not config.get("head_dim") and config["hidden_size"] % heads:
        return (f"head_dim: absent, and hidden_size {config['hidden_size']} is not a multiple of num_attention_heads"
                f" {heads}")
    if config.get("kv_lora_rank") and not (config.get("qk_nope_head_dim") and config.get("qk_rope_head_dim")):
        return "qk_nope_head_dim: MLA (kv_lora_rank > 0) needs qk_nope_head_dim and qk_rope_head_dim"
    return None


def arch_from_config(config: dict, name: str = "custom", source: str | None = None) -> ModelArch:
    """A ``ModelArch`` from a config.json dict (nested ``text_config`` is followed when the top has no sizes).

    A config a ModelArch cannot take raises ModelSpecError naming ``source`` (the file; default ``model 'name'``)
    and the field: ``/m/config.json: num_attention_heads: must be a positive integer, got '32'``.
    """
    where = source or f"model {name!r}"
    if not isinstance(config, dict):
        raise ModelSpecError(f"{where}: must be a JSON object, got {type(config).__name__}")
    if "hidden_size" not in config and isinstance(config.get("text_config"), dict):
        config = {**config["text_config"], "tie_word_embeddings": config.get("tie_word_embeddings", False)}
    missing = [key for key in ("model_type", *_REQUIRED_SIZES) if key not in config]
    if missing:
        raise ModelSpecError(f"{where}: {missing[0]}: missing (config.json lacks {missing})")
    problem = _config_problem(config)
    if problem:
        raise ModelSpecError(f"{where}: {problem}")
    model_type = config["model_type"]
    heads = config["num_attention_heads"]
    kv_lora_rank = config.get("kv_lora_rank") or 0
    if kv_lora_rank:
        head_dim = config["qk_nope_head_dim"] + config["qk_rope_head_dim"]
    else:
        head_dim = config.get("head_dim") or config["hidden_size"] // heads
    attention_bias = bool(config.get("attention_bias", False))
    num_experts = config.get("num_experts") or config.get("n_routed_experts") or config.get("num_local_experts") or 0
    moe_inter = config.get("moe_intermediate_size") or 0
    shared = config.get("n_shared_experts") or 0
    shared_inter = config.get("shared_expert_intermediate_size") or (shared * moe_inter)
    return ModelArch(
        name=name,
        model_type=model_type,
        hidden_size=config["hidden_size"],
        intermediate_size=config.get("intermediate_size") or 0,
        num_hidden_layers=config["num_hidden_layers"],
        num_attention_heads=heads,
        num_key_value_heads=config.get("num_key_value_heads") or heads,
        head_dim=head_dim,
        vocab_size=config["vocab_size"],
        tie_word_embeddings=bool(config.get("tie_word_embeddings", False)),
        max_position_embeddings=config.get("max_position_embeddings") or 0,
        torch_dtype=str(config.get("torch_dtype") or config.get("dtype") or "bfloat16"),
        qkv_bias=model_type == "qwen2" or attention_bias,
        o_bias=attention_bias and model_type != "qwen2",
        mlp_bias=bool(config.get("mlp_bias", False)),
        qk_norm=model_type in ("qwen3", "qwen3_moe"),
        num_experts=num_experts,
        num_experts_per_tok=config.get("num_experts_per_tok") or 0,
        moe_intermediate_size=moe_inter,
        num_shared_experts=shared,
        shared_expert_intermediate_size=shared_inter,
        first_k_dense=config.get("first_k_dense_replace") or 0,
        moe_layer_freq=config.get("moe_layer_freq") or config.get("decoder_sparse_step") or 1,
        mlp_only_layers=tuple(config.get("mlp_only_layers") or ()),
        q_lora_rank=config.get("q_lora_rank") or 0,
        kv_lora_rank=kv_lora_rank,
        qk_rope_head_dim=config.get("qk_rope_head_dim") or 0,
        qk_nope_head_dim=config.get("qk_nope_head_dim") or 0,
        v_head_dim=config.get("v_head_dim") or 0,
        config=dict(config),
        source=source or "",
    )


def load_arch(name_or_path: str | Path) -> ModelArch:
    """Read a model's architecture: a shipped name (``shipped_models()``), its hub id, a folder or a config.json.

    A file that is not JSON, or a field a ModelArch cannot take, raises ModelSpecError naming the file (and the field).
    """
    path, name = _find_config(name_or_path)
    try:
        config = json.loads(path.read_text())
    except OSError as error:
        raise ModelSpecError(f"{path}: cannot read: {error.strerror or error}") from error
    except json.JSONDecodeError as error:
        raise ModelSpecError(f"{path}: not valid JSON: {error}") from error
    return arch_from_config(config, name, source=str(path))


# ---------------------------------------------------------------------------------------------------------------------
# Tensor specs
# ---------------------------------------------------------------------------------------------------------------------

PARTITIONS = ("column", "row", "vocab", "replicated", "fused_qkv", "fused_gate_up", "expert")
"""How tensor parallelism splits a tensor:

- column: output features (dim 0) split; a bias of a column layer splits the same way.
- row: input features (dim 1) split; the row layer's bias is ``replicated``.
- vocab: embedding / lm_head rows (dim 0) split over the vocabulary.
- replicated: every TP rank holds all of it (norms, routers, MLA down-projections).
- fused_qkv: Megatron's ``linear_qkv``: q, k, v of each query group concatenated, split by query groups.
- fused_gate_up: Megatron's ``linear_fc1``: [gate; up] split so each rank holds its gate slice and its up slice.
- expert: MoE experts; experts (dim 0) split by ep, each expert split by tp like ``expert_tp`` says.
"""

_FAST_FAMILIES = ("llama", "mistral", "qwen2", "qwen3", "qwen3_moe", "deepseek_v3")


def units_range(n_units: int, parts: int, rank: int) -> tuple[int, int]:
    """Units [lo, hi) that ``rank`` of ``parts`` holds: the balanced split ``[floor(r*n/T), floor((r+1)*n/T))``.

    The balanced split composes: the union of ranks k*tau .. k*tau+k-1 of T is rank tau of T/k. So a generation TP
    slice is exactly the union of its micro-DP group's training slices, for any size. When there are fewer units
    than ranks (GQA kv heads with tp > kv heads) each rank holds one whole unit, ``floor(r*n/T)``, replicated.
    """
    if n_units < parts:
        unit = rank * n_units // parts
        return unit, unit + 1
    return rank * n_units // parts, (rank + 1) * n_units // parts


@dataclass(frozen=True, kw_only=True, slots=True)
class TensorSpec:
    """One tensor of the model: HF name and shape, and how TP (and EP) split it."""

    name: str
    """HF state-dict name (``model.layers.0.self_attn.q_proj.weight``)."""
    shape: tuple[int, ...]
    """Full (unsharded) shape."""
    partition: str
    """One of PARTITIONS."""
    tp_dim: int | None = None
    """Dimension TP splits (None: replicated)."""
    tp_parts: tuple[tuple[int, int], ...] = ()
    """Along tp_dim: (units, unit_size) blocks, each split by units (heads for attention, 1 row otherwise)."""
    ep_dim: int | None = None
    """Dimension EP splits (the experts dimension of HF's fused expert tensors), else None."""
    expert_tp: str = ""
    """For experts: how TP splits each expert, ``fused_gate_up`` or ``row``."""
    layer: int | None = None
    """Decoder layer, or None for embeddings, final norm and lm_head."""
    gqa_kv: bool = False
    """k/v projection of a GQA model: heads are replicated when tp > num_key_value_heads."""
    tied_to: str | None = None
    """The tensor this one shares storage with (lm_head tied to the embedding)."""
    megatron_name: str = ""
    """Name of the Megatron-core tensor this one becomes (fused tensors share it)."""

    @property
    def numel(self) -> int:
        out = 1
        for size in self.shape:
            out *= size
        return out

    def to_dict(self) -> dict:
        out = {"name": self.name, "shape": list(self.shape), "partition": self.partition, "tp_dim": self.tp_dim}
        for key in ("ep_dim", "layer", "tied_to"):
            if getattr(self, key) is not None:
                out[key] = getattr(self, key)
        if self.expert_tp:
            out["expert_tp"] = self.expert_tp
        if self.gqa_kv:
            out["gqa_kv"] = True
        out["megatron_name"] = self.megatron_name
        return out


@dataclass(frozen=True, kw_only=True, slots=True)
class ModelSpec:
    """Every tensor of a model (HF names), in state-dict order, with its TP/EP partition."""

    arch: ModelArch
    tensors: tuple[TensorSpec, ...]
    method: str
    """``analytic`` (computed from ModelArch) or ``meta`` (built with transformers on the meta device)."""

    @property
    def numel(self) -> int:
        """Parameters (and persistent buffers) counted once: a tied lm_head is not counted again."""
        return sum(t.numel for t in self.tensors if t.tied_to is None)

    def by_name(self) -> dict[str, TensorSpec]:
        return {t.name: t for t in self.tensors}

    def shapes(self) -> dict[str, tuple[int, ...]]:
        return {t.name: t.shape for t in self.tensors}


def build_spec(model: ModelArch | str | Path, method: str = "auto") -> ModelSpec:
    """The tensor spec of ``model`` (a ModelArch, or anything ``load_arch`` accepts).

    ``method``: ``analytic`` (fast, families llama/mistral/qwen2/qwen3/qwen3_moe/deepseek_v3), ``meta`` (builds the HF
    model on the meta device with transformers; any local HF model), or ``auto`` (analytic when the family is known).
    """
    arch = model if isinstance(model, ModelArch) else load_arch(model)
    if method == "auto":
        method = "analytic" if arch.model_type in _FAST_FAMILIES else "meta"
    if method == "analytic":
        if arch.model_type not in _FAST_FAMILIES:
            raise ModelSpecError(
                f"model {arch.name!r}: no analytic spec for model_type {arch.model_type!r};"
                f" analytic families: {list(_FAST_FAMILIES)}; use method='meta'"
            )
        names_shapes = _analytic_names_shapes(arch)
    elif method == "meta":
        names_shapes = _meta_names_shapes(arch)
    else:
        raise ModelSpecError(f"unknown spec method {method!r}; choose analytic, meta or auto")
    tensors = tuple(_tag(arch, name, shape) for name, shape in names_shapes)
    return ModelSpec(arch=arch, tensors=tensors, method=method)


def _meta_names_shapes(arch: ModelArch) -> list[tuple[str, tuple[int, ...]]]:
    """State-dict names and shapes of the HF model built on the meta device (no weights, no download)."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    config = dict(arch.config)
    config.pop("quantization_config", None)
    hf_config = AutoConfig.for_model(**config)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(hf_config)
    out = [(name, tuple(tensor.shape)) for name, tensor in model.state_dict(keep_vars=True).items()]
    if arch.tie_word_embeddings and not any(name == "lm_head.weight" for name, _ in out):
        out.append(("lm_head.weight", (arch.vocab_size, arch.hidden_size)))
    return out


def _analytic_names_shapes(arch: ModelArch) -> list[tuple[str, tuple[int, ...]]]:
    """The same list as ``_meta_names_shapes`` for the known families, from the numbers alone."""
    hidden, heads, kv, head_dim = arch.hidden_size, arch.num_attention_heads, arch.num_key_value_heads, arch.head_dim
    out: list[tuple[str, tuple[int, ...]]] = [("model.embed_tokens.weight", (arch.vocab_size, hidden))]
    for layer in range(arch.num_hidden_layers):
        prefix = f"model.layers.{layer}."
        attn = prefix + "self_attn."
        if arch.is_mla:
            q_dim = heads * (arch.qk_nope_head_dim + arch.qk_rope_head_dim)
            if arch.q_lora_rank:
                out += [
                    (attn + "q_a_proj.weight", (arch.q_lora_rank, hidden)),
                    (attn + "q_a_layernorm.weight", (arch.q_lora_rank,)),
                    (attn + "q_b_proj.weight", (q_dim, arch.q_lora_rank)),
                ]
            else:
                out.append((attn + "q_proj.weight", (q_dim, hidden)))
            out += [
                (attn + "kv_a_proj_with_mqa.weight", (arch.kv_lora_rank + arch.qk_rope_head_dim, hidden)),
                (attn + "kv_a_layernorm.weight", (arch.kv_lora_rank,)),
                (attn + "kv_b_proj.weight", (heads * (arch.qk_nope_head_dim + arch.v_head_dim), arch.kv_lora_rank)),
                (attn + "o_proj.weight", (hidden, heads * arch.v_head_dim)),
            ]
            if arch.o_bias:
                out.append((attn + "o_proj.bias", (hidden,)))
        else:
            for proj, rows in (("q_proj", heads * head_dim), ("k_proj", kv * head_dim), ("v_proj", kv * head_dim)):
                out.append((attn + proj + ".weight", (rows, hidden)))
                if arch.qkv_bias:
                    out.append((attn + proj + ".bias", (rows,)))
            out.append((attn + "o_proj.weight", (hidden, heads * head_dim)))
            if arch.o_bias:
                out.append((attn + "o_proj.bias", (hidden,)))
            if arch.qk_norm:
                out += [(attn + "q_norm.weight", (head_dim,)), (attn + "k_norm.weight", (head_dim,))]
        mlp = prefix + "mlp."
        if arch.is_moe_layer(layer):
            experts, inter = arch.num_experts, arch.moe_intermediate_size
            out += [
                (mlp + "experts.gate_up_proj", (experts, 2 * inter, hidden)),
                (mlp + "experts.down_proj", (experts, hidden, inter)),
                (mlp + "gate.weight", (experts, hidden)),
            ]
            if arch.model_type == "deepseek_v3":
                out.append((mlp + "gate.e_score_correction_bias", (experts,)))
            if arch.num_shared_experts:
                out += _dense_mlp(mlp + "shared_experts.", hidden, arch.shared_expert_intermediate_size, False)
        else:
            out += _dense_mlp(mlp, hidden, arch.intermediate_size, arch.mlp_bias)
        out += [(prefix + "input_layernorm.weight", (hidden,)), (prefix + "post_attention_layernorm.weight", (hidden,))]
    out += [("model.norm.weight", (hidden,)), ("lm_head.weight", (arch.vocab_size, hidden))]
    return out


def _dense_mlp(prefix: str, hidden: int, inter: int, bias: bool) -> list[tuple[str, tuple[int, ...]]]:
    out = []
    for proj, shape in (("gate_proj", (inter, hidden)), ("up_proj", (inter, hidden)), ("down_proj", (hidden, inter))):
        out.append((prefix + proj + ".weight", shape))
        if bias:
            out.append((prefix + proj + ".bias", shape[:1]))
    return out


def _layer_of(name: str) -> int | None:
    marker = ".layers."
    if marker not in name:
        return None
    return int(name.split(marker, 1)[1].split(".", 1)[0])


def _tag(arch: ModelArch, name: str, shape: tuple[int, ...]) -> TensorSpec:
    """Attach the TP/EP partition to one HF tensor, from its name (the rules vLLM and Megatron-core follow)."""
    layer = _layer_of(name)
    leaf = name.rsplit(".", 1)[-1]
    module = name.rsplit(".", 2)[-2] if name.count(".") >= 1 else ""
    is_bias = leaf == "bias"
    heads, kv = arch.num_attention_heads, arch.num_key_value_heads
    common = {"name": name, "shape": shape, "layer": layer, "megatron_name": _megatron_name(arch, name)}

    def split(partition: str, dim: int, parts: tuple[tuple[int, int], ...], **extra) -> TensorSpec:
        return TensorSpec(partition=partition, tp_dim=dim, tp_parts=parts, **common, **extra)

    def replicated() -> TensorSpec:
        return TensorSpec(partition="replicated", **common)

    if name in ("model.embed_tokens.weight", "lm_head.weight"):
        tied = "model.embed_tokens.weight" if name == "lm_head.weight" and arch.tie_word_embeddings else None
        return split("vocab", 0, ((shape[0], 1),), tied_to=tied)
    if len(shape) == 1 and ("norm" in module or "layernorm" in module):
        return replicated()
    if ".experts." in name and len(shape) == 3:
        inter = shape[2] if leaf == "down_proj" else shape[1] // 2
        if leaf == "gate_up_proj":
            return split("expert", 1, ((inter, 1), (inter, 1)), ep_dim=0, expert_tp="fused_gate_up")
        if leaf == "down_proj":
            return split("expert", 2, ((inter, 1),), ep_dim=0, expert_tp="row")
    if module in ("q_proj", "q_b_proj"):
        return split("column", 0, ((heads, shape[0] // heads),))
    if module in ("k_proj", "v_proj"):
        return split("column", 0, ((kv, shape[0] // kv),), gqa_kv=kv < heads)
    if module == "kv_b_proj":
        return split("column", 0, ((heads, shape[0] // heads),))
    if module == "o_proj":
        return replicated() if is_bias else split("row", 1, ((heads, shape[1] // heads),))
    if module in ("gate_proj", "up_proj"):
        return split("column", 0, ((shape[0], 1),))
    if module == "down_proj":
        return replicated() if is_bias else split("row", 1, ((shape[1], 1),))
    # routers (mlp.gate, shared_expert_gate), their biases, MLA down-projections, anything unknown
    return replicated()


def _megatron_name(arch: ModelArch, name: str) -> str:
    """Megatron-core (TransformerEngine layer specs) name of the tensor an HF tensor becomes."""
    if name == "model.embed_tokens.weight":
        return "embedding.word_embeddings.weight"
    if name == "lm_head.weight":
        return "output_layer.weight"
    if name == "model.norm.weight":
        return "decoder.final_layernorm.weight"
    layer = _layer_of(name)
    if layer is None:
        return name
    rest = name.split(f".layers.{layer}.", 1)[1]
    prefix = f"decoder.layers.{layer}."
    moe = arch.is_moe_layer(layer)
    table = {
        "input_layernorm.weight": "self_attention.linear_qkv.layer_norm_weight"
        if not arch.is_mla
        else "input_layernorm.weight",
        "post_attention_layernorm.weight": "pre_mlp_layernorm.weight" if moe else "mlp.linear_fc1.layer_norm_weight",
        "self_attn.q_proj.weight": "self_attention.linear_qkv.weight",
        "self_attn.k_proj.weight": "self_attention.linear_qkv.weight",
        "self_attn.v_proj.weight": "self_attention.linear_qkv.weight",
        "self_attn.q_proj.bias": "self_attention.linear_qkv.bias",
        "self_attn.k_proj.bias": "self_attention.linear_qkv.bias",
        "self_attn.v_proj.bias": "self_attention.linear_qkv.bias",
        "self_attn.o_proj.weight": "self_attention.linear_proj.weight",
        "self_attn.o_proj.bias": "self_attention.linear_proj.bias",
        "self_attn.q_norm.weight": "self_attention.q_layernorm.weight",
        "self_attn.k_norm.weight": "self_attention.k_layernorm.weight",
        "self_attn.q_a_proj.weight": "self_attention.linear_q_down_proj.weight",
        "self_attn.q_a_layernorm.weight": "self_attention.linear_q_up_proj.layer_norm_weight",
        "self_attn.q_b_proj.weight": "self_attention.linear_q_up_proj.weight",
        "self_attn.kv_a_proj_with_mqa.weight": "self_attention.linear_kv_down_proj.weight",
        "self_attn.kv_a_layernorm.weight": "self_attention.linear_kv_up_proj.layer_norm_weight",
        "self_attn.kv_b_proj.weight": "self_attention.linear_kv_up_proj.weight",
        "mlp.gate_proj.weight": "mlp.linear_fc1.weight",
        "mlp.up_proj.weight": "mlp.linear_fc1.weight",
        "mlp.down_proj.weight": "mlp.linear_fc2.weight",
        "mlp.gate.weight": "mlp.router.weight",
        "mlp.gate.e_score_correction_bias": "mlp.router.expert_bias",
        "mlp.experts.gate_up_proj": "mlp.experts.linear_fc1.weight*",
        "mlp.experts.down_proj": "mlp.experts.linear_fc2.weight*",
        "mlp.shared_experts.gate_proj.weight": "mlp.shared_experts.linear_fc1.weight",
        "mlp.shared_experts.up_proj.weight": "mlp.shared_experts.linear_fc1.weight",
        "mlp.shared_experts.down_proj.weight": "mlp.shared_experts.linear_fc2.weight",
    }
    return prefix + table.get(rest, rest)
