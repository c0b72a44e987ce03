"""Stage 1 of a run, compose: the command line and conf/ become one Hydra config (recipes.launch calls it first).

- compose.py: composes a recipe as ``python -m recipes.<name>`` does; adopts a pasted verl script's primary config,
  engine switch and batching keys; refuses mixed engines and shared parts; Hydra's errors as one line each;
- overrides.py: the command line split once (``CommandLine``: each override's key, value, deletion; Hydra's flags);
- defaults.py: the embedded CPU default, and what counts as choosing a GPU layout instead;
- layout_keys.py: the verl keys that repeat a layout or cluster number, and how a typed one is adopted;
- confdir.py: where conf/ is (checkout, wheel, a copied recipe) and what is in it: groups, options, a recipe's defaults;
- resolvers.py: the pack's OmegaConf resolvers (``${pack.*:...}``), registered once;
- hydra_cache.py: Hydra's parsed config files, kept for the next composition in this process;
- parse_memo.py: OmegaConf's interpolation parses, kept for the next read of the same string.
"""
