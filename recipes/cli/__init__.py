"""Around the run, the user's tools: ``--help`` and copying a recipe (the entry points stay in recipes/).

- help.py: ``python -m recipes.<recipe> --help``: the recipe, its actions, every group and option, examples;
- help_values.py: ``--help kl``'s closing lines: the KL numbers the command line would run with;
- copy.py: ``python -m recipes.copy``: a recipe copied into a team repository, still composing there.
"""
