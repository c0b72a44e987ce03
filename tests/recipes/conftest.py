from __future__ import annotations

import json
import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest

from recipes.compose.compose import compose_recipe
from recipes.compose.resolvers import register_resolvers

register_resolvers()

# Options that need a context to be valid (the rest compose with the recipe's defaults).
CONTEXT = {
    ("parallel", "cpu"): ["cluster=cpu", "rollout=hf"],  # vLLM and SGLang need GPUs (recipes.check.lookups)
    ("parallel", "tp4pp2"): ["strategy=megatron"],
    ("parallel", "tp8pp4"): ["strategy=megatron", "cluster.nnodes=4"],
    ("cluster", "cpu"): ["parallel=cpu", "rollout=hf"],
    ("strategy", "megatron"): ["parallel=tp8"],
    ("model", "tiny"): ["parallel=tp1"],
    ("model", "qwen2_5_0_5b"): ["parallel=tp2"],
}


@pytest.fixture
def compose():
    return compose_recipe


GUARD_STRESS = ("actor_rollout_ref.actor.optim.lr=0.05", "data.train_batch_size=8",
                "actor_rollout_ref.actor.ppo_mini_batch_size=2", "actor_rollout_ref.actor.ppo_epochs=2")
"""Settings under which the KL guard has work: a large step size and 4 mini-batches x 2 epochs, 8 updates a step."""


def sweep_records(workdir: Path, recipe: str = "grpo") -> list[Path]:
    """The ``sweep_results.json`` files that local sweeps of ``recipe`` wrote under ``workdir``."""
    return sorted((workdir / "runs" / recipe).glob("multirun-*/sweep_results.json"))


@dataclass
class TrainingSweep:
    """A finished local training sweep: the process, the folder it ran in, ``sweep_results.json``'s jobs."""

    proc: subprocess.CompletedProcess
    workdir: Path
    jobs: list[dict]

    def run_dir(self, num: int) -> Path:
        return self.workdir / self.jobs[num]["run_dir"]

    def stdout_of(self, num: int) -> str:
        """What job ``num`` printed: from its ``training: ... in <run folder>`` line to the next job's (or the
        summary)."""
        lines = self.proc.stdout.splitlines()
        start = next(i for i, line in enumerate(lines)
                     if line.startswith("training: ") and f" in {self.run_dir(num)} " in line)
        end = next((i for i in range(start + 1, len(lines)) if lines[i].startswith(("training: ", "sweep: "))),
                   len(lines))
        return "\n".join(lines[start:end])


@pytest.fixture(scope="session")
def training_sweep(recipe_cli, tmp_path_factory) -> TrainingSweep:
    """``python -m recipes.grpo -m kl=adaptive,fixed``, 2 steps each under :data:`GUARD_STRESS`, checkpoint at step 2:
    one launch for two promises. The sweep runs every job in one process (tests/recipes/test_sweep.py); job 0 is
    the KL guard's run (tests/recipes/verl_ext/stability/test_stability_cpu.py)."""
    workdir = tmp_path_factory.mktemp("training_sweep")
    proc = recipe_cli("grpo", "-m", "kl=adaptive,fixed", "trainer.total_training_steps=2", "trainer.save_freq=2",
                      *GUARD_STRESS, cwd=workdir, timeout=900)
    records = sweep_records(workdir)
    if proc.returncode != 0 or len(records) != 1:
        pytest.fail(f"the training sweep: exit {proc.returncode}, records {records}\n{proc.stdout[-3000:]}\n"
                    f"{proc.stderr[-3000:]}")
    return TrainingSweep(proc, workdir, json.loads(records[0].read_text())["jobs"])
