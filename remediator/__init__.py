"""Alertmanager webhook service that recovers MLX models: stop, sweep, clean,
restart, verify, fall back, escalate; every step journaled."""
