"""The service manager's own commands for a model's service, as exact argument lists.

One source for the node helper that runs them, the steps that journal them and the
sudoers rule `render` writes: a sudoers line allows exactly these words, so nothing else
may build them. launchd and systemd change system state and need root: `sudo -n` (never
wait for a password). supervisorctl talks to supervisord over its socket, whose file
permissions decide who may.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Literal, get_args

if TYPE_CHECKING:
    from mlx_medic.inventory.model import Model

ServiceAction = Literal["stop", "start", "restart"]
SERVICE_ACTIONS: tuple[ServiceAction, ...] = get_args(ServiceAction)
SUDO = ("sudo", "-n")
LAUNCHCTL = "/bin/launchctl"
SYSTEMCTL = "/bin/systemctl"
SUPERVISORCTL = "supervisorctl"
SUPERVISORCTL_PATH = "/usr/bin/supervisorctl"  # Debian's, with `service.sudo`


def service_argv(model: Model, action: ServiceAction) -> list[str]:
    """The command that stops, starts or restarts the model's service on its head.

    launchd: `bootout` unloads the KeepAlive job so it cannot respawn ranks while the
    nodes are swept; `bootstrap` loads it again from its plist; `kickstart -k` restarts a
    job that stays loaded (the seed's form).
    """
    service = model.service
    label = service.label
    match service.manager:
        case "launchd":
            launchd = {
                "stop": ["bootout", f"system/{label}"],
                "start": ["bootstrap", "system", str(service.plist_path)],
                "restart": ["kickstart", "-k", f"system/{label}"],
            }
            return [*SUDO, LAUNCHCTL, *launchd[action]]
        case "systemd":
            return [*SUDO, SYSTEMCTL, action, label]
        case "supervisord":
            config = ["-c", str(service.config)] if service.config is not None else []
            if service.sudo:  # a sudoers rule names the program by its full path
                return [*SUDO, SUPERVISORCTL_PATH, *config, action, label]
            return [SUPERVISORCTL, *config, action, label]
    raise ValueError(f"unknown service manager {service.manager!r}")


def privileged_argv(model: Model) -> list[list[str]]:
    """Every command of the model's that goes through sudo, without the `sudo -n`:
    what a sudoers rule for the model must allow, and nothing more."""
    found = []
    for action in SERVICE_ACTIONS:
        argv = service_argv(model, action)
        if tuple(argv[: len(SUDO)]) == SUDO:
            found.append(argv[len(SUDO) :])
    return found
