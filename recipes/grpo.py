"""GRPO on verl 0.9.1: `python -m recipes.grpo [group=option ...] [verl.key=value ...] [action=validate|plan]`."""

from recipes.launch import run_recipe

if __name__ == "__main__":
    run_recipe("grpo")
