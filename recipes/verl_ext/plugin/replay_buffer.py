"""verl's sync replay buffer with a short poll interval, plugged in through verl's custom-sampler hook.

The v1 trainer's ``ReplayBuffer.sample`` polls TransferQueue for finished rollouts every 2 s (a constant, sized for
GPU rollouts that take tens of seconds). A tiny CPU rollout finishes in ~0.1 s, so each step would wait ~2 s for
nothing. Select this class with::

    trainer.v1.sampler.custom_sampler.path=pkg://recipes.verl_ext.plugin.replay_buffer
    trainer.v1.sampler.custom_sampler.name=FastPollReplayBuffer
    +trainer.v1.sampler.sampler_kwargs.poll_interval=0.02   # optional, seconds
"""

from __future__ import annotations

from verl.trainer.ppo.v1.replay_buffer import ReplayBuffer

__all__ = ["DEFAULT_POLL_INTERVAL_S", "FastPollReplayBuffer"]

DEFAULT_POLL_INTERVAL_S = 0.02


class FastPollReplayBuffer(ReplayBuffer):
    """``ReplayBuffer`` (sync trainer) polling every ``sampler_kwargs.poll_interval`` seconds (default 0.02)."""

    def __init__(self, *args, sampler_kwargs=None, **kwargs) -> None:
        sampler_kwargs = dict(sampler_kwargs or {})
        kwargs.setdefault("poll_interval", float(sampler_kwargs.get("poll_interval", DEFAULT_POLL_INTERVAL_S)))
        super().__init__(*args, sampler_kwargs=sampler_kwargs, **kwargs)
