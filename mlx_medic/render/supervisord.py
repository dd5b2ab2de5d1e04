"""supervisord programs (Linux) for each wrapper model whose manager is supervisord, one
file per program for the `[include]` of the supervisord.conf the inventory names.

supervisord writes a program's output to its log files and rotates them itself
(`*_logfile_maxbytes`, `*_logfile_backups`; by default 50MB and 10): each rendered
program sets them to the size and count newsyslog rotates a launchd job's logs at, so
nothing else need rotate them.
"""

from __future__ import annotations

import shlex

from mlx_medic.render import services
from mlx_medic.render.files import GENERATED, Rendered, Site

TARGET = "supervisord"


def _value(text: str) -> str:
    """supervisord expands `%(name)s` in values: a literal `%` is written `%%`."""
    return text.replace("%", "%%")


def _environment(values: dict[str, str]) -> str:
    # KEY="value" pairs, comma-separated; a quoted value may hold commas.
    return ",".join(f'{key}="{_value(v)}"' for key, v in values.items())


def _rotation(stream: str) -> list[str]:
    """supervisord's own rotation of one log file (its MB is MiB)."""
    return [
        f"{stream}_logfile_maxbytes={services.ROTATE_AT_MIB}MB",
        f"{stream}_logfile_backups={services.ARCHIVES_KEPT}",
    ]


def render(site: Site) -> list[Rendered]:
    files = []
    for model in services.wrapper_models(site.inventory, "supervisord"):
        label = model.service.label
        stdout, stderr = services.log_paths(model)
        command = shlex.join(services.serve_argv(site.inventory, model))
        lines = [
            f"[program:{label}]",
            f"command={_value(command)}",
            *([f"user={model.service.user}"] if model.service.user else []),
            f"environment={_environment(services.environment(model))}",
            "autostart=true",
            "autorestart=true",
            # SIGTERM to the wrapper alone (it takes its ranks down itself); what is left
            # after stopwaitsecs is SIGKILLed, the whole process group.
            "stopsignal=TERM",
            "stopasgroup=false",
            "killasgroup=true",
            f"stopwaitsecs={services.stop_bound(model)}",
            f"stdout_logfile={_value(stdout)}",
        ]
        lines += _rotation("stdout")
        if stderr == stdout:
            lines.append("redirect_stderr=true")
        else:
            lines += [f"stderr_logfile={_value(stderr)}", *_rotation("stderr")]
        where = (
            f"the [include] of {model.service.config}"
            if model.service.config
            else "the [include] of supervisord.conf"
        )
        comment = (
            f"Model {model.name} on its head {model.head}: the serve wrapper, for {where}.\n"
            "stopwaitsecs: SIGKILL only after the wrapper's own teardown bound\n"
            f"(policy.stop_timeout, {model.policy.stop_timeout:g} s) has passed."
        )
        text = "".join(f"; {line}\n" for line in f"{GENERATED}\n{comment}".splitlines())
        text += "\n".join(lines) + "\n"
        files.append(Rendered(services.head_dir(TARGET, model) / f"{label}.conf", text))
    return files
