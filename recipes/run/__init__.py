"""Stage 3 and the train action: finalize the validated run, hand it to verl's trainer, and watch it.

- finalize.py: stage 3: loggers, every Ray worker's environment, verl's hooks: the config verl gets (``FinalRun``);
- train.py: ``action=train``: verl 0.9.1's own trainer, the progress lines, curves and the run's end;
- console.py: verl's and Ray's output to ``verl.log`` in the run folder, the pack's own lines on the terminal;
- monitor.py: one progress line per step from ``metrics.jsonl``, and ``curves.png`` at the end;
- interrupt.py: Ctrl-C or SIGTERM: a clean stop that says what was kept and how to go on;
- resume.py: ``run.resume=<run folder>``: continue a run in its own folder from its last complete checkpoint;
- checkpoints.py: which checkpoints count: only complete ones, checked against their manifest;
- gc_threshold.py: ``run.gc_threshold``: Python's garbage collector in the launcher and every Ray worker.
"""
