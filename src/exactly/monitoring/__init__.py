"""Checkpoint monitoring: a durable per-epoch history in checkpoint storage, its views
(``exactly checkpoints``, ``exactly ui``, a REST API, Prometheus metrics)."""
