"""Inventories for the serve wrapper's unit tests: one model `tiny` on ai001 (head) and
ai002, its backends as each test needs them."""

from __future__ import annotations

from pathlib import Path

from mlx_medic.inventory.load import parse_inventory
from mlx_medic.inventory.schema import Inventory

BOTH = "{jaccl: {hostfile: /etc/jaccl.json}, ring: {hostfile: /etc/ring.json, pipeline: true}}"


def inventory(
    tmp_path: Path,
    backends: str = BOTH,
    serve: str = "{}",
    serve_args: str = "{}",
    policy: str = "{}",
    more: str = "",
) -> Inventory:
    """`tiny` with these settings; `more`: further models' YAML, indented as models."""
    return parse_inventory(f"""\
state_dir: {tmp_path / "state"}
nodes:
  ai001: {{ssh: 127.0.0.2}}
  ai002: {{ssh: 127.0.0.3}}
models:
  tiny:
    model: /models/tiny
    nodes: [ai001, ai002]
    port: 8123
    service: {{manager: supervisord, label: tiny-svc, config: /etc/supervisord.conf}}
    backends: {backends}
    serve: {serve}
    serve_args: {serve_args}
    policy: {policy}
{more}""")


OTHER = """\
  other:
    model: /models/other
    nodes: [ai002]
    port: 8124
    service: {manager: supervisord, label: other-svc, config: /etc/supervisord.conf}
    backends: {ring: {hostfile: /etc/ring2.json}}
"""


def jaccl_inventory(tmp_path: Path) -> Inventory:
    """Two nodes whose JACCL hostfile names one device per peer (as mlx.launch reads it),
    and a second model placed on ai002 that shares its devices."""
    hostfile = tmp_path / "jaccl.json"
    hostfile.write_text(
        '[{"ssh": "ai001", "ips": ["10.0.0.1"], "rdma": [null, "rdma_en3"]},'
        ' {"ssh": "ai002", "ips": ["10.0.0.2"], "rdma": ["rdma_en5", null]}]'
    )
    backends = f"{{jaccl: {{hostfile: {hostfile}}}, ring: {{hostfile: /etc/r.json}}}}"
    return inventory(tmp_path, backends, policy="{pd_reserve: 3}", more=OTHER)
