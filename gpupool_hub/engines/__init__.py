"""Engines: what runs a server (a local process, a systemd unit, a Kubernetes pod, a Slurm job), one folder each."""
