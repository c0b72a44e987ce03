"""The cluster: Ray Jobs, the Ray resources a run declares, the workers' NCCL environment, sweeps."""
