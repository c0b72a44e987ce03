"""Model architectures read from the shipped configs, and tensor specs checked against real HF models."""

import json

import pytest

from hybrid_engine.model_spec import (
    MODEL_CONFIG_DIR,
    SHIPPED_HUB_IDS,
    ModelSpecError,
    arch_from_config,
    build_spec,
    load_arch,
    longest_sequence,
    looks_like_hub_id,
    shipped_models,
    shipped_name_of_hub_id,
)
from hybrid_engine.reshard.shards import box_numel, megatron_layout, tp_box, unique_tensors

SHIPPED = [
    "deepseek_v3",
    "llama3_1_70b",
    "llama3_1_8b",
    "qwen2_5_0_5b",
    "qwen2_5_1_5b",
    "qwen2_5_32b",
    "qwen2_5_7b",
    "qwen2_7b",
    "qwen3_30b_a3b",
    "tiny",
]


def test_shipped_models_listed():
    assert shipped_models() == SHIPPED


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


# ---------------------------------------------------------------------------------------------------------------------
# tensor specs
# ---------------------------------------------------------------------------------------------------------------------

PARAMS = {
    "qwen2_7b": 7_615_616_512,
    "qwen2_5_7b": 7_615_616_512,
    "qwen2_5_0_5b": 494_032_768,
    # Qwen2.5-1.5B's model card: 1.54B parameters (tied embeddings)
    "qwen2_5_1_5b": 1_543_714_304,
    "llama3_1_8b": 8_030_261_248,
    "llama3_1_70b": 70_553_706_496,
    "qwen2_5_32b": 32_763_876_352,
    "qwen3_30b_a3b": 30_532_122_624,
}


@pytest.mark.parametrize("name", sorted(PARAMS))
def test_parameter_counts(name):
    assert build_spec(name).numel == PARAMS[name]


def test_deepseek_v3_parameter_count():
    # 671B without the multi-token-prediction layer (HF does not build it), plus 58 router bias buffers
    spec = build_spec("deepseek_v3")
    assert spec.numel == 671_026_419_200
    assert len([t for t in spec.tensors if t.partition == "expert"]) == 2 * 58


@pytest.mark.parametrize("name", SHIPPED)
def test_analytic_and_meta_paths_agree(name):
    analytic, meta = build_spec(name, "analytic"), build_spec(name, "meta")
    assert list(analytic.shapes().items()) == list(meta.shapes().items())
    assert analytic.tensors == meta.tensors


def test_tiny_spec_matches_a_real_hf_model_tensor_by_tensor():
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    arch = load_arch("tiny")
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(AutoConfig.for_model(**arch.config))
    real = {name: tuple(tensor.shape) for name, tensor in model.state_dict().items()}
    spec = build_spec("tiny", "analytic").shapes()
    assert spec == real
    assert len(real) == 27 and real["model.layers.1.self_attn.k_proj.bias"] == (32,)
    assert sum(p.numel() for p in model.parameters()) == build_spec("tiny").numel == 107_072


def test_partition_tags():
    spec = build_spec("qwen2_7b").by_name()
    layer = "model.layers.3."
    assert spec["model.embed_tokens.weight"].partition == "vocab"
    assert spec["lm_head.weight"].partition == "vocab" and spec["lm_head.weight"].tied_to is None
    assert (spec[layer + "self_attn.q_proj.weight"].partition, spec[layer + "self_attn.q_proj.weight"].tp_dim) == (
        "column",
        0,
    )
    assert spec[layer + "self_attn.q_proj.bias"].partition == "column"
    assert (spec[layer + "self_attn.o_proj.weight"].partition, spec[layer + "self_attn.o_proj.weight"].tp_dim) == (
        "row",
        1,
    )
    assert spec[layer + "mlp.down_proj.weight"].partition == "row"
    assert spec[layer + "input_layernorm.weight"].partition == "replicated"
    k_proj = spec[layer + "self_attn.k_proj.weight"]
    assert k_proj.gqa_kv and k_proj.tp_parts == ((4, 128),)
    # tp 8 over 4 kv heads: every rank holds one whole head (128 rows), each head on two ranks
    k_rows = [tp_box(k_proj, 8, r)[0] for r in range(8)]
    assert k_rows == [(h * 128, h * 128 + 128) for h in (0, 0, 1, 1, 2, 2, 3, 3)]
    assert {tp_box(k_proj, 4, r)[0] for r in range(4)} == {(h * 128, h * 128 + 128) for h in range(4)}
    # 28 query heads over tp 8: 3 or 4 heads per rank, all 28 held once
    q_proj = spec[layer + "self_attn.q_proj.weight"]
    sizes = [box_numel(tp_box(q_proj, 8, r)) // (128 * 3584) for r in range(8)]
    assert sizes == [3, 4, 3, 4, 3, 4, 3, 4] and sum(sizes) == 28


def test_tied_lm_head():
    spec = build_spec("tiny").by_name()
    assert spec["lm_head.weight"].tied_to == "model.embed_tokens.weight"
    assert build_spec("tiny").numel == sum(t.numel for t in build_spec("tiny").tensors) - 512 * 64


def test_moe_and_mla_tags():
    spec = build_spec("deepseek_v3").by_name()
    layer = "model.layers.3."
    gate_up = spec[layer + "mlp.experts.gate_up_proj"]
    assert (gate_up.shape, gate_up.partition, gate_up.ep_dim, gate_up.tp_dim) == ((256, 4096, 7168), "expert", 0, 1)
    assert gate_up.expert_tp == "fused_gate_up" and gate_up.tp_parts == ((2048, 1), (2048, 1))
    down = spec[layer + "mlp.experts.down_proj"]
    assert (down.shape, down.tp_dim, down.expert_tp) == ((256, 7168, 2048), 2, "row")
    assert spec[layer + "mlp.gate.weight"].partition == "replicated"
    assert spec[layer + "mlp.gate.e_score_correction_bias"].shape == (256,)
    assert spec[layer + "self_attn.q_a_proj.weight"].partition == "replicated"
    assert spec[layer + "self_attn.q_b_proj.weight"].tp_parts == ((128, 192),)
    assert spec[layer + "self_attn.kv_b_proj.weight"].tp_parts == ((128, 256),)
    assert spec[layer + "mlp.shared_experts.gate_proj.weight"].shape == (2048, 7168)
    assert spec["model.layers.2.mlp.gate_proj.weight"].shape == (18432, 7168)  # first_k_dense_replace = 3


def test_megatron_layout_fuses_qkv_and_gate_up():
    """The resharder's Megatron storage (``megatron_layout``): q/k/v fused into ``linear_qkv``, gate and up into
    ``linear_fc1``, and a TP rank holds the same elements as its HF tensor-parallel slices."""
    spec = build_spec("qwen2_5_7b")
    layer0 = "model.layers.0."
    storage = megatron_layout(spec, 0, 1, 1, 0)
    qkv = storage["decoder.layers.0.self_attention.linear_qkv.weight"]
    assert {name for name, _ in qkv} == {layer0 + f"self_attn.{m}_proj.weight" for m in "qkv"}
    assert sum(box_numel(box) for _, box in qkv) == (3584 + 2 * 512) * 3584
    fc1 = storage["decoder.layers.0.mlp.linear_fc1.weight"]
    assert [name for name, _ in fc1] == [layer0 + "mlp.gate_proj.weight", layer0 + "mlp.up_proj.weight"]
    assert sum(box_numel(box) for _, box in fc1) == 2 * 18944 * 3584
    assert sum(box_numel(box) for _, box in storage["decoder.layers.0.self_attention.linear_qkv.bias"]) == 4608
    for tp in (1, 2, 4):
        for rank in range(tp):
            held = sum(box_numel(box) for parts in megatron_layout(spec, 0, 1, tp, rank).values() for _, box in parts)
            assert held == sum(box_numel(tp_box(t, tp, rank)) for t in unique_tensors(spec))


def test_unknown_family_needs_meta(tmp_path):
    arch = arch_from_config(
        {"model_type": "gpt2", "hidden_size": 8, "num_hidden_layers": 1, "num_attention_heads": 2, "vocab_size": 10}
    )
    with pytest.raises(ModelSpecError, match="no analytic spec for model_type 'gpt2'"):
        build_spec(arch, "analytic")


SMALL_CONFIGS = {
    "mistral": {"model_type": "mistral", "head_dim": 16},
    "qwen3": {"model_type": "qwen3", "head_dim": 24},
    "llama_bias": {"model_type": "llama", "attention_bias": True, "mlp_bias": True},
    "qwen3_moe": {
        "model_type": "qwen3_moe",
        "num_experts": 4,
        "num_experts_per_tok": 2,
        "moe_intermediate_size": 16,
        "decoder_sparse_step": 2,
        "mlp_only_layers": [0],
    },
}


@pytest.mark.parametrize("name", sorted(SMALL_CONFIGS))
def test_analytic_matches_meta_on_small_configs(name):
    config = {
        "hidden_size": 64,
        "intermediate_size": 96,
        "num_hidden_layers": 4,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "vocab_size": 100,
        **SMALL_CONFIGS[name],
    }
    arch = arch_from_config(config, name)
    analytic, meta = build_spec(arch, "analytic"), build_spec(arch, "meta")
    assert list(analytic.shapes().items()) == list(meta.shapes().items())
    assert analytic.tensors == meta.tensors


def test_unknown_family_falls_back_to_meta(tmp_path):
    config = {
        "model_type": "qwen2_moe",
        "hidden_size": 64,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "num_hidden_layers": 1,
        "num_experts": 4,
        "num_experts_per_tok": 2,
        "moe_intermediate_size": 32,
        "shared_expert_intermediate_size": 96,
        "vocab_size": 100,
        "intermediate_size": 128,
    }
    (tmp_path / "config.json").write_text(json.dumps(config))
    spec = build_spec(tmp_path)
    assert spec.method == "meta"
    tags = {t.name: t.partition for t in spec.tensors}
    assert tags["model.layers.0.mlp.experts.gate_up_proj"] == "expert"
    assert tags["model.layers.0.mlp.shared_expert.gate_proj.weight"] == "column"
    assert tags["model.layers.0.mlp.shared_expert.down_proj.weight"] == "row"
    assert tags["model.layers.0.mlp.shared_expert_gate.weight"] == "replicated"


# -- hub ids the pack ships, and malformed configs -------------------------------------------------------------------


@pytest.mark.parametrize(
    "hub,name",
    [
        ("Qwen/Qwen2-7B-Instruct", "qwen2_7b"),
        ("Qwen/Qwen2-7B", "qwen2_7b"),
        ("Qwen/Qwen2.5-0.5B-Instruct", "qwen2_5_0_5b"),
        ("Qwen/Qwen2.5-7B-Instruct", "qwen2_5_7b"),
        ("Qwen/Qwen2.5-32B-Instruct", "qwen2_5_32b"),
        ("meta-llama/Llama-3.1-8B-Instruct", "llama3_1_8b"),
        ("meta-llama/Llama-3.1-70B-Instruct", "llama3_1_70b"),
        ("Qwen/Qwen3-30B-A3B", "qwen3_30b_a3b"),
        ("deepseek-ai/DeepSeek-V3", "deepseek_v3"),
        ("qwen/qwen2-7b-instruct", "qwen2_7b"),  # the hub resolves ids without regard to case
    ],
)
def test_hub_ids_map_to_shipped_configs(hub, name):
    assert shipped_name_of_hub_id(hub) == name
    assert load_arch(hub) == load_arch(name) and load_arch(hub).name == name


def test_every_shipped_model_but_tiny_has_hub_ids():
    assert set(SHIPPED_HUB_IDS) == set(shipped_models()) - {"tiny"}


def test_unknown_hub_ids_and_paths():
    assert shipped_name_of_hub_id("acme/unknown-7b") is None
    assert looks_like_hub_id("acme/unknown-7b") and looks_like_hub_id("Qwen/Qwen2.5-7B-Instruct")
    for path in ("/models/qwen", "./qwen/x", "~/models/a", "a/b/c", "qwen2_7b", ""):
        assert not looks_like_hub_id(path), path


@pytest.mark.parametrize(
    "change,message",
    [
        ({"num_attention_heads": "32"}, "num_attention_heads: must be a positive integer, got '32'"),
        ({"num_hidden_layers": 0}, "num_hidden_layers: must be a positive integer, got 0"),
        ({"num_key_value_heads": 3}, "num_key_value_heads: 3 must divide num_attention_heads 4 (4 % 3 = 1)"),
        ({"hidden_size": None}, "hidden_size: must be a positive integer, got None"),
        ({"intermediate_size": -1}, "intermediate_size: must be a non-negative integer (or absent), got -1"),
        ({"model_type": 7}, "model_type: must be a non-empty string, got 7"),
        ({"vocab_size": True}, "vocab_size: must be a positive integer, got True"),
    ],
)
def test_malformed_config_names_the_file_and_the_field(tmp_path, change, message):
    config = json.loads((MODEL_CONFIG_DIR / "tiny" / "config.json").read_text())
    config.update(change)
    (tmp_path / "config.json").write_text(json.dumps(config))
    with pytest.raises(ModelSpecError) as info:
        load_arch(tmp_path)
    assert str(info.value) == f"{tmp_path / 'config.json'}: {message}"


def test_missing_field_and_bad_json_name_the_file(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "llama", "hidden_size": 8}))
    with pytest.raises(ModelSpecError, match=r"config\.json: num_hidden_layers: missing \(config.json lacks"):
        load_arch(tmp_path)
    (tmp_path / "config.json").write_text('{"model_type": "llama",')
    with pytest.raises(ModelSpecError, match=r"config\.json: not valid JSON: .*line 1 column"):
        load_arch(tmp_path)
    (tmp_path / "config.json").write_text("[1, 2]")
    with pytest.raises(ModelSpecError, match=r"config\.json: must be a JSON object, got list"):
        load_arch(tmp_path)


def test_load_arch_says_where_it_read():
    assert load_arch("qwen2_7b").source == str(MODEL_CONFIG_DIR / "qwen2_7b" / "config.json")


@pytest.mark.parametrize("rope,positions,expected", [
    (None, 32768, 32768),  # Qwen2.5: no scaling
    ({"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32768}, 32768, 131072),  # Qwen's YaRN
    ({"type": "linear", "factor": 2.0}, 4096, 8192),  # no original positions: max_position_embeddings x factor
    ({"rope_type": "llama3", "factor": 8.0, "original_max_position_embeddings": 8192}, 131072, 131072),  # stated
    ({"rope_type": "default", "rope_theta": 1e6}, 2048, 2048),  # transformers 5's rope_parameters without scaling
])
def test_longest_sequence_follows_vllms_rule(rope, positions, expected):
    config = dict(load_arch("qwen2_5_0_5b").config, max_position_embeddings=positions, rope_scaling=rope)
    assert longest_sequence(arch_from_config(config, "x")) == expected
    assert longest_sequence(load_arch("deepseek_v3")) == 4096 * 40  # YaRN, stated both ways in its config
