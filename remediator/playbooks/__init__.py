"""Playbooks: what a run does to a model. The engine is given instances by name; the
config routes alert names to these names."""

from mlx_medic.remediator.config import RemediatorConfig
from mlx_medic.remediator.playbooks.base import Playbook, RecheckVerdict, recheck_model_down
from mlx_medic.remediator.playbooks.finish_stop import FINISH_STOP, FinishStopPlaybook
from mlx_medic.remediator.playbooks.reboot_node import REBOOT_NODE, RebootNodePlaybook
from mlx_medic.remediator.playbooks.recover import RecoverPlaybook
from mlx_medic.remediator.playbooks.sweep_orphans import SWEEP_ORPHANS, SweepOrphansPlaybook


def builtin_playbooks(config: RemediatorConfig | None = None) -> dict[str, Playbook]:
    """The playbooks a config may route to, by name, set as `config` says (its
    `orphans_clean_window`; the defaults without one)."""
    config = config or RemediatorConfig()
    return {
        "recover": RecoverPlaybook(),
        FINISH_STOP: FinishStopPlaybook(),
        SWEEP_ORPHANS: SweepOrphansPlaybook(config.orphans_clean_window),
        REBOOT_NODE: RebootNodePlaybook(),
    }


__all__ = [
    "FINISH_STOP",
    "REBOOT_NODE",
    "SWEEP_ORPHANS",
    "FinishStopPlaybook",
    "Playbook",
    "RebootNodePlaybook",
    "RecheckVerdict",
    "RecoverPlaybook",
    "SweepOrphansPlaybook",
    "builtin_playbooks",
    "recheck_model_down",
]
