"""Rule-based reward of the tiny arithmetic task, in the shape verl's custom reward function expects.

verl loads this file by path (``reward.custom_reward_function.path`` / ``.name=compute_score``) in its reward
workers, so it imports nothing but the standard library.

The task: the prompt is ``"a+b="``, the ground truth is ``str(a + b)``. A random-initialised tiny model cannot add,
so the score is shaped to give a dense signal that a few GRPO steps can climb:

- ``digits``: the fraction of the response's characters that are ASCII digits (the *format*: answer with a number).
  A random model emits a few digits by chance, so every group of samples has some spread to learn from.
- ``acc``: 1 when the response is exactly the ground truth (the *answer*), else 0.

``score = DIGIT_WEIGHT * digits + (1 - DIGIT_WEIGHT) * acc``, in [0, 1].
"""

from __future__ import annotations

DATA_SOURCE = "tiny_arith"
DIGIT_WEIGHT = 0.8
_DIGITS = frozenset("0123456789")


def digit_fraction(text: str) -> float:
    """Fraction of the characters of ``text`` (stripped of surrounding whitespace) that are ASCII digits; 0 if empty."""
    text = text.strip()
    if not text:
        return 0.0
    return sum(char in _DIGITS for char in text) / len(text)


def compute_score(data_source: str, solution_str: str, ground_truth: str, extra_info: dict | None = None) -> dict:
    """Score one response; verl logs every key of the returned dict (``score`` is the reward)."""
    digits = digit_fraction(solution_str)
    acc = float(solution_str.strip() == str(ground_truth).strip())
    return {"score": DIGIT_WEIGHT * digits + (1.0 - DIGIT_WEIGHT) * acc, "acc": acc, "digits": digits}
