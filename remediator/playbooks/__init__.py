"""Playbooks: what a run does to a model. The engine is given instances by name; the
config routes alert names to these names."""

from mlx_medic.remediator.playbooks.base import Playbook, RecheckVerdict, recheck_model_down
from mlx_medic.remediator.playbooks.recover import RecoverPlaybook


def builtin_playbooks() -> dict[str, Playbook]:
    """The playbooks a config may route to, by name."""
    return {"recover": RecoverPlaybook()}


__all__ = ["Playbook", "RecheckVerdict", "RecoverPlaybook", "builtin_playbooks",
           "recheck_model_down"]
