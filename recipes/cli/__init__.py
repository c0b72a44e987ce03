"""The user's tools around a run: --help, and copying a recipe into a team repository."""
