"""The inventory the node-helper tests share: nodes n1 and n2, model m1 on both, m2 on n2."""

from __future__ import annotations


def two_models(
    state_dir: str = "/var/lib/mlx-medic", *, n1: str = "", m1: str = "", m2: str = ""
) -> str:
    """The YAML; `n1`, `m1`, `m2`: extra lines (already indented) for that entry."""
    return f"""\
state_dir: {state_dir}
nodes:
  n1: {{ssh: 127.0.0.2{n1}}}
  n2: {{ssh: 127.0.0.3}}
models:
  m1:
    model: /models/m1
    nodes: [n1, n2]
    port: 8080
    service: {{manager: supervisord, label: m1}}
    backends: {{ring: {{hostfile: /etc/ring.json}}}}{m1}
  m2:
    model: /models/m2
    nodes: [n2]
    port: 8081
    service: {{manager: supervisord, label: m2}}
    backends: {{ring: {{hostfile: /etc/ring.json}}}}{m2}
"""
