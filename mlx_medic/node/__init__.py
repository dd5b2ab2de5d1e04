"""Helpers that run on a node (`mlx-medic node ...`): one module per helper, each
importing only what it needs, since the remediator runs them over SSH on every step."""
