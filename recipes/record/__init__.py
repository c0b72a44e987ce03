"""The record of a run: its folder, and what is written there."""
