"""Entropy control check: Clip-Cov and KL-Cov act only on off-policy updates.

Both losses (verl ``policy_loss.loss_mode=clip_cov|kl_cov``) pick the tokens with the largest covariance between
log-prob and advantage and clip their gradient or penalise their KL to the old policy. In a strictly on-policy step (one
PPO epoch over one mini-batch: ``ppo_mini_batch_size == train_batch_size`` and ``ppo_epochs == 1``) the policy equals
the old policy at the only update, the ratio is 1 and the KL is 0: KL-Cov adds nothing and Clip-Cov only drops a few
tokens' gradients. :func:`entropy_warnings` says so before the run starts (``recipes/check/validate.py`` calls it).
"""

from __future__ import annotations

from omegaconf import OmegaConf


def entropy_warnings(cfg) -> list[str]:
    """One warning line per entropy setting that would have no effect under this config; [] otherwise."""
    mode = OmegaConf.select(cfg, "actor_rollout_ref.actor.policy_loss.loss_mode", default="vanilla")
    if mode not in ("clip_cov", "kl_cov"):
        return []
    mini = OmegaConf.select(cfg, "actor_rollout_ref.actor.ppo_mini_batch_size", default=None)
    batch = OmegaConf.select(cfg, "data.train_batch_size", default=None)
    epochs = OmegaConf.select(cfg, "actor_rollout_ref.actor.ppo_epochs", default=1)
    if mini is None or batch is None or int(mini) != int(batch) or int(epochs) != 1:
        return []
    return [
        f"entropy={mode}: actor_rollout_ref.actor.ppo_mini_batch_size ({mini}) == data.train_batch_size ({batch}) "
        f"and actor_rollout_ref.actor.ppo_epochs == 1 make every update strictly on-policy, so {mode} has (almost) "
        "no effect; use several mini-batches or epochs per step"
    ]
