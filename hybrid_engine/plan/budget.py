"""The auto token budget: the largest dynamic micro-batch per GPU that the memory model says fits, per pass.

Every budget-dependent term of the memory model (logits, their copies and gradient, the layers autograd keeps) grows
in proportion to the micro-batch's tokens, so each phase is ``static + slope * tokens``: two evaluations give both,
and the budget is

    (GPU - min_headroom - static) / ((1 + AUTO_MARGIN) * slope)

rounded down to ``AUTO_ROUND`` tokens, then capped by the tokens the pass can hold at all (the PPO mini-batch per GPU
for the update, the rollout batch per GPU for the log-prob passes, at prompt + response each). Below one sequence
(verl's lower bound) the run does not fit at any budget: the budget is one sequence and the plan says it does not fit.
The update budget sizes the training phase, the log-prob budget the log-prob phase (the actor's pass, with entropy);
the critic's is twice the actor's (the source article: 2x the actor's), capped like it.
"""

from __future__ import annotations

from dataclasses import replace

from hybrid_engine.groups import HybridGroups
from hybrid_engine.model_spec import ModelSpec
from hybrid_engine.plan.memory import estimate_memory
from hybrid_engine.plan.settings import GIB, ClusterSpec, PlanSettings

__all__ = ["AUTO_MARGIN", "AUTO_ROUND", "auto_token_budgets"]

AUTO_MARGIN = 0.15
"""The budget-dependent bytes are sized this much above the model: its accuracy target on an H200 (README, memory
accuracy), so an under-estimate of that size still fits."""
AUTO_ROUND = 256
"""Budgets are whole multiples of this many tokens (at least one sequence)."""


def _phase_line(phase_at, tokens: int) -> tuple[float, float]:
    low, high = phase_at(tokens), phase_at(2 * tokens)
    slope = (high - low) / tokens
    return low - slope * tokens, slope


def _largest(static: float, slope: float, room: int, seq: int, cap: int | None) -> tuple[int, str]:
    """The largest budget that fits ``room`` bytes, and what limits it: memory, the pass's tokens, or nothing fits."""
    if slope <= 0:
        return (cap or seq), "the pass's tokens"
    fits = int((room - static) / ((1 + AUTO_MARGIN) * slope))
    if fits < seq:
        return seq, "does not fit one sequence"
    fits = max(fits // AUTO_ROUND * AUTO_ROUND, seq)
    if cap is not None and cap <= fits:
        return cap, "the pass's tokens"
    return fits, "memory"


def auto_token_budgets(
    spec: ModelSpec, groups: HybridGroups, cluster: ClusterSpec, settings: PlanSettings, generation_weight_bytes: int
) -> dict:
    """The update, log-prob and critic token budgets per GPU that the memory model sizes for this GPU and layout,
    with the phases' bytes at those budgets and the headroom left (see the module docstring)."""
    seq = settings.sequence_length
    # both budgets explicit (each phase depends on its own only), no cap: the line of each phase in tokens
    open_ended = replace(settings, use_dynamic_bsz=True, mini_batch_sequences_per_gpu=None,
                         rollout_sequences_per_gpu=None, ppo_max_token_len_per_gpu=seq,
                         log_prob_max_token_len_per_gpu=seq)

    def phase_at(phase: str, key: str):
        def at(tokens: int) -> int:
            trial = replace(open_ended, **{key: tokens})
            memory = estimate_memory(spec, groups, cluster, trial, generation_weight_bytes)
            if phase != "training":
                return memory["phases"][phase]
            # the pass's line alone: the optimizer step after it does not grow with tokens (checked below)
            parts = memory["training_parts"]
            return memory["phases"]["training"] - max(parts["pass"], parts["optimizer_step"]) + parts["pass"]

        return at

    room = cluster.memory_bytes - int(settings.min_headroom_gib * GIB)
    update_cap = settings.mini_batch_sequences_per_gpu and settings.mini_batch_sequences_per_gpu * seq
    log_prob_cap = settings.rollout_sequences_per_gpu and settings.rollout_sequences_per_gpu * seq
    update, update_limit = _largest(*_phase_line(phase_at("training", "ppo_max_token_len_per_gpu"), seq),
                                    room, seq, update_cap)
    log_prob, log_prob_limit = _largest(*_phase_line(phase_at("log_prob", "log_prob_max_token_len_per_gpu"), seq),
                                        room, seq, log_prob_cap)
    at_seq = estimate_memory(spec, groups, cluster, open_ended, generation_weight_bytes)
    parts = at_seq["training_parts"]
    step_peak = at_seq["phases"]["training"] - max(parts["pass"], parts["optimizer_step"]) + parts["optimizer_step"]
    if step_peak > room:
        update, update_limit = seq, "does not fit one sequence"  # AdamW's step alone does not fit
    critic = min(2 * update, update_cap) if update_cap else 2 * update
    planned = replace(settings, use_dynamic_bsz=True, ppo_max_token_len_per_gpu=update,
                      log_prob_max_token_len_per_gpu=log_prob)
    memory = estimate_memory(spec, groups, cluster, planned, generation_weight_bytes)
    return {
        "ppo_max_token_len_per_gpu": update,
        "log_prob_max_token_len_per_gpu": log_prob,
        "critic_ppo_max_token_len_per_gpu": critic,
        "limits": {"update": update_limit, "log_prob": log_prob_limit},
        "margin": AUTO_MARGIN,
        "training_bytes": memory["phases"]["training"],
        "log_prob_bytes": memory["phases"]["log_prob"],
        "gpu_bytes": memory["gpu_bytes"],
        "headroom_bytes": memory["gpu_bytes"] - max(memory["phases"]["training"], memory["phases"]["log_prob"]),
        "fits": update_limit != "does not fit one sequence" and log_prob_limit != "does not fit one sequence",
    }
