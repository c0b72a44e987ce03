"""The command line split once (recipes/compose/overrides.py CommandLine): keys, values, deletions and Hydra's flags,
and the rules of recipes/compose/ reading that object as they read the raw strings."""

from __future__ import annotations

from recipes.compose.compose import adopt_batching, adopt_engine_switch, adopt_verl_primary
from recipes.compose.defaults import chooses_layout, embedded_defaults, gpu_only_rollout, gpu_only_strategy
from recipes.compose.overrides import CommandLine, Override, chosen_keys, override_key, with_overrides

ARGV = ["-m", "strategy=fsdp", "~trainer.nnodes=2", "--cfg", "job", "++a.b=1", "kl=adaptive", "strategy=FSDP2 "]


def test_the_command_line_is_split_once_into_overrides_and_flags():
    command = CommandLine.parse(ARGV)
    assert command.args == tuple(ARGV)
    assert command.overrides[0] == Override("strategy=fsdp", "strategy", "fsdp")
    assert [o.key for o in command.overrides] == [override_key(a) for a in ARGV if override_key(a) is not None]
    assert command.keys() == chosen_keys(ARGV) == {"strategy", "trainer.nnodes", "a.b", "kl"}
    assert [o.deletes for o in command.overrides] == [False, True, False, False, False]
    assert command.last("strategy") == "fsdp2" and command.last("model") is None
    assert command.has_hydra_flags and not CommandLine.parse(["kl=adaptive"]).has_hydra_flags
    assert CommandLine.parse(command) is command
    assert "kl=adaptive" in command and len(command) == len(ARGV)
    assert command.without(["kl=adaptive"]).keys() == {"strategy", "trainer.nnodes", "a.b"}
    assert command.plus(["model=tiny"]).last("model") == "tiny"


def test_the_rules_read_the_object_as_they_read_the_strings():
    for argv in (["model_engine=megatron", "x=1"], ["--config-name", "ppo_megatron_trainer", "x=1"],
                 ["actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=4"], ["trainer.nnodes=2", "--cfg", "job"],
                 ["~trainer.nnodes=2"], ["rollout=vllm", "strategy=megatron"]):
        command = CommandLine.parse(argv)
        for rule in (adopt_batching, adopt_verl_primary):
            assert rule(argv)[0].args == rule(command)[0].args
        assert adopt_engine_switch(argv, "grpo")[0].args == adopt_engine_switch(command, "grpo")[0].args
        assert chooses_layout(argv) == chooses_layout(command)
        assert embedded_defaults(argv, accelerator=False) == embedded_defaults(command, accelerator=False)
        assert gpu_only_strategy(argv, None) == gpu_only_strategy(command, None)
        assert gpu_only_rollout(argv) == gpu_only_rollout(command)
        assert with_overrides(argv, ["m=1"]) == with_overrides(command, ["m=1"])
