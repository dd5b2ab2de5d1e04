"""`mlx-medic remediator` with the test playbooks beside the built-in ones.

The service takes its playbooks as instances; this is the same entry point
(`python -m mlx_medic.cli remediator ARGS`) with `slow_playbooks()` added, so the real
process can hold a model long enough to be killed mid-run.
Run as `python -m tests.remediator.service_with_test_playbooks ARGS`.
"""

from __future__ import annotations

import sys

from mlx_medic.cli import parse_args, run_command
from mlx_medic.remediator import service
from mlx_medic.remediator.playbooks import builtin_playbooks
from tests.remediator.slow_playbook import slow_playbooks


def main(argv: list[str]) -> int:
    args = parse_args(["remediator", *argv])
    playbooks = {**builtin_playbooks(), **slow_playbooks()}
    return run_command(args, lambda args: service.run(args, playbooks=playbooks))


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
