"""Around the run, the cluster: Ray Jobs, the Ray resources a run declares, the workers' NCCL env, and sweeps.

- ray_jobs.py: a run (``launcher=ray``) or every job of a ``-m`` sweep submitted to an existing Ray cluster;
- ray_resources.py: the Ray resources a run declares, against what verl's workers hold;
- nccl_env.py: the environment every Ray worker gets (the nccl/ preset over verl's defaults), its conflicts, the record;
- sweep.py: a ``-m`` sweep's jobs checked before any starts, and the summary table at a local sweep's end.
"""
