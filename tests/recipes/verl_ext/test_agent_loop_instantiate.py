"""verl builds one agent loop per sample through Hydra's ``instantiate``; in verl's agent-loop module a registry entry
that names only its class is built by calling the class (recipes/verl_ext/plugin/patches.py,
``_direct_agent_loop_instantiate``). The class gets what Hydra would give it, object for object."""

from __future__ import annotations

import hydra
from omegaconf import OmegaConf


class Dataset:
    """Stands for verl's dataset class (RLHFDataset)."""


class Recorder:
    def __init__(self, **kwargs) -> None:
        self.kwargs = kwargs


def _arguments() -> dict:
    from verl.experimental.agent_loop.agent_loop import DictConfigWrap, ToolListWrap

    return {"trainer_config": DictConfigWrap(OmegaConf.create({"data": {"max_prompt_length": 32}})),
            "server_manager": object(), "tokenizer": object(), "processor": None, "hf_model_type": "qwen2",
            "dataset_cls": Dataset, "data_config": DictConfigWrap(OmegaConf.create({})), "tools": ToolListWrap([])}


def test_verls_registry_entries_name_only_their_class():
    from verl.experimental.agent_loop import agent_loop

    assert agent_loop._agent_loop_registry  # single_turn_agent, tool_agent, ... registered at import
    assert all(entry.keys() == {"_target_"} for entry in agent_loop._agent_loop_registry.values())


def test_a_class_only_entry_gets_the_arguments_hydra_would_give():
    from verl.experimental.agent_loop import agent_loop

    config, arguments = {"_target_": f"{__name__}.Recorder"}, _arguments()
    direct = agent_loop.hydra.utils.instantiate(config=config, **arguments)
    through_hydra = hydra.utils.instantiate(config=config, **arguments)
    assert type(direct) is type(through_hydra) is Recorder
    assert direct.kwargs.keys() == through_hydra.kwargs.keys() == arguments.keys()
    for name, value in arguments.items():
        assert direct.kwargs[name] is value and through_hydra.kwargs[name] is value, name


def test_any_other_config_goes_to_hydra():
    from verl.experimental.agent_loop import agent_loop

    config = OmegaConf.create({"_target_": f"{__name__}.Recorder", "extra": 3})  # an agent_loop_config_path entry
    built = agent_loop.hydra.utils.instantiate(config=config, **_arguments())
    assert built.kwargs["extra"] == 3 and agent_loop.hydra.utils.get_class is hydra.utils.get_class
