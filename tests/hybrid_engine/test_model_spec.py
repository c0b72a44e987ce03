"""Model architectures read from the shipped configs, and tensor specs checked against real HF models."""

import json

import pytest

from hybrid_engine.model_spec import ModelSpecError, hub_id, load_arch, shipped_models

SHIPPED = [
    "deepseek_v3",
    "llama3_1_70b",
    "llama3_1_8b",
    "qwen2_5_0_5b",
    "qwen2_5_32b",
    "qwen2_5_7b",
    "qwen2_7b",
    "qwen3_30b_a3b",
    "tiny",
]


def test_shipped_models_listed():
    assert shipped_models() == SHIPPED
    assert hub_id("qwen2_7b") == "Qwen/Qwen2-7B"
    assert hub_id("deepseek_v3") == "deepseek-ai/DeepSeek-V3"


def test_unknown_model_lists_the_choices():
    with pytest.raises(ModelSpecError, match=r"not found.*Shipped: \['deepseek_v3', .*'tiny'\]"):
        load_arch("no_such_model")


def test_qwen2_7b_numbers():
    arch = load_arch("qwen2_7b")
    assert (arch.hidden_size, arch.intermediate_size, arch.num_hidden_layers) == (3584, 18944, 28)
    assert (arch.num_attention_heads, arch.num_key_value_heads, arch.head_dim, arch.vocab_size) == (28, 4, 128, 152064)
    assert arch.qkv_bias and not arch.o_bias and not arch.tie_word_embeddings and not arch.is_moe


def test_hub_id_resolves_to_shipped():
    assert load_arch("Qwen/Qwen2-7B") == load_arch("qwen2_7b")


def test_tiny_matches_the_brief():
    arch = load_arch("tiny")
    assert (arch.hidden_size, arch.intermediate_size, arch.num_hidden_layers) == (64, 128, 2)
    assert (arch.num_attention_heads, arch.num_key_value_heads, arch.vocab_size) == (4, 2, 512)
    assert arch.tie_word_embeddings and arch.model_type == "qwen2"


def test_deepseek_v3_numbers():
    arch = load_arch("deepseek_v3")
    assert (arch.hidden_size, arch.intermediate_size, arch.num_hidden_layers, arch.vocab_size) == (
        7168,
        18432,
        61,
        129280,
    )
    assert (arch.num_experts, arch.num_shared_experts, arch.moe_intermediate_size, arch.first_k_dense) == (
        256,
        1,
        2048,
        3,
    )
    assert (arch.q_lora_rank, arch.kv_lora_rank, arch.qk_rope_head_dim, arch.qk_nope_head_dim, arch.v_head_dim) == (
        1536,
        512,
        64,
        128,
        128,
    )
    assert arch.is_mla and arch.head_dim == 192 and arch.moe_layers == list(range(3, 61))


def test_qwen3_moe_numbers():
    arch = load_arch("qwen3_30b_a3b")
    assert (arch.hidden_size, arch.num_hidden_layers, arch.num_key_value_heads, arch.head_dim) == (2048, 48, 4, 128)
    assert (arch.num_experts, arch.num_experts_per_tok, arch.moe_intermediate_size) == (128, 8, 768)
    assert arch.qk_norm and len(arch.moe_layers) == 48


def test_llama_numbers():
    assert load_arch("llama3_1_8b").intermediate_size == 14336
    big = load_arch("llama3_1_70b")
    assert (big.hidden_size, big.num_hidden_layers, big.num_attention_heads, big.num_key_value_heads) == (
        8192,
        80,
        64,
        8,
    )


def test_folder_and_file(tmp_path):
    config = {
        "model_type": "llama",
        "hidden_size": 32,
        "num_hidden_layers": 1,
        "num_attention_heads": 4,
        "vocab_size": 10,
        "intermediate_size": 64,
    }
    (tmp_path / "config.json").write_text(json.dumps(config))
    arch = load_arch(tmp_path)
    assert arch.head_dim == 8 and arch.num_key_value_heads == 4 and arch.name == tmp_path.name
    assert load_arch(tmp_path / "config.json").hidden_size == 32
