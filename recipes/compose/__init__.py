"""Composes a recipe's config from conf/ and the command line."""
