"""KL-PPO (GAE + critic) on verl 0.9.1: `python -m recipes.kl_ppo [group=option ...] [verl.key=value ...]`."""

from recipes.launch import run_recipe

if __name__ == "__main__":
    run_recipe("kl_ppo")
