"""Model specs: the architecture numbers of an HF model (``ModelArch``) and, from them, every tensor with its shape
and tensor-parallel partition (``ModelSpec``), without loading a weight.

``load_arch`` reads an HF ``config.json`` (a folder, a file, a shipped name such as ``qwen2_7b``, or the hub id of a
shipped model such as ``Qwen/Qwen2-7B``). The shipped configs in ``hybrid_engine/model_configs/`` copy the public HF
configs' architecture numbers (DeepSeek-V3 without its FP8 ``quantization_config``: we plan in bf16).

Nothing at import time needs torch or transformers; ``build_spec(..., method="meta")`` imports them on demand.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

__all__ = [
    "HUB_IDS",
    "MODEL_CONFIG_DIR",
    "ModelArch",
    "ModelSpecError",
    "hub_id",
    "load_arch",
    "shipped_models",
]

MODEL_CONFIG_DIR = Path(__file__).resolve().parent / "model_configs"

HUB_IDS: dict[str, str] = {
    "qwen2_7b": "Qwen/Qwen2-7B",
    "qwen2_5_0_5b": "Qwen/Qwen2.5-0.5B",
    "qwen2_5_7b": "Qwen/Qwen2.5-7B",
    "qwen2_5_32b": "Qwen/Qwen2.5-32B",
    "llama3_1_8b": "meta-llama/Llama-3.1-8B",
    "llama3_1_70b": "meta-llama/Llama-3.1-70B",
    "qwen3_30b_a3b": "Qwen/Qwen3-30B-A3B",
    "deepseek_v3": "deepseek-ai/DeepSeek-V3",
    "tiny": "",
}
"""Shipped name -> Hugging Face hub id ("" for ``tiny``: built locally with random weights)."""


class ModelSpecError(ValueError):
    """A model that cannot be found or described."""


def shipped_models() -> list[str]:
    """Names of the configs shipped in ``hybrid_engine/model_configs/``, sorted."""
    return sorted(p.parent.name for p in MODEL_CONFIG_DIR.glob("*/config.json"))


def hub_id(name: str) -> str:
    """The HF hub id of a shipped model (``qwen2_7b`` -> ``Qwen/Qwen2-7B``)."""
    if name not in HUB_IDS:
        raise ModelSpecError(f"unknown shipped model {name!r}; available: {shipped_models()}")
    return HUB_IDS[name]


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

    @property
    def is_moe(self) -> bool:
        return self.num_experts > 0

    @property
    def is_mla(self) -> bool:
        return self.kv_lora_rank > 0

    @property
    def value_head_dim(self) -> int:
        return self.v_head_dim or self.head_dim

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
    by_hub = {hub: name for name, hub in HUB_IDS.items() if hub}
    if text in by_hub:
        text = by_hub[text]
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
        f" Shipped: {shipped_models()} (or their hub ids: {sorted(by_hub)})"
    )


def arch_from_config(config: dict, name: str = "custom") -> ModelArch:
    """A ``ModelArch`` from a config.json dict (nested ``text_config`` is followed when the top has no sizes)."""
    if "hidden_size" not in config and isinstance(config.get("text_config"), dict):
        config = {**config["text_config"], "tie_word_embeddings": config.get("tie_word_embeddings", False)}
    missing = [
        key
        for key in ("model_type", "hidden_size", "num_hidden_layers", "num_attention_heads", "vocab_size")
        if key not in config
    ]
    if missing:
        raise ModelSpecError(f"model {name!r}: config.json lacks {missing}")
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
    )


def load_arch(name_or_path: str | Path) -> ModelArch:
    """Read a model's architecture: a shipped name (``shipped_models()``), its hub id, a folder or a config.json."""
    path, name = _find_config(name_or_path)
    try:
        config = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as error:
        raise ModelSpecError(f"model {name!r}: cannot read {path}: {error}") from error
    return arch_from_config(config, name)
