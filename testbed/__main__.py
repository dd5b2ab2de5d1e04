"""Run the testbed by hand: `up` (nodes until Ctrl-C), `tiny-model DIR` and
`install-guide` (docs/install.md walked on a fresh three-user cluster)."""

from __future__ import annotations

import argparse
import shlex
import signal
import sys
import time
import uuid
from pathlib import Path
from types import FrameType

from testbed.cluster import TestbedError, start_cluster


def _up(args: argparse.Namespace) -> int:
    workdir = args.workdir or Path("/var/tmp") / f"mlx-medic-testbed-{uuid.uuid4().hex[:10]}"

    def _stop(signum: int, frame: FrameType | None) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, _stop)
    try:
        cluster = start_cluster(args.nodes, workdir, first_address=args.first_address)
    except (TestbedError, ValueError) as exc:
        print(f"testbed: {exc}", file=sys.stderr)
        return 1
    with cluster:
        config = shlex.quote(str(cluster.ssh_config))
        print(f"workdir     {cluster.workdir}")
        print(f"ssh config  {cluster.ssh_config}")
        print(f"PATH        export PATH={shlex.quote(str(cluster.bin_dir))}:$PATH  # ssh wrapper")
        for node in cluster.nodes:
            print(
                f"{node.name}  ssh -F {config} {node.name}   (= {node.address}:{node.ssh_port};"
                f" /tmp is {node.tmp}; shell without ssh:"
                f" {shlex.join(node.nsenter_argv('bash', cwd='/'))})"
            )
        print("Ctrl-C tears everything down.", flush=True)
        try:
            while all(node.is_up() for node in cluster.nodes):
                time.sleep(1.0)
            print("testbed: a node ended; tearing down", file=sys.stderr)
            return 1
        except KeyboardInterrupt:
            print("\ntearing down")
    return 0


def _tiny_model(args: argparse.Namespace) -> int:
    from testbed.tiny_model import make_tiny_model

    print(make_tiny_model(args.dir, seed=args.seed))
    return 0


def _install_guide(args: argparse.Namespace) -> int:
    from testbed.install_guide import run

    return run(args.workdir)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m testbed", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)
    up = commands.add_parser("up", help="start simulated nodes and wait for Ctrl-C")
    up.add_argument("--nodes", type=int, default=3)
    up.add_argument("--workdir", type=Path, help="default: /var/tmp/mlx-medic-testbed-<token>")
    up.add_argument("--first-address", type=int, default=2, help="first N of 127.0.0.N")
    up.set_defaults(run=_up)
    tiny = commands.add_parser("tiny-model", help="write the tiny qwen2 model into DIR")
    tiny.add_argument("dir", type=Path)
    tiny.add_argument("--seed", type=int, default=0)
    tiny.set_defaults(run=_tiny_model)
    guide = commands.add_parser(
        "install-guide",
        help="walk docs/install.md on a fresh three-user cluster, each command's outcome printed",
    )
    guide.add_argument("--workdir", type=Path, help="kept; default: a /var/tmp dir, removed")
    guide.set_defaults(run=_install_guide)
    args = parser.parse_args(argv)
    return int(args.run(args))


if __name__ == "__main__":
    sys.exit(main())
