"""`mlx-medic remediator` with the test playbooks beside the built-in ones.

The service takes its playbooks as instances; this is the same entry point
(`python -m mlx_medic.cli remediator ARGS`) with `slow_playbooks()` added, so the real
process can hold a model long enough to be killed mid-run.
Run as `python -m tests.remediator.service_with_test_playbooks ARGS`.
"""

from __future__ import annotations

import sys

from mlx_medic.cli import parse_args
from mlx_medic.logs import setup_logging
from mlx_medic.remediator import service
from mlx_medic.remediator.playbooks import builtin_playbooks
from tests.remediator.slow_playbook import slow_playbooks


def main(argv: list[str]) -> int:
    args = parse_args(["remediator", *argv])
    setup_logging(json_lines=True)
    return service.run(args, playbooks={**builtin_playbooks(), **slow_playbooks()})


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
