"""Checks and plans a run before anything starts."""
