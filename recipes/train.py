"""action=train: hand the validated, resolved config to verl 0.9.1's own trainer (its default v1 path)."""

from __future__ import annotations


def run_training(checked) -> None:
    from verl.trainer.main_ppo import TaskRunnerV1, run_ppo
    from verl.utils.device import auto_set_device

    cfg = checked.cfg
    auto_set_device(cfg)
    if cfg.trainer.use_v1:
        run_ppo(cfg, task_runner_class=TaskRunnerV1)
    else:
        from verl.trainer.main_ppo_v0 import TaskRunner

        run_ppo(cfg, task_runner_class=TaskRunner)
