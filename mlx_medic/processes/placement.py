"""A launch's placement, from what mlx.launch hands every rank it starts.

mlx.launch (mlx/_distributed_utils/launch.py) gives each rank `MLX_RANK` and, for the
ring backend, `MLX_HOSTFILE`: the path of a `mktemp` file holding every rank's `ip:port`
list (JSON, one list per rank, in rank order); for JACCL, `MLX_JACCL_COORDINATOR` (rank
0's `ip:port`) and `MLX_IBV_DEVICES`, a `mktemp` file holding the RDMA device matrix. The
temporary path changes at every launch; the content does not, as long as the hostfile
and the ports are the same. So two live ranks of one model with the same rank number and
the same placement content are two launches of the same thing: only one can be current.

The placement also says how many ranks the launch puts on the rank's own host: ring
entries with the same addresses as the rank's own entry (JACCL places one rank per host).
A ssh client started by mlx.launch carries the same content in its launch script.
"""

from __future__ import annotations

import json
import os
import stat
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from mlx_medic.processes.command_line import launch_script
from mlx_medic.processes.info import (
    ENV_HOSTFILE,
    ENV_IBV_DEVICES,
    ENV_JACCL_COORDINATOR,
    ENV_JACCL_RING,
    ENV_RANK,
)

if TYPE_CHECKING:
    from mlx_medic.inventory.model import Model


@dataclass(frozen=True)
class Placement:
    """Where one launch puts its ranks, and which of them a process is."""

    key: str  # the content every rank of the launch shares (not the temporary paths)
    rank: int
    size: int  # ranks in the launch
    ranks_here: int  # ranks the launch places on this rank's host


def _canonical(content: str) -> tuple[str, object]:
    """The content as one string that ignores layout, and its parsed JSON (or None)."""
    text = content.strip()
    try:
        parsed = json.loads(text)
    except ValueError:
        return text, None
    return json.dumps(parsed, sort_keys=True, separators=(",", ":")), parsed


def _hosts_of(entry: object) -> frozenset[str] | None:
    if not isinstance(entry, list) or not all(isinstance(a, str) for a in entry):
        return None
    return frozenset(address.rpartition(":")[0] for address in entry)


def placement_from(
    rank: str | None,
    *,
    hostfile: str | None = None,
    devices: str | None = None,
    coordinator: str | None = None,
    jaccl_ring: str | None = None,
) -> Placement | None:
    """The placement from the values and file contents a rank was handed, or None when
    they place nothing that two launches could share (no addresses: a lone rank)."""
    try:
        number = int(rank) if rank is not None else -1
    except ValueError:
        return None
    if number < 0:
        return None
    if coordinator is not None or devices is not None:  # JACCL: one rank per host
        if coordinator is None or devices is None:
            return None
        key, matrix = _canonical(devices)
        size = len(matrix) if isinstance(matrix, list) else 0
        if size < 2 or number >= size:
            return None
        return Placement(f"jaccl {coordinator} ring={jaccl_ring or ''} {key}", number, size, 1)
    if hostfile is None:
        return None
    key, entries = _canonical(hostfile)
    if not isinstance(entries, list) or len(entries) < 2 or number >= len(entries):
        return None  # a single-rank launch writes an empty hostfile: no addresses to share
    hosts = [_hosts_of(entry) for entry in entries]
    own = hosts[number]
    if own is None:
        return None
    return Placement(f"ring {key}", number, len(entries), sum(1 for h in hosts if h == own))


Reader = Callable[[str], str | None]  # path -> content, None when it cannot be read


def placement_of_env(env: Mapping[str, str], read: Reader) -> Placement | None:
    """A rank's placement from its environment, reading the files it names."""
    if ENV_RANK not in env:
        return None
    files: dict[str, str | None] = {}
    for name in (ENV_HOSTFILE, ENV_IBV_DEVICES):
        path = env.get(name)
        if path is not None:
            files[name] = content = read(path)
            if content is None:
                return None  # named but unreadable: no placement rather than a wrong one
    return placement_from(
        env[ENV_RANK],
        hostfile=files.get(ENV_HOSTFILE),
        devices=files.get(ENV_IBV_DEVICES),
        coordinator=env.get(ENV_JACCL_COORDINATOR),
        jaccl_ring=env.get(ENV_JACCL_RING),
    )


def placement_of_ssh_client(cmdline: tuple[str, ...]) -> Placement | None:
    """The placement of the rank an mlx.launch ssh client starts, from its launch script."""
    script = launch_script(cmdline)
    if script is None:
        return None
    return placement_from(
        script.exports.get(ENV_RANK),
        hostfile=script.files.get(ENV_HOSTFILE),
        devices=script.files.get(ENV_IBV_DEVICES),
        coordinator=script.exports.get(ENV_JACCL_COORDINATOR),
        jaccl_ring=script.exports.get(ENV_JACCL_RING),
    )


def rank_devices(env: Mapping[str, str], read: Reader) -> tuple[str, ...]:
    """The RDMA devices a JACCL rank uses: its own row of the `MLX_IBV_DEVICES` matrix
    (`[[null, "rdma_en5"], ["rdma_en5", null]]`), in order, each once; () when unknown
    (not a JACCL rank, the file gone or not a matrix): the ledger then counts the node."""
    path, rank = env.get(ENV_IBV_DEVICES), env.get(ENV_RANK)
    if path is None or rank is None or not rank.isdigit():
        return ()
    content = read(path)
    if content is None:
        return ()
    try:
        matrix = json.loads(content)
    except ValueError:
        return ()
    if not isinstance(matrix, list) or int(rank) >= len(matrix):
        return ()
    row = matrix[int(rank)]
    cells = row if isinstance(row, list) else []
    found: list[str] = []
    for cell in cells:
        for device in cell if isinstance(cell, list) else [cell]:
            if isinstance(device, str) and device not in found:
                found.append(device)
    return tuple(found)


# --- the hostfile's RDMA devices ------------------------------------------------------------

HOSTFILE_LIMIT = 256 * 1024  # a JACCL hostfile for dozens of nodes is a few KiB


def hostfile_hosts(path: str | Path) -> list[dict[str, Any]] | None:
    """The host objects of an mlx.launch hostfile in rank order: a bare JSON list of them,
    or the object `mlx.distributed_config` writes (`{"backend", "envs", "hosts": [...]}`),
    both as mlx.launch reads them (mlx/_distributed_utils/common.py); None when it cannot
    be read here or is neither."""
    try:  # O_NONBLOCK and a regular file only: a FIFO at the path never hangs a reader
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
        with os.fdopen(fd, "rb") as handle:
            if not stat.S_ISREG(os.fstat(handle.fileno()).st_mode):
                return None
            data = handle.read(HOSTFILE_LIMIT + 1)
        if len(data) > HOSTFILE_LIMIT:
            return None
        parsed = json.loads(data)
    except (OSError, ValueError):
        return None
    hosts = parsed.get("hosts") if isinstance(parsed, dict) else parsed
    if not isinstance(hosts, list) or not all(isinstance(h, dict) for h in hosts):
        return None
    return hosts


def hostfile_devices(model: Model, node: str) -> tuple[str, ...]:
    """The RDMA devices `model`'s JACCL hostfile gives `node`: the `rdma` list of its row
    (rows in the model's node order), each once, in order; () when the model has no JACCL
    backend, does not place the node, or the file is not readable here."""
    jaccl = model.backends.jaccl
    if jaccl is None or node not in model.nodes:
        return ()
    hosts = hostfile_hosts(jaccl.hostfile)
    index = list(model.nodes).index(node)
    if hosts is None or index >= len(hosts):
        return ()
    cells = hosts[index].get("rdma")
    found: list[str] = []
    for cell in cells if isinstance(cells, list) else []:
        for device in cell if isinstance(cell, list) else [cell]:
            if isinstance(device, str) and device not in found:
                found.append(device)
    return tuple(found)
