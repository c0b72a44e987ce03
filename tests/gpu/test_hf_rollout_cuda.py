"""The hf rollout's server on a GPU machine: it moves to the feeding worker's GPU and generates there, exactly.

On the CPU the placement path is covered in tests/recipes/verl_ext/test_plugin.py (a GPU the process cannot see:
the server stays on the host); these tests need CUDA and skip without it (tests/conftest.py).
"""

from __future__ import annotations

import asyncio
import os

import pytest
import torch


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    import verl
    from hydra import compose, initialize_config_dir

    from recipes.verl_ext.demo import ensure_tiny_assets
    from recipes.verl_ext.demo.run import demo_overrides
    from recipes.verl_ext.plugin.hf_server import HFServer

    assets = ensure_tiny_assets(tmp_path_factory.mktemp("assets"))
    config_dir = os.path.join(os.path.dirname(verl.__file__), "trainer", "config")
    with initialize_config_dir(config_dir=config_dir, version_base=None):
        cfg = compose("ppo_trainer", overrides=demo_overrides(assets, algo="grpo", world_size=1, steps=1))
    return HFServer(cfg.actor_rollout_ref.rollout, cfg.actor_rollout_ref.model, replica_rank=0)


@pytest.mark.gpu
def test_server_moves_to_the_feeding_gpu_and_generates_there(server):
    from recipes.verl_ext.plugin.hf_rollout import worker_device_uuid

    torch.cuda.set_device(0)
    asyncio.run(server.set_global_steps(1, worker_device_uuid()))
    assert asyncio.run(server.get_state())["device"] == "cuda:0"
    assert {p.device.type for p in server.model.parameters()} == {"cuda"}
    prompt = [2, 352, 201, 21, 13, 22, 31, 1, 201, 2, 361, 201]
    out = asyncio.run(server.generate(prompt, {"temperature": 1.0, "logprobs": True, "max_tokens": 8}, "r0"))
    assert 1 <= len(out.token_ids) <= 8 and len(out.log_probs) == len(out.token_ids)
    with torch.no_grad():
        ids = torch.tensor([prompt + out.token_ids], device="cuda")
        logits = server.model(input_ids=ids).logits[0, len(prompt) - 1 : -1]
    expected = torch.log_softmax(logits.float(), -1).gather(-1, ids[0, len(prompt):, None]).squeeze(-1)
    torch.testing.assert_close(torch.tensor(out.log_probs), expected.cpu(), atol=1e-4, rtol=0)


@pytest.mark.gpu
def test_weights_handed_over_from_the_host_read_back_bit_exact_on_the_gpu(server):
    from hybrid_engine.reshard.checksum import checksums
    from recipes.verl_ext.plugin.hf_rollout import worker_device_uuid

    asyncio.run(server.set_global_steps(1, worker_device_uuid()))
    state = {name: tensor.detach().cpu() + 0.01 for name, tensor in server.model.state_dict().items()}
    loaded = asyncio.run(server.update_weights(state, global_steps=2, device_uuid=worker_device_uuid()))
    names, sums = checksums(state)
    assert loaded == {name: tuple(row) for name, row in zip(names, sums.tolist(), strict=True)}
    assert asyncio.run(server.get_state())["global_steps"] == 2
