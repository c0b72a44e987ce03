"""Stage 4 of a run, record: the run folder and what is written there, exactly what verl gets.

- rundir.py: a run folder of its own, created exclusively, and its lock;
- bundle.py: the record every action writes: ``resolved_config.yaml``, ``repro/`` (rerun.sh, bundle.json), the env;
- redact.py: the one redaction policy: what counts as a secret in a name, a value, a command line or a config;
- gitstate.py: a repository's git state (SHA, branch, dirty flag) for the record and recipe copies;
- records.py: files written whole or not at all (write aside, then ``os.replace``);
- yamlio.py: YAML out as OmegaConf writes it, with PyYAML's C emitter.
"""
