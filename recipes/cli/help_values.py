"""``--help kl``'s closing lines: the KL numbers the command line would run with, read from its composed config.

The option descriptions in conf/kl/ give each option's own values; a task or an experiment may change them (the
embedded tiny task starts the coefficients at 0.05 and ramps the target from 0.02 to 0.5). These lines compose
the recipe with the user's overrides, and with the embedded CPU default where that would apply, and say what the
run would use.
"""

from __future__ import annotations

from omegaconf import OmegaConf

from recipes.compose.defaults import EMBEDDED_DEFAULTS, chooses_layout, has_accelerator
from recipes.compose.overrides import chosen_keys


def run_overrides(overrides: list[str]) -> tuple[list[str], bool]:
    """The run's overrides, and whether the embedded CPU default applies (no GPU here and no layout chosen): then its
    group choices are added where the user chose none."""
    rest = list(overrides)
    embedded = not chooses_layout(rest) and not has_accelerator()
    if embedded:
        chosen = chosen_keys(rest)
        rest += [f"{group}={option}" for group, option in EMBEDDED_DEFAULTS.items() if group not in chosen]
    return rest, embedded


def kl_lines(recipe: str, overrides: list[str]) -> list[str]:
    """The KL control this command line runs with: mode, target schedule, both coefficients, rule, guard."""
    from recipes.compose.compose import compose_recipe  # lazy: Hydra composes only for this topic

    overrides, embedded = run_overrides(overrides)
    cfg = compose_recipe(recipe, overrides)
    sel = lambda key: OmegaConf.select(cfg, key, default=None)  # noqa: E731
    where = "no GPU here: the embedded CPU default" if embedded else "as composed"
    lines = [f"with this command line ({where}): kl={sel('kl.mode')}"]
    mode = sel("kl.mode")
    if mode == "ramp":
        lines.append(f"  target {sel('kl.ramp.start'):g} -> {sel('kl.ramp.end'):g} over {sel('kl.ramp.steps')} steps")
    elif mode == "adaptive":
        lines.append(f"  target {sel('kl.target'):g}")
    loss_on, reward_on = bool(sel("actor_rollout_ref.actor.use_kl_loss")), bool(sel("algorithm.use_kl_in_reward"))
    lines.append(f"  loss-side coefficient {sel('actor_rollout_ref.actor.kl_loss_coef'):g} at step 0"
                 f" ({'used' if loss_on else 'unused'}: actor_rollout_ref.actor.use_kl_loss={str(loss_on).lower()})")
    lines.append(f"  in-reward coefficient {sel('algorithm.kl_ctrl.kl_coef'):g} at step 0"
                 f" ({'used' if reward_on else 'unused'}: algorithm.use_kl_in_reward={str(reward_on).lower()})")
    if mode in ("adaptive", "ramp"):
        c = "kl.controller"
        rule = sel(f"{c}.rule")
        if rule == "pi":
            gains = (f"kp {sel(f'{c}.kp'):g}, ki {sel(f'{c}.ki'):g}, max_step {sel(f'{c}.max_step'):g}, "
                     f"lookahead {sel(f'{c}.lookahead'):g}")
        else:
            gains = f"horizon {sel('algorithm.kl_ctrl.horizon')}"
        lines.append(f"  rule {rule}: {gains}")
    guard = sel("kl.guard.max_kl")
    lines.append(f"  guard: {'off' if guard is None else f'a step stops its PPO updates past KL {guard:g}'}")
    return lines
