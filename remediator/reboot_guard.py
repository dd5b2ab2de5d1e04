"""The guards of a reboot by the remediator (issue 29's opt-in guarded reboot), as one pure
decision: given what is known of the cluster now, may NODE be rebooted, and if not, which
guard refuses. The `reboot-node` run (remediator/playbooks/reboot_node.py) gathers the view
and asks it just before it acts (docs/drain.md); kept apart so every guard is tested on
its own.

The guards, in the order they are asked (the first that refuses is named):
- `off`: the node's `reboot.allowed` is false (the default);
- `paused`: a person's pause holds a model placed on the node (or all models);
- `another-rebooting`: another node is being rebooted: one node at a time in the cluster;
- `booted-recently`: the node booted less than `min_uptime` ago;
- `last-healthy-node`: a model placed on the node is serving and the node is the last of
  its healthy nodes;
- `no-need`: no survivor on the node holds domains a model placed there needs, or every
  such model serves on JACCL already (a reboot is for a model that is down or on ring).
"""

from __future__ import annotations

from collections.abc import Set
from dataclasses import dataclass


@dataclass(frozen=True)
class ModelView:
    """One model placed on the node, as the guards see it."""

    name: str
    serving: bool  # answers now
    backend: str | None  # what it serves on (None: down)
    healthy_nodes: frozenset[str]  # its nodes that are up and could serve it
    paused: bool  # a person's pause (its own or of all models)
    survivors_hold_its_domains: bool  # a survivor on the node holds domains it needs


@dataclass(frozen=True)
class ClusterView:
    """What the guards read: the node's setting and boot time, the nodes being rebooted,
    and the models placed on the node."""

    node: str
    allowed: bool
    booted_at: float  # Unix time the node's current boot began
    now: float
    min_uptime: float  # seconds: no reboot within this long of the last boot
    rebooting: Set[str] = frozenset()
    models: tuple[ModelView, ...] = ()


@dataclass(frozen=True)
class Refusal:
    guard: str
    why: str

    def __str__(self) -> str:
        return f"reboot refused by the {self.guard} guard: {self.why}"


def reboot_refusal(view: ClusterView) -> Refusal | None:
    """The first guard that refuses the reboot of `view.node`, or None: it may reboot."""
    node = view.node
    if not view.allowed:
        return Refusal("off", f"nodes.{node}.reboot.allowed is false")
    paused = [m.name for m in view.models if m.paused]
    if paused:
        return Refusal("paused", f"a person paused {', '.join(paused)}")
    others = sorted(set(view.rebooting) - {node})
    if others:
        return Refusal("another-rebooting", f"{', '.join(others)} is being rebooted")
    up = view.now - view.booted_at
    if up < view.min_uptime:
        return Refusal(
            "booted-recently", f"{node} booted {up:.0f}s ago (less than {view.min_uptime:g}s)"
        )
    for model in view.models:
        if model.serving and not (model.healthy_nodes - {node}):
            return Refusal(
                "last-healthy-node", f"{node} is the last healthy node of {model.name}, serving"
            )
    needing = [
        m.name
        for m in view.models
        if m.survivors_hold_its_domains and not (m.serving and m.backend == "jaccl")
    ]
    if not needing:
        return Refusal(
            "no-need",
            f"no model placed on {node} is down or on ring with domains its survivors hold",
        )
    return None
