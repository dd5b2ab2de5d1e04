"""Deployment files rendered from the inventory: one module per target (`mlx-medic render`).

Each target module has `render(site) -> list[Rendered]`; `cli.py` names them and imports
only the chosen ones. What several targets share (the commands services run, their stop
bound, log paths, TMPDIR) is in `services.py`, so a launchd job and a systemd unit for the
same model can never disagree.
"""
