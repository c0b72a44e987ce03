"""Copy a recipe into a team repository: ``python -m recipes.copy kl_ppo DEST [--only-used] [group=option ...]``.

The entry point keeps its name; the tool is recipes/cli/copy.py (``--help`` says the rest)."""

import sys

if __name__ == "__main__":
    from recipes.cli.copy import main

    sys.exit(main())
