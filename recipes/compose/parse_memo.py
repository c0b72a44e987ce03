"""OmegaConf's interpolation parses, kept for the next read of the same string in this process.

OmegaConf 2.3 parses an interpolation (``${pack.token_budget:${batching.actor_factor},...}``) with its ANTLR grammar
every time the value is read, and again when such a string is assigned: a recipe's config holds about 200 of them,
and a composition, a validation (the schema, the token budgets, verl's checks) and the run read them many times
over; two thirds of a full resolution was parsing (the same strings each time). :func:`install` keeps the parse tree
of each string (at most :data:`KEPT` of them, least recently used out first): a tree is only read by OmegaConf's
visitor, the tokens keep their own input, and a string that does not parse is parsed (and raises) each time.
Measured on a 2-core machine, 2026-12-05, the KL-PPO recipe's default (medians of 5, two rounds alike): a full
resolution 75 -> 27 ms, ``recipes.check.validate.validate`` 260 -> 187 ms; a composition is unchanged (~250 ms: Hydra's
merges take the regex path). ``tests/recipes/test_parse_memo.py`` checks the resolutions are the same.

Pinned to omegaconf 2.3: ``omegaconf.grammar_parser.parse``, as ``omegaconf.base``, ``omegaconf._utils`` and
``omegaconf.resolvers.oc`` import it.
"""

from __future__ import annotations

import functools
import importlib

from omegaconf import grammar_parser

KEPT = 4096
"""Parse trees kept: a recipe's config has about 200 interpolation strings; a sweep's variants add their own."""

_USERS = ("omegaconf.base", "omegaconf._utils", "omegaconf.resolvers.oc")
_OMEGACONF_PARSE = grammar_parser.parse
_kept_parse = functools.lru_cache(maxsize=KEPT)(_OMEGACONF_PARSE)


def install() -> None:
    """Keep parse trees from now on in this process (idempotent)."""
    _point(_kept_parse)


def uninstall() -> None:
    """OmegaConf's own parsing again, and nothing kept."""
    _point(_OMEGACONF_PARSE)
    _kept_parse.cache_clear()


def _point(parse) -> None:
    for name in _USERS:
        module = importlib.import_module(name)
        if getattr(module, "parse", None) not in (_OMEGACONF_PARSE, _kept_parse):
            raise RuntimeError(f"{name}.parse is not omegaconf.grammar_parser.parse (omegaconf 2.3 expected)")
        module.parse = parse
