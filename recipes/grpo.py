"""GRPO on verl 0.9.1: `python -m recipes.grpo [group=option ...] [verl.key=value ...] [action=validate|plan]`."""

import sys

if __name__ == "__main__":
    try:  # a Ctrl-C while the pack loads, before the entry point's own handling: one line, exit 130
        from recipes.launch import run_recipe
    except KeyboardInterrupt:
        print("interrupted before the run started: nothing was written and nothing is left running", file=sys.stderr)
        sys.exit(130)
    run_recipe("grpo")
